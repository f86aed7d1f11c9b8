"""Several models behind one server: ids -> loaders, loaded on first use, evicted least-recently-used.

    lease(id) ─> loaded? ─ yes ─> uses + 1, most recently used ─> Lease(engine) ─ release() ─> uses - 1
                    │ no
                    └─> evict idle engines, least recently used first, until the estimate fits max_bytes
                        (none fits: PoolFull) ─> load (outside the lock; others wait for this id only) ─> Lease

Memory is accounted per model as its weight bytes: `estimate` (the sizes on disk of its GGUF file, or of an
artifact's .onnx / .onnx.data files) before it loads, then max(estimate, `weigh(engine)`) once loaded (the server
weighs the backend's weight_bytes(): the NumPy backend holds float32 copies larger than the file). A model with a
running or queued call (use count > 0) or one still loading is never evicted. Thread-safe: one condition guards the
accounting; loads run outside it. `model_id_for` names a served model, `engine_bytes` weighs a loaded one.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Generic, Sequence, TypeVar

E = TypeVar("E")


class ModelNotFound(KeyError):
    """The id names no served model."""


class PoolFull(RuntimeError):
    """The model cannot be loaded within max_bytes: too large, or the others are busy (`busy` tells which)."""

    def __init__(self, message: str, busy: bool) -> None:
        super().__init__(message)
        self.busy = busy


@dataclass(frozen=True)
class PoolEntry(Generic[E]):
    """One servable model: its id, how to load it, and its weight bytes before loading."""
    id: str
    load: Callable[[], E]
    estimate: int = 0


@dataclass(frozen=True)
class ModelState:
    id: str
    loaded: bool
    bytes: int  # accounted bytes: the estimate until loaded, then max(estimate, weigh(engine))
    in_use: int  # leases held: calls running or waiting for this engine


class Lease(Generic[E]):
    """One use of a loaded engine; `release()` (idempotent) lets the pool evict it again."""

    def __init__(self, pool: "ModelPool", model_id: str, engine: E) -> None:
        self.pool, self.model_id, self.engine, self.t0 = pool, model_id, engine, time.perf_counter()
        self.handed_off = False  # the server sets it once a started call owns the lease (its end releases it)
        self._released = False

    def release(self) -> None:
        if not self._released:
            self._released = True
            self.pool._release(self.model_id)

    def __enter__(self) -> "Lease[E]":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def format_bytes(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**30 else f"{n / 2**20:.1f} MiB"


class ModelPool(Generic[E]):
    """Engines by id; loaded on first `lease`, evicted LRU beyond max_bytes (None: no limit)."""

    def __init__(self, entries: Sequence[PoolEntry[E]], *, max_bytes: int | None = None,
                 weigh: Callable[[E], int] | None = None, log: Callable[[str], None] | None = None) -> None:
        if not entries:
            raise ValueError("a model pool needs at least one model")
        ids = [e.id for e in entries]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"two models have the id {dup[0]!r}: model ids must be unique (rename a file, or serve "
                             "one of them)")
        self.entries = {e.id: e for e in entries}
        self.max_bytes, self.weigh, self.log = max_bytes, weigh, log or (lambda m: None)
        self._engines: OrderedDict[str, E] = OrderedDict()  # loaded, least recently used first
        self._bytes = {e.id: int(e.estimate) for e in entries}
        self._uses = {e.id: 0 for e in entries}
        self._loading: set[str] = set()
        self._cond = threading.Condition()

    @classmethod
    def single(cls, engine: E, model_id: str, weigh: Callable[[E], int] | None = None) -> "ModelPool[E]":
        """A pool of one engine already loaded (the single-model server)."""
        pool = cls([PoolEntry(model_id, lambda: engine)], weigh=weigh)
        pool._engines[model_id] = engine
        pool._bytes[model_id] = max(0, weigh(engine)) if weigh else 0
        return pool

    @property
    def ids(self) -> list[str]:
        return list(self.entries)

    def resolve(self, requested: str | None) -> str:
        """The served id for a request's `model`: with one model served, that one whatever is asked; else the
        named one (ModelNotFound otherwise, or for a missing name)."""
        if len(self.entries) == 1:
            return next(iter(self.entries))
        if requested in self.entries:
            return requested
        served = ", ".join(self.entries)
        if requested is None:
            raise ModelNotFound(f"this server has several models: name one in `model` ({served}; GET /v1/models)")
        raise ModelNotFound(f"model {requested!r} is not served here: this server has {served} (GET /v1/models)")

    def state(self) -> list[ModelState]:
        with self._cond:
            return [ModelState(i, i in self._engines, self._bytes[i], self._uses[i]) for i in self.entries]

    def engine_if_loaded(self, model_id: str) -> E | None:
        with self._cond:
            return self._engines.get(model_id)

    def lease(self, model_id: str) -> Lease[E]:
        """The engine for model_id, loaded if needed (blocks while it loads); raises ModelNotFound, PoolFull, or
        what the loader raises."""
        if model_id not in self.entries:
            raise ModelNotFound(f"model {model_id!r} is not served here: this server has "
                                f"{', '.join(self.entries)} (GET /v1/models)")
        with self._cond:
            while model_id in self._loading:
                self._cond.wait()
            if model_id in self._engines:
                self._uses[model_id] += 1
                self._engines.move_to_end(model_id)
                return Lease(self, model_id, self._engines[model_id])
            self._make_room(model_id)
            self._loading.add(model_id)
        try:
            t0 = time.perf_counter()
            engine = self.entries[model_id].load()
        except BaseException:
            with self._cond:
                self._loading.discard(model_id)
                self._cond.notify_all()
            raise
        with self._cond:
            self._loading.discard(model_id)
            if self.weigh is not None:
                self._bytes[model_id] = max(self._bytes[model_id], int(self.weigh(engine)))
            self._engines[model_id] = engine
            self._uses[model_id] += 1
            self._cond.notify_all()
        self.log(f"loaded {model_id} ({format_bytes(self._bytes[model_id])}) in {time.perf_counter() - t0:.1f} s")
        return Lease(self, model_id, engine)

    def _make_room(self, model_id: str) -> None:
        """Evict idle engines, least recently used first, until model_id's estimate fits (holding the lock)."""
        if self.max_bytes is None:
            return
        need = self._bytes[model_id]
        if need > self.max_bytes:
            raise PoolFull(f"model {model_id!r} needs about {format_bytes(need)} of weights, more than --max-memory "
                           f"{format_bytes(self.max_bytes)}: raise --max-memory", busy=False)
        held = lambda: sum(self._bytes[i] for i in (*self._engines, *self._loading))  # noqa: E731
        idle = [i for i in self._engines if self._uses[i] == 0]  # least recently used first
        if held() + need - sum(self._bytes[i] for i in idle) > self.max_bytes:
            busy = [i for i in (*self._engines, *self._loading) if i not in idle]
            raise PoolFull(f"model {model_id!r} ({format_bytes(need)}) does not fit in --max-memory "
                           f"{format_bytes(self.max_bytes)} while {', '.join(busy)} are in use: retry after a moment, "
                           "or start the server with a larger --max-memory", busy=True)
        for victim in idle:
            if held() + need <= self.max_bytes:
                break
            del self._engines[victim]  # the engine's memory goes with its last reference
            self.log(f"evicted {victim} ({format_bytes(self._bytes[victim])}) to load {model_id} (--max-memory "
                     f"{format_bytes(self.max_bytes)})")

    def _release(self, model_id: str) -> None:
        with self._cond:
            self._uses[model_id] -= 1


def parse_bytes(text: str) -> int:
    """'2GB' -> 2e9, '512MiB' -> 512 * 2**20, '1.5G' -> 1.5 * 2**30, '4096' -> 4096 bytes. KB/MB/GB/TB are powers
    of 1000, KiB/MiB/GiB/TiB and the bare K/M/G/T powers of 1024; case-insensitive."""
    s = text.strip().lower().replace(" ", "")
    units = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
             "k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
    number = s.rstrip("kmgtib")
    unit = s[len(number):]
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in units or not value > 0:
        raise ValueError(f"not a memory size: {text!r} (examples: 2GB, 1.5GiB, 800MB, 4096)")
    return int(value * units[unit])


def disk_bytes(path: Path) -> int:
    """Weight bytes on disk: a GGUF file's size, or an artifact directory's .onnx and .onnx.data files."""
    if path.is_file():
        return path.stat().st_size
    if path.is_dir():
        return sum(p.stat().st_size for p in path.rglob("*")
                   if p.is_file() and (p.name.endswith(".onnx") or p.name.endswith(".onnx.data")))
    return 0


def model_id_for(model: str) -> str:
    """A catalogue name as is; a path by its file or directory name."""
    p = Path(model)
    return p.name if (p.suffix == ".gguf" or len(p.parts) > 1) else model


def generates(model) -> bool:
    """An Engine (a text generator), not an embedding model (assembly/embedding.py)."""
    return hasattr(model, "stream")


def engine_bytes(engine) -> int:
    """An engine's weight bytes: its target's files on disk, or its backend's weight_bytes() when larger (an
    embedding model's: its weight_bytes())."""
    if not generates(engine):
        return int(engine.weight_bytes())
    return max(disk_bytes(Path(engine.model.path)), int(engine.model.backend.weight_bytes()))
