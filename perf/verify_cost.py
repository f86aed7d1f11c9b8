"""The verify-cost curve T(n)/T(1) and plain-decode speed of several targets, measured in one process.

    python -m specedge.perf.verify_cost --targets llamacpp:smollm2-135m onnx:smollm2-135m-onnx-int4 \
        --threads 2 --ctx 128 --reps 15 --widths 1 2 3 4 5 6 8 12 16

T(n) = wall time of one forward of n tokens appended at a fixed cache length (rolled back after each call, as a
rejected draft is); the statistic over --rounds x --reps is the minimum (robust on a shared machine) or the
median. Targets are measured in interleaved rounds so drift hits them alike, each alone within its turn (engines'
thread pools spin after work). Also: plain greedy decoding tokens/s (best of --rounds
runs of --decode tokens), the weight bytes one token reads, and the bandwidth that implies at T(1).
`--tree F` times tree verification instead: the n tokens form a heap-shaped tree (node i's parent (i - 1) // F, BFS
order) passed as tree_mask (backends with caps.tree_mask only).
`--clock thread` times T(n) as the calling thread's CPU time instead of wall time: with --threads 1 the backends
compute on that thread, so the numbers do not grow when other processes load the machine (tok/s stays wall time).
`--roof` also measures the memory roof in every round, just before the targets' turns (perf/native_kernels.py's
Roof: the best of 3 reads of a buffer on huge pages as large as the largest target's weights), and prints each
target's T(1) bandwidth as a percentage of the median roof (issue 41's "at >= 80% of the roof measured in the same
run").
`--isa avx2` runs the native engine's kernels as on a CPU without AVX-512 (any ISA this CPU has; the engine's
default is its best), so the AVX2 path can be compared with ik_llama.cpp's AVX2 wheel on one machine.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

from ..assembly.load import load_model
from ..assembly.timing import heap_tree_mask, time_forward  # noqa: F401  (heap_tree_mask: tests)
from ..runtime.backends.base import feed
from ..runtime.decode import decode
from ..runtime.request import PLAIN, Request
from ..runtime.stats import DecodeStats
from .greedy_table import parse_target


def plain_tok_s(backend, n_decode: int, rng: np.random.Generator) -> float:
    """Decode-phase tokens/s (prefill excluded) of plain greedy decoding after a 32-token random prompt."""
    prompt = rng.integers(0, backend.config.vocab_size, 32).astype(np.int32)
    stats = DecodeStats()
    for _ in decode(backend, prompt, PLAIN, Request(max_tokens=n_decode, eos_ids=()), stats=stats):
        pass
    return stats.tokens_per_s


def force_isa(name: str) -> None:
    """The native engine's kernels on ISA `name` for this process; one this CPU does not run is refused."""
    from ..runtime.backends import native_lib as nl
    lib = nl.load()
    if lib.se_set_isa(nl.ISA_NAMES.index(name)) != nl.ISA_NAMES.index(name):
        runs = ", ".join(nl.isa_name(i) for i in nl.cpu_isas(lib))
        raise SystemExit(f"--isa {name}: this CPU does not run it; it runs {runs}")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--targets", nargs="+", default=["llamacpp", "numpy"], help="backend[:model] each")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=128, help="cache length the verify calls append at")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--widths", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 12, 16])
    ap.add_argument("--decode", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--stat", choices=["min", "median"], default="min")
    ap.add_argument("--clock", choices=["wall", "thread"], default="wall",
                    help="T(n) as wall time, or as this thread's CPU time (meaningful with --threads 1)")
    ap.add_argument("--tree", type=int, default=None, metavar="F",
                    help="time tree verification: n nodes in a heap-shaped tree of fan-out F (default: chains)")
    ap.add_argument("--roof", action="store_true", help="measure the memory roof in the same rounds (native engine)")
    ap.add_argument("--isa", choices=("portable", "avx2", "avx512", "neon"), default=None,
                    help="the native engine's instruction set (default: the best this CPU runs)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.isa:
        force_isa(a.isa)
    stat = min if a.stat == "min" else statistics.median
    runs = []
    for t in a.targets:
        kind, model = parse_target(t, a.model)
        m = load_model(model, kind, ctx=a.ctx + max(a.widths) + 64, threads=a.threads, device="cpu")
        runs.append((t, m.backend, {n: [] for n in a.widths}, []))
    roof = None
    if a.roof:
        from .native_kernels import Roof
        roof = Roof(max(r[1].weight_bytes() for r in runs), a.threads)
    by_round = measure(runs, a, stat, roof)
    rows = []
    for t, backend, times, speeds in runs:
        ms = {n: 1e3 * stat(v) for n, v in times.items()}
        wb = backend.weight_bytes()
        rows.append(dict(target=t, weight_mb=wb / 1e6, tok_s=max(speeds), ms=ms,
                         ratio={n: ms[n] / ms[1] for n in a.widths}, gb_s_at_t1=wb / (ms[1] * 1e-3) / 1e9))
        if roof is not None:
            rows[-1]["roof_pct_at_t1"] = 100 * rows[-1]["gb_s_at_t1"] / roof.median()
    if roof is not None:
        roof.close()
    report(rows, a, roof)
    if a.out:
        with open(a.out, "w") as f:
            json.dump({"args": vars(a), "time": time.strftime("%Y-%m-%d %H:%M:%S"), "rows": rows,
                       "roof_gb_s": None if roof is None else roof.gb_s, "by_round": by_round}, f, indent=2)


def measure(runs, a, stat, roof) -> list[dict]:
    """Every round: the roof (when asked), then each target alone (after a warm-up), because engines' thread pools
    spin after work and would steal the 2 cores from each other call by call. Fills each run's times and speeds;
    returns the per-round record the json keeps (this VM's bandwidth moved between about 35 and 60 GB/s)."""
    clock = time.perf_counter if a.clock == "wall" else time.thread_time
    rng = np.random.default_rng(0)
    by_round = []
    for _ in range(a.rounds):
        this = {"roof_gb_s": roof.measure() if roof is not None else None,
                "round_trip_ns": roof.round_trip_ns[-1] if roof is not None and roof.round_trip_ns else None}
        by_round.append(this)
        for t, backend, times, speeds in runs:
            cache = backend.new_cache(a.ctx + max(a.widths) + 1)  # llama.cpp holds one live sequence: a new one
            feed(backend, rng.integers(0, backend.config.vocab_size, a.ctx).astype(np.int32), cache)
            for _ in range(3):
                time_forward(backend, cache, 1, rng)
            for _ in range(a.reps):
                for n in a.widths:
                    times[n].append(time_forward(backend, cache, n, rng, clock, a.tree))
            speeds.append(plain_tok_s(backend, a.decode, rng))
            this[t] = dict(tok_s=speeds[-1], ms={n: 1e3 * stat(v[-a.reps:]) for n, v in times.items()})
    return by_round


def report(rows: list[dict], a, roof) -> None:
    """The table; with a roof, its median and each row's roof_pct_at_t1 (T(1) bandwidth over that median)."""
    roof_gb_s = roof.median() if roof is not None else None
    print(f"threads={a.threads} ctx={a.ctx} reps={a.reps} stat={a.stat} clock={a.clock}"
          + ("" if a.tree is None else f" tree fan-out={a.tree}") + ("" if a.isa is None else f" native isa={a.isa}")
          + ("" if roof is None else f" roof {roof_gb_s:.1f} GB/s (median of {a.rounds}: "
             + ", ".join(f"{g:.1f}" for g in roof.gb_s) + f"; reading {roof.nbytes / 1e6:.0f} MB)"
             + (f"; {roof.placement()}" if roof.placement() else "")))
    print("| target | weight MB read/token | plain tok/s | T(1) ms | implied GB/s | "
          + ("% of roof | " if roof is not None else "")
          + " | ".join(f"T({n})/T(1)" for n in a.widths[1:]) + " |")
    print("|---|---|---|---|---|" + ("---|" if roof is not None else "") + "---|" * (len(a.widths) - 1))
    for r in rows:
        print(f"| {r['target']} | {r['weight_mb']:.0f} | {r['tok_s']:.1f} | {r['ms'][a.widths[0]]:.2f} | "
              f"{r['gb_s_at_t1']:.1f} | " + (f"{r['roof_pct_at_t1']:.0f}% | " if roof is not None else "")
              + " | ".join(f"{r['ratio'][n]:.2f}" for n in a.widths[1:]) + " |")


if __name__ == "__main__":
    main()
