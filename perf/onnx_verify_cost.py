"""Verify-cost curve and plain-decode speed of one exported ONNX artifact (same process, fixed threads).

    python -m specedge.perf.onnx_verify_cost DIR [DIR ...] --threads 2 --ctx 128 --reps 20

For each artifact: T(n) = the minimum (--stat min, robust on a shared machine) or median wall time of one forward of n tokens appended at a fixed cache length (rolled
back after each call, as a rejected draft is), n = 1, 2, 4, 8; T(n)/T(1); plain greedy decode tokens/s over
--decode tokens. Also parity against the NumPy reference when --gguf is given (max |dlogit|, top-1 agreement).
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from ..runtime.backends.onnxrt import OnnxBackend
from ..runtime.decode import decode
from ..runtime.types import SamplingParams


def forward_ms(backend: OnnxBackend, cache, n: int, reps: int, rng: np.random.Generator, stat=statistics.median
               ) -> float:
    base = cache.length
    times = []
    for _ in range(reps):
        toks = rng.integers(0, backend.config.vocab_size, n).astype(np.int32)
        t0 = time.perf_counter()
        backend.forward(toks, cache)
        times.append(time.perf_counter() - t0)
        cache.rollback(base)
    return 1e3 * stat(times)


def measure(path: str, *, threads: int, ctx: int, reps: int, widths: tuple[int, ...], n_decode: int,
            stat=statistics.median) -> dict:
    backend = OnnxBackend(path, threads=threads, verify=False)
    rng = np.random.default_rng(0)
    cache = backend.new_cache(ctx + max(widths) + 1)
    backend.forward(rng.integers(0, backend.config.vocab_size, ctx).astype(np.int32), cache)
    forward_ms(backend, cache, 1, 3, rng)  # warm-up
    t = {n: forward_ms(backend, cache, n, reps, rng, stat) for n in widths}
    prompt = rng.integers(0, backend.config.vocab_size, 32).astype(np.int32)
    t0 = time.perf_counter()
    n_out = sum(1 for _ in decode(backend, prompt, SamplingParams(), max_tokens=n_decode))
    tok_s = n_out / (time.perf_counter() - t0)
    return {"path": path, "format": backend.manifest.weight_format, "ms": t, "tok_s": tok_s,
            "weight_mb": backend.weight_bytes() / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("dirs", nargs="+")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=128)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--decode", type=int, default=32)
    ap.add_argument("--stat", choices=["min", "median"], default="median")
    args = ap.parse_args()
    widths = (1, 2, 4, 8)
    stat = min if args.stat == "min" else statistics.median
    print(f"threads={args.threads} ctx={args.ctx} reps={args.reps} stat={args.stat}")
    print("| format | weights MB | plain decode tok/s | " + " | ".join(f"T({n}) ms" for n in widths)
          + " | " + " | ".join(f"T({n})/T(1)" for n in widths[1:]) + " |")
    for d in args.dirs:
        r = measure(d, threads=args.threads, ctx=args.ctx, reps=args.reps, widths=widths, n_decode=args.decode,
                    stat=stat)
        ms = r["ms"]
        print(f"| {r['format']} | {r['weight_mb']:.0f} | {r['tok_s']:.1f} | "
              + " | ".join(f"{ms[n]:.2f}" for n in widths) + " | "
              + " | ".join(f"{ms[n] / ms[1]:.2f}" for n in widths[1:]) + " |", flush=True)


if __name__ == "__main__":
    main()
