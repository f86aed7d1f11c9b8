"""VocabTrim sweep (docs/algorithms.md 2.2): drafter cost per token and acceptance against the kept vocabulary size N.

    python -m specedge.perf.vocab_trim --target smollm2-135m-onnx-int4 --drafter smollm2-135m-onnx-int4 \
        --drafter-gguf smollm2-135m --calib-target smollm2-135m --sizes 4096 8192 16384 --out /tmp/vt

The drafter artifact is linked (not copied) into `--out/<drafter>-vocab<N>` and gets a VocabTrim head there
(export/vocab_trim.write_drafter_vocab, from the drafter's GGUF: the same transcoded weights as the artifact), so the
cached artifacts stay untouched and nothing is re-exported. Calibration: the target GGUF's greedy completions of the
first --calib-limit dev-set prompts (llama.cpp); evaluation: the next --prompts dev-set prompts (disjoint), chat
formatted. Per N (and the full head): one-token drafter forward CPU ms (forward_ms: min, interleaved; use --threads
1), and speculative decoding with the ONNX target: acceptance rate, tau, draft wall ms per drafted token (forward +
logits_to_probs), tok/s (wall: noisy on a shared machine).
"""
from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import numpy as np

from ..assembly.load import load_onnx
from ..models.gguf_in import open_gguf
from ..export.onnx_export import GGUFSource
from ..export.onnx_linear import ExportOptions, WeightFormat
from ..assembly.calibrate import calibrate_model
from ..export.vocab_trim import top_ids, write_drafter_vocab
from ..models.catalog import resolve_model
from ..models.manifest import MANIFEST, read_manifest
from ..runtime.backends import open_onnx
from ..runtime.decode import decode
from ..runtime.request import Request, Speculation
from ..runtime.drafters.model import ModelDrafter
from ..runtime.stats import DecodeStats
from ..runtime.types import SamplingParams
from ..runtime.vocab_trim import drafter_manifest, read_drafter_vocab
from ..assembly.devset import load_prompts


def link_artifact(src: Path, dst: Path) -> Path:
    """dst: symlinks to src's files and a private copy of its manifest (write_drafter_vocab edits it)."""
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        if f.name != MANIFEST and not (dst / f.name).exists():
            (dst / f.name).symlink_to(f.resolve())
    shutil.copyfile(src / MANIFEST, dst / MANIFEST)
    return dst


def forward_ms(backends: list, reps: int, rounds: int = 5, ctx: int = 256) -> list[float]:
    """Per backend: min ms of a one-token forward at cache length 64 (rolled back each time), as the calling
    thread's CPU time (with --threads 1 onnxruntime computes on it, so other processes' load does not count);
    backends measured in interleaved rounds so drift hits them alike."""
    caches = [b.new_cache(ctx) for b in backends]
    for b, c in zip(backends, caches):
        b.forward(np.arange(64, dtype=np.int32) + 100, c)
    best = [float("inf")] * len(backends)
    for _ in range(rounds):
        for j, (b, c) in enumerate(zip(backends, caches)):
            for i in range(reps):
                t0 = time.thread_time()
                b.forward(np.array([200 + i], np.int32), c)
                best[j] = min(best[j], time.thread_time() - t0)
                c.rollback(64)
    return [1e3 * x for x in best]


def run(target, tokenizer, drafter, prompts, params, k, max_tokens) -> dict:
    stats = DecodeStats()
    t0 = time.perf_counter()
    for i, text in enumerate(prompts):
        ids = tokenizer.chat_ids(text)
        for _ in decode(target, ids, Speculation(drafter, k=k),
                        Request(params, max_tokens=max_tokens, eos_ids=tokenizer.eos_ids, seed=i), stats=stats):
            pass
    wall = time.perf_counter() - t0
    d = max(stats.n_drafted, 1)
    return {"acceptance": stats.n_accepted / d, "tau": stats.n_emitted / max(stats.n_target_forwards, 1),
            "draft_ms_per_token": 1e3 * stats.draft_s / d, "tok_s": stats.n_generated / wall,
            "generated": stats.n_generated}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--target", required=True, help="target ONNX artifact (name in the cache or directory)")
    ap.add_argument("--drafter", required=True, help="drafter ONNX artifact (untrimmed)")
    ap.add_argument("--drafter-gguf", required=True, help="the GGUF the drafter artifact was exported from")
    ap.add_argument("--calib-target", required=True, help="target GGUF for calibration (llama.cpp)")
    ap.add_argument("--sizes", type=int, nargs="+", required=True)
    ap.add_argument("--calib-limit", type=int, default=10)
    ap.add_argument("--calib-tokens", type=int, default=64)
    ap.add_argument("--prompts", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--temperatures", type=float, nargs="+", default=[0.0])
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    counts, calib = calibrate_model(a.calib_target, limit=a.calib_limit, max_tokens=a.calib_tokens,
                                    threads=a.threads)
    print(f"calibration: {calib} in {time.perf_counter() - t0:.1f}s", flush=True)
    target = load_onnx(a.target, device="cpu", threads=a.threads)
    full = load_onnx(a.drafter, device="cpu", threads=a.threads)
    gguf = open_gguf(resolve_model(a.drafter_gguf))
    src, cfg = GGUFSource(gguf), gguf.config
    spec = gguf.tokenizer_spec()
    keep = [*spec.eos_ids, *([] if spec.bos_id is None else [spec.bos_id])]
    opts = ExportOptions(WeightFormat(full.backend.manifest.weight_format))
    evals = [p.text for p in load_prompts(limit=a.calib_limit + a.prompts)[a.calib_limit:]]
    rows = []
    drafters = [("full", full.backend, None)]
    for n in a.sizes:
        d = link_artifact(full.path, a.out / f"{full.path.name}-vocab{n}")
        ids = top_ids(counts, n, keep)
        t1 = time.perf_counter()
        write_drafter_vocab(d, src, cfg, opts, ids, calib)
        m = read_manifest(d, verify=False)
        vocab = read_drafter_vocab(m)
        print(f"N={n}: heads written in {time.perf_counter() - t1:.1f}s; calibration coverage "
              f"{counts[ids].sum() / counts.sum():.2%}", flush=True)
        drafters.append((str(n), open_onnx(drafter_manifest(m, vocab), device="cpu", threads=a.threads), vocab.ids))
    plain = {t: run(target.backend, target.tokenizer, None, evals, SamplingParams(temperature=t), 0, a.tokens)
             for t in a.temperatures}
    print(f"plain target: {json.dumps(plain)}", flush=True)
    costs = forward_ms([b for _, b, _ in drafters], a.reps)
    for (name, backend, ids), cost in zip(drafters, costs):
        row = {"N": name, "drafter_bytes_per_token": backend.weight_bytes(), "forward_cpu_ms": round(cost, 3)}
        for t in a.temperatures:
            drafter = ModelDrafter(backend, vocab_ids=ids)
            r = run(target.backend, target.tokenizer, drafter, evals, SamplingParams(temperature=t), a.k, a.tokens)
            row[f"T={t}"] = {key: round(v, 3) for key, v in r.items()}
        rows.append(row)
        print(json.dumps(row), flush=True)
    (a.out / "vocab_trim.json").write_text(json.dumps({"args": vars(a) | {"out": str(a.out)}, "plain": plain,
                                                        "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
