"""Held-out perplexity of the full model vs LoRA-Drop lossy (docs/algorithms.md 2.5) over ranks and cycle lengths.

    python -m specedge.perf.loradrop_ppl --model smollm2-135m --fit 16 --eval 3 --max-eval-tokens 240

Corrections are fitted on the dev prompts [0, fit) (chat-formatted prompt text), scored teacher-forced on the prompts
[fit, fit + eval): each held-out sequence's first `--prefix` tokens are read by the full model, then every further
token is one step of the cycle (refresh when step % cycle == 0, drop steps between), on the NumPy backend, or with
`--backend onnx --model <layered artifact>` on ONNX Runtime (fit and scoring through the layered graphs).
Rank 0 = pure reuse (A = B = 0); rank r uses the first r directions of one rank-max fit per cycle.
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from ..assembly.load import load_model
from ..assembly.loradrop import calibration_tokens
from ..runtime.backends import BackendKind
from ..runtime.loradrop import LoRADropFit, Schedule, droppable_layers, fit, pure_reuse


def nll(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    """[T, V], [T] -> [T] negative log-likelihoods (float64)."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return lse - x[np.arange(len(targets)), targets]


def score_full(backend, seqs, prefix: int) -> float:
    out = []
    for s in seqs:
        logits = backend.forward(s[:-1], backend.new_cache(len(s)))
        out.append(nll(logits[prefix - 1:], s[prefix:]))
    return float(np.exp(np.concatenate(out).mean()))


def score_schedule(backend, corr, seqs, prefix: int) -> float:
    """Teacher-forced perplexity with the cycle applied to every token after the prefix."""
    out = []
    for s in seqs:
        cache = backend.new_cache(len(s))
        if prefix > 1:
            backend.forward(s[:prefix - 1], cache)
        sched = Schedule(backend, corr)
        for i, pos in enumerate(range(prefix - 1, len(s) - 1)):
            out.append(nll(sched.step(s[pos:pos + 1], cache, i), s[pos + 1:pos + 2]))
    return float(np.exp(np.concatenate(out).mean()))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--backend", choices=("numpy", "onnx"), default="numpy",
                    help="onnx: a layered artifact (export --profile layered), format 6")
    ap.add_argument("--fit", type=int, default=16, help="dev prompts used for fitting: [0, fit)")
    ap.add_argument("--eval", type=int, default=3, help="held-out dev prompts: [fit, fit + eval)")
    ap.add_argument("--prefix", type=int, default=8, help="tokens of each held-out sequence read by the full model")
    ap.add_argument("--max-eval-tokens", type=int, default=240, help="cap on scored tokens (split over sequences)")
    ap.add_argument("--ranks", default="0,4,8,16,32")
    ap.add_argument("--cycles", default="2,4,8")
    ap.add_argument("--ridge", type=float, default=0.1)
    a = ap.parse_args(argv)
    loaded = load_model(a.model, BackendKind(a.backend))
    backend, cfg = loaded.backend, loaded.backend.config
    fit_seqs, prov = calibration_tokens(loaded, a.fit)
    eval_seqs, _ = calibration_tokens(loaded, a.eval, offset=a.fit)
    per = a.max_eval_tokens // len(eval_seqs)
    eval_seqs = [s[:a.prefix + per] for s in eval_seqs]
    n_scored = sum(len(s) - a.prefix for s in eval_seqs)
    ranks, cycles = [int(r) for r in a.ranks.split(",")], [int(c) for c in a.cycles.split(",")]
    print(f"# {loaded.path.name}: fit on {prov['n_tokens'] if 'n_tokens' in prov else sum(map(len, fit_seqs))} "
          f"tokens of dev prompts [0, {a.fit}); {n_scored} held-out tokens of prompts [{a.fit}, {a.fit + a.eval})")
    print(f"full model: ppl {score_full(backend, eval_seqs, a.prefix):.3f}", flush=True)
    print("cycle " + " ".join(f"{'r=' + str(r):>9}" for r in ranks), flush=True)
    layers = droppable_layers(cfg.n_layers)
    for c in cycles:
        t0 = time.perf_counter()
        big = fit(backend, fit_seqs, LoRADropFit(rank=max(ranks), cycle=c, ridge=a.ridge), prov)
        print(f"{c:>5}", end="", flush=True)
        for r in ranks:  # one cell at a time: a row takes minutes on a busy CPU
            corr = pure_reuse(cfg.d_model, layers, c) if r == 0 else big.truncated(r)
            print(f" {score_schedule(backend, corr, eval_seqs, a.prefix):9.3f}", end="", flush=True)
        print(f"   ({time.perf_counter() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
