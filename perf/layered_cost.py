"""Cost of the layered ONNX profile against the monolithic graph (docs/onnx.md, "Layer plans").

    python -m specedge.perf.layered_cost MONO_DIR LAYERED_DIR [--threads 2] [--reps 30]
    python -m specedge.perf.layered_cost MONO_DIR LAYERED_DIR --rss {mono,layered,layered-draft,both}

Timing mode: both artifacts in one process, runs alternating (mono, layered, mono, ...) so load drift hits both;
median ms of T=1 and T=5 forwards after a 64-token prefill (each followed by a rollback), and of the first l
layers + head (early exit) for l in --exits. RSS mode: one artifact set per process (run each in a fresh process),
resident memory after loading and one forward, and after 20 drafting rounds with plans where asked.
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from ..runtime.backends import LayerPlan, open_onnx


def rss_mib() -> float:
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024


CLOCK = time.perf_counter  # --cpu: time.process_time (with --threads 1, the work alone, robust to machine load)


def median_ms(fn, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = CLOCK()
        fn()
        times.append(CLOCK() - t0)
    return float(np.median(times) * 1e3)


def step(backend, cache, tokens, plan=None):
    """One forward at the current length, then roll back: a decode or verify step repeated at the same position."""
    n = cache.length
    backend.forward(tokens, cache, plan=plan)
    cache.rollback(n)


def timings(mono_dir: str, layered_dir: str, threads: int, reps: int, exits: tuple[int, ...], spin: bool) -> dict:
    from ..runtime.backends.onnx_layered import OnnxLayeredBackend
    mono = open_onnx(mono_dir, threads=threads, verify=False)
    lay = OnnxLayeredBackend(layered_dir, threads=threads, verify=False, spinning=spin)
    prompt = np.arange(100, 164, dtype=np.int32)
    caches = {b.name: b.new_cache(256) for b in (mono, lay)}
    for b in (mono, lay):
        b.forward(prompt, caches[b.name])
    out: dict[str, float] = {}
    for t in (1, 5):
        toks = np.arange(7, 7 + t, dtype=np.int32)
        for b in (mono, lay):
            step(b, caches[b.name], toks)  # warm-up
        rounds = {b.name: [] for b in (mono, lay)}
        for _ in range(5):  # alternate in blocks so both see the same machine load
            for b in (mono, lay):
                rounds[b.name].append(median_ms(lambda: step(b, caches[b.name], toks), reps // 5 or 1))
        for name, v in rounds.items():
            out[f"{name} T={t} ms"] = round(float(np.median(v)), 3)
    toks = np.array([7], dtype=np.int32)
    for n in exits:
        out[f"onnx-layered exit {n} + head T=1 ms"] = round(median_ms(
            lambda: step(lay, caches[lay.name], toks, LayerPlan(exit_layer=n)), reps), 3)
    return out


def rss(mode: str, mono_dir: str, layered_dir: str, threads: int) -> dict:
    base = rss_mib()
    out = {"python+imports MiB": round(base, 1)}
    backends = {"mono": [mono_dir], "layered": [layered_dir], "layered-draft": [layered_dir],
                "both": [mono_dir, layered_dir]}[mode]
    opened = [open_onnx(d, threads=threads, verify=False) for d in backends]
    prompt = np.arange(100, 164, dtype=np.int32)
    caches = [b.new_cache(256) for b in opened]
    for b, c in zip(opened, caches):
        b.forward(prompt, c)
    out["after load + prefill MiB"] = round(rss_mib(), 1)
    if mode in ("layered-draft", "both"):
        lay, cache = opened[-1], caches[-1]
        for r in range(20):  # early-exit and layer-skip drafts of 4 tokens on the target's cache, then verify
            n = cache.length
            plan = LayerPlan(exit_layer=10) if r % 2 else LayerPlan(layers=tuple(range(0, 30, 2)) + (29,))
            for j in range(4):
                lay.forward(np.array([7 + j], dtype=np.int32), cache, plan=plan)
            cache.rollback(n)
            lay.forward(np.arange(7, 12, dtype=np.int32), cache)
            cache.rollback(n + 1)
        out["after 20 drafting rounds MiB"] = round(rss_mib(), 1)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mono")
    ap.add_argument("layered")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--exits", default="6,10,15,20")
    ap.add_argument("--cpu", action="store_true", help="process CPU time instead of wall time (use with --threads 1)")
    ap.add_argument("--spin", action="store_true", help="let the layered sessions' idle threads spin")
    ap.add_argument("--rss", choices=["mono", "layered", "layered-draft", "both"], default=None)
    a = ap.parse_args()
    if a.cpu:
        global CLOCK
        CLOCK = time.process_time
    if a.rss:
        print(json.dumps(rss(a.rss, a.mono, a.layered, a.threads)))
    else:
        print(json.dumps(timings(a.mono, a.layered, a.threads, a.reps, tuple(int(x) for x in a.exits.split(",")),
                                 a.spin),
                         indent=1))


if __name__ == "__main__":
    main()
