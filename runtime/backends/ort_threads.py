"""One intra-op thread pool for every onnxruntime session specedge opens in a process.

Speculative decoding on ONNX Runtime alternates sessions: a drafter artifact and the target, or the 32 segment
sessions of a layered artifact. With a pool per session, the pool that just finished spins on its cores while the
next session's pool wants them (2 cores: four int4 drafter runs then an fp32 verify of 5 tokens take 106 ms against
63 ms on one pool); with spinning off, every run pays thread wake-ups instead (82 ms, and a lone fp32 token 25.6 ms
instead of 21.6). onnxruntime's global thread pool (`set_global_thread_pool_sizes`,
`SessionOptions.use_per_session_threads = False`) gives all sessions one pool that keeps spinning, and a lone
session is as fast on it as on its own (docs/onnx.md, "Thread pools"; perf/session_switch.py measures it).

The global pool is process-wide and fixed once created: its size is the thread count of the first session opened
(later sessions that ask for another count run on it and say so in `threads_note`), and onnxruntime then refuses
any session that keeps per-session threads. A host application that opens its own onnxruntime sessions after
specedge's must create them with `use_per_session_threads = False`, or set SPECEDGE_ORT_THREADPOOL=session before
the first specedge session to keep per-session pools (with the switching cost above; `session-nospin`: pools that
never spin).
"""
from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from typing import Any, Iterator

ENV = "SPECEDGE_ORT_THREADPOOL"
MODES = ("shared", "session", "session-nospin")

_lock = threading.Lock()
_pool_size: int | None = None  # threads of the process-wide pool once specedge created (or found) it


def mode() -> str:
    value = os.environ.get(ENV, "shared").strip().lower() or "shared"
    if value not in MODES:
        raise ValueError(f"{ENV}={value!r}: choose one of {', '.join(MODES)} (shared: one onnxruntime thread pool "
                         "for every session of the process; session: a pool per session; session-nospin: a pool per session "
                         "that never spins)")
    return value


def pool_size() -> int | None:
    """Threads of the shared pool, None while none exists (or in per-session mode)."""
    return _pool_size


def _shared_pool(threads: int) -> int:
    """Create the process-wide pool with `threads` on first use; returns its size."""
    global _pool_size
    with _lock:
        if _pool_size is None:
            from onnxruntime.capi import _pybind_state as C
            try:
                C.set_global_thread_pool_sizes(threads, 1)
            except Exception:  # the host application created it first: its size is unknown, ours is a guess
                pass
            _pool_size = threads
        return _pool_size


def session_options(ort: Any, threads: int, *, spinning: bool = True) -> tuple[Any, int]:
    """(SessionOptions, threads the session will really use). Shared mode: the process pool (created here with
    `threads` if it is the first); session mode: a pool of `threads` that spins between runs iff `spinning`."""
    opts = ort.SessionOptions()
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    policy = mode()
    if policy == "shared":  # no thread counts on the session: onnxruntime warns that they are ignored
        opts.use_per_session_threads = False
        return opts, _shared_pool(threads)
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    spinning = spinning and policy == "session"
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    return opts, threads


def threads_note(requested: int, actual: int) -> str | None:
    """A line for logs when a session runs on a shared pool of another size than it asked for."""
    if requested == actual:
        return None
    return (f"onnxruntime runs every session of this process on one pool of {actual} threads (created first); "
            f"{requested} were asked for. Set {ENV}=session for per-session pools.")


@contextmanager
def foreign_sessions() -> Iterator[None]:
    """Let code specedge does not own (optimum's exporter checks its graph in a session of its own) open onnxruntime
    sessions while the shared pool exists: inside, every new InferenceSession runs on that pool instead of asking
    for per-session threads, which onnxruntime would refuse."""
    if _pool_size is None:
        yield
        return
    import onnxruntime as ort
    cls = ort.InferenceSession
    original = cls.__init__

    def init(self, path_or_bytes, sess_options=None, *args, **kwargs):
        sess_options = sess_options if sess_options is not None else ort.SessionOptions()
        sess_options.use_per_session_threads = False
        original(self, path_or_bytes, sess_options, *args, **kwargs)

    cls.__init__ = init
    try:
        yield
    finally:
        cls.__init__ = original
