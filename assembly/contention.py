"""Is something else using the CPU while we measure? A measurement taken then says nothing about the engines
(PERF_FACTS.md: llama.cpp's spinning threads collapse from ~100 to 6 tok/s when another process is busy), so the
planner and the auto-tuner watch every measurement and never cache one taken on a busy machine.

    with CpuWatch() as watch:      ...measure...
    load = watch.load              # Load(other_cores, loadavg, wall_s, cores); load.busy; load.describe()

other_cores: the cores other processes kept busy on average during the window: the machine's busy time over the
window (/proc/stat: user, nice, system, irq and softirq; a VM's steal time, the hypervisor's share for other guests,
is not counted: it is not another process of this machine) minus this process's own CPU time (all its threads, and
its children that finished: assembly/engine_gate.py measures in one), over the wall time. Example: 2 cores, a 10 s window, 14 s of busy CPU of
which 9 s were ours -> other_cores 0.5: busy (BUSY_CORES = 0.25). Without /proc/stat (macOS, Windows) the 1-minute
load average minus our own threads stands in.
"""
from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass

BUSY_CORES = 0.25  # other processes using more than a quarter of a core on average: the measurement is suspect
LOADED = 0.75  # a load average of this share of the cores or more is not "quiet", even when it is our own threads
DRIFT = 0.25  # two rounds of the same measurement disagreeing by more than this: the machine's speed changed


@dataclass(frozen=True)
class Load:
    other_cores: float  # cores other processes kept busy, on average over the window
    loadavg: float  # 1-minute load average at the end (our own measuring threads included)
    wall_s: float
    cores: int = 0  # the machine's cores (0: not recorded, as in plans made before it was)

    @property
    def busy(self) -> bool:
        return self.other_cores > BUSY_CORES

    def state(self, drift: str = "") -> str:
        """One verdict: BUSY (other processes used the CPU), UNSTEADY (the machine's speed changed: `drift`), loaded
        (nothing else competed, but the load average is near the core count: our own threads), else quiet."""
        if self.busy:
            return "BUSY"
        if drift:
            return "UNSTEADY"
        return "loaded" if self.cores and self.loadavg >= LOADED * self.cores else "quiet"

    def describe(self, drift: str = "") -> str:
        """'quiet (other processes 0.02 cores; load average 0.4 on 2 cores)' | 'loaded (other processes 0.02 cores;
        load average 1.9 on 2 cores, this measurement's threads included)' | 'BUSY (other processes 1.45 cores;
        load average 3.9 on 2 cores)' | 'UNSTEADY (...; <drift>)': never two verdicts in one line."""
        state = self.state(drift)
        on = f" on {self.cores} cores" if self.cores else ""
        ours = ", this measurement's threads included" if state == "loaded" else ""
        return (f"{state} (other processes {self.other_cores:.2f} cores; load average {self.loadavg:.1f}{on}{ours}"
                f"{'; ' + drift if drift and state == 'UNSTEADY' else ''})")

    def to_dict(self) -> dict:
        return asdict(self)


def _machine_busy_s() -> float | None:
    """Seconds of busy CPU time of the whole machine since boot (all cores), from /proc/stat; None elsewhere."""
    try:
        with open("/proc/stat") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    user, nice, system, idle, iowait, irq, softirq = (int(x) for x in (fields[1:8] + ["0"] * 7)[:7])
    return (user + nice + system + irq + softirq) / os.sysconf("SC_CLK_TCK")


def _own_cpu_s() -> float:
    """This process's CPU time and its finished children's (a gate measured in a child process is ours too)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def _loadavg() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


MIN_WINDOW_S = 0.25  # the shortest window whose /proc/stat ticks (10 ms each) can tell a quiet machine from a busy one


class CpuWatch:
    """Measures the other processes' CPU use over a `with` block (or start() ... stop())."""

    def __init__(self, own_threads: int = 1) -> None:
        self.own_threads = own_threads  # for the load-average fallback
        self.load: Load | None = None

    def start(self) -> "CpuWatch":
        self._t0, self._busy0, self._own0 = time.perf_counter(), _machine_busy_s(), _own_cpu_s()
        return self

    def stop(self) -> Load:
        wall = time.perf_counter() - self._t0
        if wall < MIN_WINDOW_S:  # the CPU counters tick every 10 ms: a shorter window can read 0 with both cores
            time.sleep(MIN_WINDOW_S - wall)  # taken, so it is watched on, idle, until the others would show
        wall = max(time.perf_counter() - self._t0, 1e-6)
        busy = _machine_busy_s()
        if busy is not None and self._busy0 is not None:
            other = max(0.0, (busy - self._busy0) - (_own_cpu_s() - self._own0)) / wall
        else:
            other = max(0.0, _loadavg() - self.own_threads)
        self.load = Load(round(other, 3), round(_loadavg(), 2), round(wall, 3), os.cpu_count() or 0)
        return self.load

    def __enter__(self) -> "CpuWatch":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def drifted(a: float, b: float) -> bool:
    """Two measurements of the same speed disagree by more than DRIFT (relative to the faster)."""
    top = max(a, b)
    return top > 0 and abs(a - b) / top > DRIFT


def not_settled(load: Load, disagreed: str = "") -> str:
    """Why a measurement is not cached, in words that add up: other processes kept the cores busy, or (they did not)
    its rounds disagreed, which is noise (a page cache still filling, a CPU changing speed); never "busy" and "quiet"
    at once. disagreed: 'the rounds disagreed by 31% (...)' or ""."""
    if load.busy:
        return (f"other processes kept the machine busy while it measured ({load.other_cores:.2f} cores on average, "
                f"load {load.loadavg:.1f})" + (f"; {disagreed}" if disagreed else ""))
    return f"{disagreed}, with other processes at {load.other_cores:.2f} cores: noise in the measurement"
