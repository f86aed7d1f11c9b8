"""Two builds of the native engine, A/B in one process: whole forwards at fixed widths, alternating blocks of calls.

    python -m specedge.perf.native_ab MODEL OLD.so NEW.so --widths 1 5 9 --rounds 16 [--isa avx2]

Each build (a `_native*.so`: `python setup.py build_ext --inplace` copies one into the checkout; keep the old one)
loads the model once; every round times a block of forwards of each width on one build, then the other, the order
switching each round, and reports the median of the per-round ratios new/old with their quartiles. Two processes
measured one after the other cannot resolve a few percent on a VM whose memory bandwidth drifts by 15-40% within
minutes. An A/A run (the same file twice) put the second-loaded copy up to 3% ahead: run both load orders
(`--swap`) before believing a few percent.
"""
from __future__ import annotations

import argparse
import os
import time

import numpy as np

from ..assembly.timing import time_forward
from ..runtime.backends import native_lib as nl
from ..runtime.backends.base import feed


def load_build(model: str, lib: str, ctx: int, widths: list[int], isa: str | None):
    """The model on build `lib`, its cache holding `ctx` random tokens."""
    from ..assembly.load import load_model
    os.environ["SPECEDGE_NATIVE_LIB"] = lib
    nl.load.cache_clear()
    backend = load_model(model, "native", ctx=ctx + max(widths) + 8, threads=2, device="cpu").backend
    if isa:
        nl.load().se_set_isa(nl.ISA_NAMES.index(isa))
    rng = np.random.default_rng(0)
    cache = backend.new_cache(ctx + max(widths) + 1)
    feed(backend, rng.integers(0, backend.config.vocab_size, ctx).astype(np.int32), cache)
    return backend, cache, rng


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a catalogue name or a GGUF path")
    ap.add_argument("old")
    ap.add_argument("new")
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 5, 9])
    ap.add_argument("--ctx", type=int, default=256, help="cached tokens the forwards append at")
    ap.add_argument("--rounds", type=int, default=16)
    ap.add_argument("--calls", type=int, default=15, help="timed forwards per block (after 2 untimed)")
    ap.add_argument("--isa", choices=nl.ISA_NAMES, default=None, help="force an instruction set in both builds")
    ap.add_argument("--swap", action="store_true", help="load the new build first")
    a = ap.parse_args(argv)
    order = ["new", "old"] if a.swap else ["old", "new"]
    builds = {name: load_build(a.model, getattr(a, name), a.ctx, a.widths, a.isa) for name in order}
    times = {(name, w): [] for name in builds for w in a.widths}
    ratios: dict[int, list[float]] = {w: [] for w in a.widths}
    for r in range(a.rounds):
        for w in a.widths:
            med = {}
            for name in (order if r % 2 == 0 else order[::-1]):
                backend, cache, rng = builds[name]
                time.sleep(0.003)  # the other build's idle worker goes to sleep (pool.c: 0.3 ms of spinning)
                for _ in range(2):
                    time_forward(backend, cache, w, rng)
                med[name] = float(np.median([time_forward(backend, cache, w, rng) for _ in range(a.calls)]))
                times[name, w].append(med[name])
            ratios[w].append(med["new"] / med["old"])
    print(f"{a.model}: {a.old} (old) against {a.new} (new), loaded {order[0]} first; {a.rounds} rounds of "
          f"{a.calls} calls, ctx {a.ctx}, ISA {nl.isa_name(nl.load().se_isa())}")
    print("width | old ms | new ms | new/old (median of rounds) | q25 | q75")
    for w in a.widths:
        q = np.quantile(ratios[w], [0.25, 0.5, 0.75])
        print(f"{w:5d} | {1e3 * np.median(times['old', w]):6.3f} | {1e3 * np.median(times['new', w]):6.3f} | "
              f"{q[1]:.3f} | {q[0]:.3f} | {q[2]:.3f}")
    w0 = a.widths[0]
    for name in ("old", "new"):
        curve = " ".join(f"T({w})/T({w0}) {np.median(times[name, w]) / np.median(times[name, w0]):.2f}"
                         for w in a.widths[1:])
        print(f"{name}: {curve}")


if __name__ == "__main__":
    main()
