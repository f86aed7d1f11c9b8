"""What the head drafter costs per drafted token (runtime/drafters/head.py), against the target's T(1) (issue 42:
at most 8% of T(1) per drafted token).

    python -m specedge.perf.head_cost [--model smollm2-135m] [--precision q8_0 fp32] [--k 4] [--reps 50]

A seeded random head of SmolLM2-135M's shapes (D 576, 9 heads, 3 KV heads, head_dim 64, FFN 1536, a draft vocabulary
of 8192, 3 taps; the cost does not depend on the weights' values) over `--context` observed positions; each round
proposes k tokens (k LM heads + k - 1 decoder steps) and ingests the verify's k + 1 tapped rows (fc + one decoder
step over them): per drafted token = (propose + ingest) / k, median over --reps rounds, for each --precision (fp32:
NumPy's BLAS; q8_0: the native engine's packed kernels on the calling thread, runtime/drafters/head.py Precision). With
--model, the target's T(1) on the native engine (one-token forwards at the same context, median) and the ratio, and
q8_0 once more with the matrices on that target's thread pool ("q8_0 on the target's pool": what a decode on the
native engine runs, HeadDrafter.check binds it). NumPy's BLAS threads follow OPENBLAS_NUM_THREADS / OMP_NUM_THREADS
(set before the run).
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ..models.config import ModelConfig
from ..runtime.drafters.head import HeadDrafter, Precision
from ..runtime.drafters.head_model import HeadModel, TargetEmbedding, random_head
from ..runtime.types import SamplingParams

SMOLLM2 = dict(d_model=576, n_heads=9, n_kv_heads=3, head_dim=64, d_ff=1536, vocab_size=49152, n_layers=30)


def smollm2_head(vocab_draft: int = 8192, precision: Precision = Precision.FP32) -> HeadDrafter:
    """A random head of SmolLM2-135M's shapes over random embedding rows."""
    cfg = ModelConfig(arch="llama", n_layers=SMOLLM2["n_layers"], d_model=SMOLLM2["d_model"],
                      n_heads=SMOLLM2["n_heads"], n_kv_heads=SMOLLM2["n_kv_heads"], head_dim=SMOLLM2["head_dim"],
                      d_ff=SMOLLM2["d_ff"], vocab_size=SMOLLM2["vocab_size"], rms_eps=1e-5, rope_theta=100000.0,
                      context_length=8192, tied_embeddings=True)
    config, arrays = random_head(cfg, (2, 15, 28), n_heads=9, n_kv_heads=3, head_dim=64, ffn=1536,
                                 vocab_draft=vocab_draft, model="smollm2-135m-shapes")
    rng = np.random.default_rng(0)
    embedding = TargetEmbedding(lambda ids: rng.standard_normal((len(ids), cfg.d_model)), cfg.vocab_size,
                                cfg.d_model, 1.0)
    return HeadDrafter(HeadModel.from_arrays(config, arrays), embedding, precision=precision)


def head_round_ms(head: HeadDrafter, context: int, k: int, reps: int) -> dict:
    """Median ms of propose(k) and of ingesting k + 1 verified rows, at `context` observed positions."""
    D = head.head.config.hidden
    rng = np.random.default_rng(1)
    tokens = rng.integers(0, head.head.config.vocab, context + 1).astype(np.int32)
    taps = {n: rng.standard_normal((context, D)).astype(np.float32) for n in head.verify_taps}
    head.observe_prompt(taps, tokens, 0)
    row_taps = {n: rng.standard_normal((k + 1, D)).astype(np.float32) for n in head.verify_taps}
    params, gen = SamplingParams(), np.random.default_rng(2)
    propose, ingest = [], []
    for _ in range(reps):
        t0 = time.perf_counter()
        draft = head.propose(tokens, k, params, gen)
        t1 = time.perf_counter()
        head.observe_verify(row_taps, draft.tokens[:1])  # one row kept: the cache grows by one position a round
        t2 = time.perf_counter()
        tokens = np.append(tokens, draft.tokens[:1])
        propose.append(t1 - t0)
        ingest.append(t2 - t1)
    p, i = float(np.median(propose) * 1e3), float(np.median(ingest) * 1e3)
    return {"k": k, "context": context, "propose_ms": round(p, 3), "ingest_ms": round(i, 3),
            "per_drafted_token_ms": round((p + i) / k, 3),
            "weight_mib_per_token": round(head.weight_bytes_per_token / 2 ** 20, 1)}


def target_t1_ms(model: str, context: int, reps: int):
    """(the native engine's median one-token forward at `context` cached positions, ms; the engine)."""
    from ..models.catalog import resolve_model
    from ..models.gguf_in import open_gguf
    from ..runtime.backends.native import NativeBackend
    backend = NativeBackend(open_gguf(resolve_model(model)))
    cache = backend.new_cache(context + 8)
    backend.forward(np.arange(100, 100 + context, dtype=np.int32), cache)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        backend.forward(np.array([7], np.int32), cache)
        times.append(time.perf_counter() - t0)
        cache.rollback(context)
    return float(np.median(times) * 1e3), backend


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", help="also time the target's T(1) on the native engine (catalogue name or GGUF)")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--context", type=int, default=256)
    ap.add_argument("--vocab-draft", type=int, default=8192)
    ap.add_argument("--precision", nargs="+", choices=[p.value for p in Precision], default=["q8_0", "fp32"])
    args = ap.parse_args(argv)
    t1, target = target_t1_ms(args.model, args.context, args.reps) if args.model else (None, None)
    runs = [(name, None) for name in args.precision]
    if target is not None and "q8_0" in args.precision:
        runs.append(("q8_0", target))
    for name, pool in runs:
        head = smollm2_head(args.vocab_draft, Precision(name))
        if pool is not None:
            head.run.use(pool)
        out = {"precision": name + (" on the target's pool" if pool is not None else ""),
               **head_round_ms(head, args.context, args.k, args.reps)}
        if t1 is not None:
            out.update(target_t1_ms=round(t1, 3), ratio=round(out["per_drafted_token_ms"] / t1, 3))
        print(json.dumps(out))


if __name__ == "__main__":
    main()
