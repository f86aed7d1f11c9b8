"""The cores of one process: how many an engine uses by default (default_threads), what they can do (cpu_info), and
how the engine calls that compute at the same time share them.

A plan measures one request at a time, so its thread count is the fastest for a call that has the cores to itself.
Two calls computing at once (a server's two models, an embedding beside a generation) with that many threads each
oversubscribe the cores, where llama.cpp's spinning threads collapse. llama.cpp takes a thread count per call
(llama_set_n_threads), so a call that shares the cores runs each step with

    threads = max(1, planned // running)     # running: calls computing now, this one included

and goes back to `planned` as soon as it is alone again. Example: planned 2 on 2 cores; a second call starts ->
both step with 1 thread; it ends -> the first steps with 2 again. Calls waiting for an engine's lock are asleep
and do not count (apps/api.py's Engine runs one call at a time).

Changing the thread count must not change an answer: `same_logits_across_threads` probes that a backend's logits
(one-token calls and a verify batch, after a prefix longer than the point where mainline llama.cpp's attention
splits the cached positions by thread) are bit-identical at every count from 1 to planned; a backend that fails
it keeps its planned count however many calls run.
"""
from __future__ import annotations

import contextlib
import os
import platform
import threading
from pathlib import Path
from typing import Iterator, Protocol, runtime_checkable

import numpy as np

from .backends.base import Backend, feed

MAX_DEFAULT_THREADS = 8  # beyond this a small model's decode step gains little and the machine's other work suffers


def default_threads(threads: int | None = None) -> int:
    """The thread count an engine runs with when none is given (--threads left out): min(cores, 8); `threads` when
    given. The one place the default is written: the engines, the plan, the profiles and the gates key on it."""
    return int(threads) if threads else min(os.cpu_count() or 1, MAX_DEFAULT_THREADS)


def cpu_info() -> tuple[str, list[str]]:
    """(CPU model name, its feature flags) from /proc/cpuinfo; (platform name, []) where there is none."""
    model, flags = platform.processor() or platform.machine(), []
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, val = line.partition(":")
            if key.strip() == "model name" and val.strip():
                model = val.strip()
            elif key.strip() in ("flags", "Features") and not flags:
                flags = val.split()
    except OSError:
        pass
    return model, flags


PROBE_PREFIX = 160  # cached positions before the probe's calls (mainline splits attention beyond ~100)
PROBE_WIDTH = 5  # the probe's verify batch


@runtime_checkable
class ThreadedBackend(Protocol):
    """A backend whose thread count can change between calls (llama.cpp engines)."""

    threads: int  # the thread count its calls run with now

    def set_threads(self, n: int) -> None: ...


class CoreShare:
    """Counts the engine calls computing now; `threads(planned)` is each one's share. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0

    @property
    def running(self) -> int:
        return self._running

    @contextlib.contextmanager
    def computing(self) -> Iterator[None]:
        """Count one call as computing for the duration of the block."""
        with self._lock:
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1

    def threads(self, planned: int) -> int:
        """The thread count a call planned for `planned` threads runs its next step with (module docstring)."""
        return max(1, planned // max(1, self._running))


def same_logits_across_threads(backend: Backend, planned: int, seed: int = 0) -> bool:
    """Do one-token calls and a PROBE_WIDTH-token call after a PROBE_PREFIX-token prefix give the same logits, bit
    for bit, at every thread count from 1 to `planned` (each the same as at `planned`; whether a batch equals
    one-token calls is the backend's batch_invariant, probed elsewhere)? requires: a ThreadedBackend; leaves it at `planned` threads
    with an empty cache (run it before a Session takes the backend's cache)."""
    if not isinstance(backend, ThreadedBackend):
        return False
    rng = np.random.default_rng(seed)
    n = PROBE_PREFIX + PROBE_WIDTH
    room = min(backend.config.context_length, backend.caps.max_context or n)
    if room < n:
        return False
    ids = rng.integers(1, backend.config.vocab_size - 1, n).astype(np.int32)
    reference: tuple[np.ndarray, np.ndarray] | None = None
    try:
        for t in range(planned, 0, -1):
            backend.set_threads(t)
            cache = backend.new_cache(n)
            feed(backend, ids[:PROBE_PREFIX], cache)
            apart = np.concatenate([backend.forward(ids[i:i + 1], cache) for i in range(PROBE_PREFIX, n)])
            cache.rollback(PROBE_PREFIX)
            together = backend.forward(ids[PROBE_PREFIX:], cache)
            if reference is None:
                reference = (apart, together)
            elif not (np.array_equal(apart, reference[0]) and np.array_equal(together, reference[1])):
                return False
        return True
    finally:
        backend.set_threads(planned)
        backend.new_cache(1)
