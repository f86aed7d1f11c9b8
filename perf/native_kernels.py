"""The native engine's matmul kernels against the memory roof, measured in the same run.

    python -m specedge.perf.native_kernels [GGUF|catalogue name] --threads 2 --rows 1 2 5 9 16 --rounds 5

Packs every layer matrix of the file (and the LM head), then times one pass of all of them (a forward's weight
stream without attention or norms) for each row count, interleaved with reading a buffer of the same size with the
same threads (the memory roof, with the core-to-core round trip) and with the threads issuing the kernels' integer
dot instruction alone (the compute roof). Prints ms, effective GB/s, % of the memory roof, T(n)/T(1) and % of the
compute roof, medians over rounds.
"""
from __future__ import annotations

import argparse
import ctypes
import statistics
import time

import numpy as np

from ..runtime.backends import native_lib as nl


def pack_model(path: str) -> tuple[list[nl.PackedMatrix], str]:
    from ..models.gguf_in import open_gguf
    g = open_gguf(path)
    mats = []
    for name, kind in g.tensor_types().items():
        short = name.rsplit(".", 1)[-1]
        if name.startswith("layers.") and short in ("q", "k", "v", "o", "gate", "up", "down") or name in (
                "lm_head",) or (name == "embed" and g.config.tied_embeddings):
            kind, raw = g.raw_blocks(name)
            mats.append(nl.PackedMatrix(kind, np.ascontiguousarray(raw)))
    return mats, g.config.name or g.config.arch


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?", default="smollm2-135m")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8, 9, 12, 16])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--isa", choices=nl.ISA_NAMES, default=None, help="force an instruction set (default: the best)")
    a = ap.parse_args(argv)
    from pathlib import Path

    from ..models.catalog import cached_path
    path = a.model if Path(a.model).exists() else cached_path(a.model)
    if path is None:
        raise SystemExit(f"{a.model}: neither a file nor a pulled catalogue model (specedge pull {a.model})")
    lib = nl.load()
    if a.isa:
        lib.se_set_isa(nl.ISA_NAMES.index(a.isa))
    mats, name = pack_model(path)
    total = sum(m.nbytes for m in mats)
    kmax, rmax = max(m.k for m in mats), max(a.rows)
    x = np.random.default_rng(0).standard_normal((rmax, kmax)).astype(np.float32)
    q = np.empty((rmax, kmax), np.int8)
    d = np.empty((rmax, kmax // 32), np.float32)
    s = np.empty((rmax, kmax // 32), np.int32)
    h = np.empty((rmax, kmax // 32), np.int32)
    m = np.empty((rmax, kmax // 32), np.float32)
    span = 8 if kmax % 256 == 0 and any(m.kquant for m in mats) else 1  # as the engine's
    lib.se_quantize(nl.fptr(x), rmax, kmax, span, q.ctypes.data, d.ctypes.data, s.ctypes.data, h.ctypes.data,
                    m.ctypes.data)
    out = np.empty(rmax * max(m.n for m in mats), np.float32)
    handles = (ctypes.c_void_p * len(mats))(*[m.handle for m in mats])
    roof = Roof(total, a.threads)
    pool = roof.pool
    dots = DotRoof(pool)
    dot_rates: list[float] = []
    times: dict[int, list[float]] = {n: [] for n in a.rows}
    for _ in range(a.rounds):
        roof.measure()
        rate = dots.measure()
        if rate is not None:
            dot_rates.append(rate)
        for n in a.rows:
            t0 = time.perf_counter()
            lib.se_matmul_pool(pool, handles, len(mats), q.ctypes.data, d.ctypes.data, s.ctypes.data, h.ctypes.data,
                               m.ctypes.data, nl.fptr(x), n, nl.fptr(out), 1)
            times[n].append(time.perf_counter() - t0)
    gbs, placement = roof.median(), roof.placement()
    roof.close()
    report(name, mats, a, times, gbs, placement, float(np.median(dot_rates)) if dot_rates else None)


def report(name, mats, a, times, gbs, placement, dot) -> None:
    """The table: each row count's ms, GB/s, share of the memory roof, T(n)/T(rows[0]) and share of the compute
    roof (dot: G multiply-adds/s, None where the build has no dot roof)."""
    total = sum(m.nbytes for m in mats)
    t1 = float(np.median(times[a.rows[0]]))
    print(f"{name}: {len(mats)} matrices, {total / 1e6:.1f} MB packed; {a.threads} threads, ISA "
          f"{nl.isa_name(nl.load().se_isa())}; roof (reading {total / 1e6:.0f} MB) {gbs:.1f} GB/s, median of "
          f"{a.rounds}" + (f"; {placement}" if placement else ""))
    macs = sum(m.k * m.n for m in mats)  # multiply-adds a row
    if dot:
        print(f"compute roof (the kernels' integer dot instruction, {a.threads} threads) {dot:.0f} G multiply-adds/s, "
              f"median of {a.rounds}; a pass of n rows does n x {macs / 1e6:.0f} M")
    print("rows | ms | GB/s | % of roof | T(n)/T(rows[0]) | % of compute roof")
    for n in a.rows:
        t = float(np.median(times[n]))
        share = f"{100 * n * macs / t / 1e9 / dot:5.1f}%" if dot else "-"
        print(f"{n:4d} | {t * 1e3:6.2f} | {total / t / 1e9:5.1f} | {100 * total / t / 1e9 / gbs:5.1f}% | {t / t1:.2f} "
              f"| {share}")


class Roof:
    """The memory roof: `threads` threads of the native engine's pool reading `nbytes` of a buffer on huge pages
    (as the packed weights are: on 4 KB pages the read ran slower than the engine's own weight stream, gemma3-270m
    at "122% of the roof"), the best of `reads` reads per measurement (one read alone swung 7-36 GB/s on these VMs).
    The first read, untimed, faults the pages in. Each measurement also reads the core-to-core round trip
    (round_trip_ns): on these VMs the high roof comes with cores 5x farther apart (docs/native.md). `close` stops the
    pool's threads."""

    def __init__(self, nbytes: int, threads: int, reads: int = 3) -> None:
        why = nl.available()
        if why is not None:
            raise SystemExit(f"the roof is read with the native engine's threads, which is not built here: {why}")
        from ..runtime.backends.native import huge_zeros
        self.lib, self.nbytes, self.reads = nl.load(), int(nbytes), reads
        self.pool = self.lib.se_pool_new(threads)
        self.buf = huge_zeros(self.nbytes)
        self.buf[:] = 1
        self.lib.se_read_roof(self.pool, self.buf.ctypes.data, self.nbytes)
        self.gb_s: list[float] = []
        self.round_trip_ns: list[float] = []  # with each roof: how far apart the cores are (round_trip.c)

    def measure(self) -> float:
        best = float("inf")
        for _ in range(self.reads):
            t0 = time.perf_counter()
            self.lib.se_read_roof(self.pool, self.buf.ctypes.data, self.nbytes)
            best = min(best, time.perf_counter() - t0)
        self.gb_s.append(self.nbytes / best / 1e9)
        trip = nl.core_round_trip_ns()  # None in a build that predates it (native_ab's OLD.so)
        if trip is not None:
            self.round_trip_ns.append(trip)
        return self.gb_s[-1]

    def placement(self) -> str:
        """The median core-to-core round trip read with the roofs, for a report line ('' without one)."""
        if not self.round_trip_ns:
            return ""
        return f"core-to-core round trip {statistics.median(self.round_trip_ns):.0f} ns"

    def median(self) -> float:
        return float(statistics.median(self.gb_s))

    def close(self) -> None:
        if self.pool:
            self.lib.se_pool_free(self.pool)
            self.pool = None


class DotRoof:
    """The compute roof: the 8-bit multiply-adds a second that the pool's threads issue with the kernels' integer dot
    instruction, 8 independent chains and nothing else (csrc/native/dot_roof.c), the best of `reads`. A pass of many
    rows is bound by these vector pipes, which each block's float steps share; the memory roof bounds one row."""

    def __init__(self, pool, items: int = 64, reads: int = 3) -> None:
        self.fn = nl.optional_fn("se_dot_roof", ctypes.c_uint64,
                                 [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)])
        self.pool, self.items, self.reads = pool, items, reads
        self.check = ctypes.c_uint64(0)

    def measure(self) -> float | None:
        """G multiply-adds a second, or None where the library has no dot roof."""
        if self.fn is None:
            return None
        best = 0.0
        for _ in range(self.reads):
            t0 = time.perf_counter()
            macs = self.fn(self.pool, self.items, ctypes.byref(self.check))
            best = max(best, macs / (time.perf_counter() - t0) / 1e9)
        return best


if __name__ == "__main__":
    main()
