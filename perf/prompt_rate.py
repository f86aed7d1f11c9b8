"""Prompt processing: tokens/s of prefilling an N-token prompt into an empty cache, several engines in one process.

    python -m specedge.perf.prompt_rate --targets native:smollm2-135m llamacpp:smollm2-135m ik:smollm2-135m \
        --tokens 700 --rounds 5 --threads 2

Each round prefills one fresh cache per target (targets interleaved, so drift hits them alike; one warm-up prefill
each first); the table shows the median tokens/s, the spread, and the ratio to the last target (mainline llama.cpp
in the command above). The prompt is seeded random token ids: prefill cost does not depend on which tokens they are.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ..assembly.load import load_model
from ..runtime.backends.base import feed
from .greedy_table import parse_target


def prefill_s(backend, tokens: np.ndarray) -> float:
    cache = backend.new_cache(len(tokens) + 1)
    t0 = time.perf_counter()
    feed(backend, tokens, cache)
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--targets", nargs="+", default=["native", "llamacpp"], help="backend[:model] each")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--tokens", type=int, default=700)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    tokens = None
    runs = []
    for t in a.targets:
        kind, model = parse_target(t, a.model)
        m = load_model(model, kind, ctx=a.tokens + 64, threads=a.threads, device="cpu")
        if tokens is None:
            tokens = np.random.default_rng(0).integers(0, m.backend.config.vocab_size, a.tokens).astype(np.int32)
        prefill_s(m.backend, tokens)  # warm-up: first-touch of buffers, thread pools started
        runs.append((t, m.backend, []))
    for _ in range(a.rounds):
        for _, backend, times in runs:
            times.append(prefill_s(backend, tokens))
    base = a.tokens / statistics.median(runs[-1][2])
    print(f"prompt of {a.tokens} tokens, threads={a.threads}, median of {a.rounds} rounds")
    print("| target | prompt tok/s | range | vs " + runs[-1][0] + " |")
    print("|---|---|---|---|")
    for t, _, times in runs:
        rates = sorted(a.tokens / s for s in times)
        med = a.tokens / statistics.median(times)
        print(f"| {t} | {med:.0f} | {rates[0]:.0f}-{rates[-1]:.0f} | {med / base:.2f}x |")


if __name__ == "__main__":
    main()
