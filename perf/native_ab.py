"""Two builds of the native engine, A/B in one process: whole forwards at fixed widths, alternating blocks of calls.

    python -m specedge.perf.native_ab MODEL OLD.so NEW.so --widths 1 5 9 --rounds 16 [--isa avx2]

Each build (a `_native*.so`: `python setup.py build_ext --inplace` copies one into the checkout; keep the old one)
loads the model twice, in the order old, new, new, old (`--swap`: new, old, old, new); every round times a block of
forwards of each width on each of the four, the order reversing each round, and reports the median over rounds of
new/old (each the geometric mean of its two copies) with the quartiles. Two processes measured one after the other
cannot resolve a few percent on a VM whose memory bandwidth drifts by 15-40% within minutes; and within one process
a later-loaded copy ran up to 3% faster than an earlier one of the same file (A/A, two copies loaded once each), a
bias the mirrored load order cancels. `--roof` reads the memory roof at the start of every round
(perf/native_kernels.py's Roof) and also reports the ratios of the rounds below and above `--split` GB/s: these VMs
switch between a roof of about 35 and one of about 60 GB/s, and a change can help in one and not the other. The two
roofs are two placements of the vCPUs (one die or two), and the core-to-core round trip read with each roof is the
surer sign of which (docs/native.md): the ratios are also split at `--split-ns` (near below, far at or above).
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
    ap.add_argument("--swap", action="store_true", help="load in the order new, old, old, new")
    ap.add_argument("--roof", action="store_true", help="read the memory roof every round; split the ratios by it")
    ap.add_argument("--split", type=float, default=45.0, help="GB/s: --roof's low and high rounds (default 45)")
    ap.add_argument("--split-ns", type=float, default=200.0,
                    help="ns of core-to-core round trip: --roof's near and far rounds (default 200)")
    a = ap.parse_args(argv)
    first, second = ("new", "old") if a.swap else ("old", "new")
    order = [(first, 0), (second, 0), (second, 1), (first, 1)]  # mirrored: each build's mean load position is equal
    builds = {key: load_build(a.model, getattr(a, key[0]), a.ctx, a.widths, a.isa) for key in order}
    times = {(name, w): [] for name in ("old", "new") for w in a.widths}
    ratios: dict[int, list[float]] = {w: [] for w in a.widths}
    roof, roofs = None, []
    if a.roof:
        from .native_kernels import Roof
        roof = Roof(builds[order[0]][0].weight_bytes(), 2)
    for r in range(a.rounds):
        if roof is not None:
            roofs.append(roof.measure())
        for w in a.widths:
            med = {}
            for key in (order if r % 2 == 0 else order[::-1]):
                backend, cache, rng = builds[key]
                time.sleep(0.003)  # the other copies' idle workers go to sleep (pool.c: 0.3 ms of spinning)
                for _ in range(2):
                    time_forward(backend, cache, w, rng)
                med[key] = float(np.median([time_forward(backend, cache, w, rng) for _ in range(a.calls)]))
            for name in ("old", "new"):
                times[name, w].append(float(np.sqrt(med[name, 0] * med[name, 1])))
            ratios[w].append(times["new", w][-1] / times["old", w][-1])
    print(f"{a.model}: {a.old} (old) against {a.new} (new), loaded {order[0][0]} first; {a.rounds} rounds of "
          f"{a.calls} calls, ctx {a.ctx}, ISA {nl.isa_name(nl.load().se_isa())}; each build loaded twice "
          f"({', '.join(f'{n}' for n, _ in order)})")
    print("width | old ms | new ms | new/old (median of rounds) | q25 | q75")
    for w in a.widths:
        q = np.quantile(ratios[w], [0.25, 0.5, 0.75])
        print(f"{w:5d} | {1e3 * np.median(times['old', w]):6.3f} | {1e3 * np.median(times['new', w]):6.3f} | "
              f"{q[1]:.3f} | {q[0]:.3f} | {q[2]:.3f}")
    if roof is not None:
        roof.close()
        split_by_roof(ratios, roofs, a.split, a.split_ns, roof.round_trip_ns)
    w0 = a.widths[0]
    for name in ("old", "new"):
        curve = " ".join(f"T({w})/T({w0}) {np.median(times[name, w]) / np.median(times[name, w0]):.2f}"
                         for w in a.widths[1:])
        print(f"{name}: {curve}")


def split_by_roof(ratios: dict[int, list[float]], roofs: list[float], split: float, split_ns: float,
                  trips: list[float]) -> None:
    """The median new/old per width over the rounds whose roof read below `split`, then at or above (with their
    median round trip); then, where the build read round trips, over the rounds whose cores were near (round trip
    below `split_ns`), then far."""
    with_trips = len(trips) == len(roofs)
    for label, keep in ((f"roof below {split:g} GB/s", [g < split for g in roofs]),
                        (f"roof at or above {split:g} GB/s", [g >= split for g in roofs])):
        about = f"median roof {np.median([g for g, k in zip(roofs, keep) if k]):.1f} GB/s" if any(keep) else ""
        if about and with_trips:
            about += f", round trip {np.median([t for t, k in zip(trips, keep) if k]):.0f} ns"
        print_split(ratios, label, keep, about)
    if with_trips:
        for label, keep in ((f"cores near (round trip < {split_ns:g} ns)", [t < split_ns for t in trips]),
                            (f"cores far (round trip >= {split_ns:g} ns)", [t >= split_ns for t in trips])):
            print_split(ratios, label, keep, "")


def print_split(ratios: dict[int, list[float]], label: str, keep: list[bool], about: str) -> None:
    """One group of rounds: how many, `about` them, and the median new/old per width over them."""
    if not any(keep):
        print(f"{label}: no rounds")
        return
    meds = ", ".join(f"{w}: {np.median([x for x, k in zip(v, keep) if k]):.3f}" for w, v in ratios.items())
    print(f"{label}: {sum(keep)} rounds" + (f" ({about})" if about else "") + f", new/old by width {meds}")


if __name__ == "__main__":
    main()
