"""NumPy's BLAS beside an engine that computes on its own threads (native, llama.cpp, ik_llama.cpp, ONNX Runtime).

OpenBLAS's worker threads spin for a while after each call before they sleep. A NumPy matmul between two engine
forwards (a draft head's attention, a LoRA-Drop correction) leaves them spinning on the cores the engine's threads
need: on 2 cores a SmolLM2-135M native forward took 6.6 ms instead of 3.2 after a 0.1 ms NumPy matmul (and 3.2-3.5
ms with OpenBLAS at one thread; `perf/head_cost.py` had set OPENBLAS_NUM_THREADS=1 for its own measurement). So
opening such an engine sets every BLAS NumPy loaded to one thread for the rest of the process (threadpoolctl). The
NumPy reference backend keeps BLAS's threads where no such engine is open; in a process that holds both (a test
session, a server with a reference model) it runs on one thread, except inside `every_core()`, which a stretch of
reference work between engine calls takes (SmolLM2-135M's reference on 2 cores: 45 -> 31 ms a token, 1.1 -> 0.7 s
a 300-token prompt).
"""
from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_quiet = False


def quiet_blas() -> None:
    """BLAS at one thread, process-wide, once (every later call returns at once)."""
    global _quiet
    with _lock:
        if _quiet:
            return
        from threadpoolctl import threadpool_limits
        threadpool_limits(limits=1, user_api="blas")
        _quiet = True


@contextmanager
def every_core() -> Iterator[None]:
    """BLAS on every core inside, as it was after (one thread if an engine was opened meanwhile). For reference
    work that no engine call interleaves with: BLAS's spinning workers would take the engine's cores."""
    from threadpoolctl import threadpool_limits
    limiter = threadpool_limits(limits=os.cpu_count() or 1, user_api="blas")
    try:
        yield
    finally:
        limiter.restore_original_limits()
        with _lock:
            if _quiet:
                threadpool_limits(limits=1, user_api="blas")
