"""Cached measurements: the one implementation of what the plan (assembly/plan.py), the device profiles
(assembly/profile.py, auto.py), the engine gate (assembly/engine_gate.py) and serve's thread probe
(apps/serve_threads.py) each need to keep something measured on this machine.

    PLANS = Store("plans", "plan", PLAN_VERSION, covers="model, machine, threads and engine versions")
    key = PLANS.key(fingerprint, threads, ...)    16 hex digits over the version and what changes the answer
    path = PLANS.path(cache_root, key)            <model cache>/plans/<key>.json
    plan, why = PLANS.load(path, key, decode)     the cached one, or None and why it must be measured again (none
                                                  yet, unreadable, another version, measured for another key)
    with watch(threads) as w: ...measure...       the machine's load over the measurement (contention.CpuWatch)
    PLANS.keep(obj, path, w.load, log=log)        cached (atomically: a sibling temporary file, then os.replace),
                                                  or, measured on a busy machine or with rounds that disagreed,
                                                  "used for this run only, not cached": one line either way

A measurement of speed (a plan, a profile) goes through `keep`, and records its load (`recorded`) in what it
stores. One of correctness (the gate's top-1 agreement, serve's same-logits probe), which a busy machine does not
change, is stored with `save` directly. Every stored object carries its version under `version_field` and its
`key`; a file of another version is re-measured, never misread (bump the store's version when what it stores
changes meaning or shape).
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, TypeVar

from .contention import CpuWatch, Load, not_settled

T = TypeVar("T")
Log = Callable[[str], None]


@dataclass(frozen=True)
class Store:
    """One kind of cached measurement: its folder under the model cache, its name and version."""

    folder: str  # <model cache>/<folder>/<key>.json
    what: str  # names it in messages: "plan", "device profile"
    version: int  # in the key and in every stored object
    covers: str  # what the key covers, for "no plan for this <covers> yet"
    version_field: str = "version"  # where a stored object holds its version

    def key(self, *parts) -> str:
        """16 hex digits over the version and `parts` (JSON: dicts by sorted keys, tuples as lists, anything else
        as its str). Example: PLANS.key("ab12", 2, ["int4"], {"cpu_model": "x"})."""
        text = json.dumps([self.version, *parts], sort_keys=True, default=str)
        return hashlib.sha256(text.encode()).hexdigest()[:16]

    def path(self, cache_root: Path, key: str) -> Path:
        return Path(cache_root) / self.folder / f"{key}.json"

    def read(self, path: Path, key: str | None) -> tuple[dict | None, str]:
        """(the stored object, "") when `path` holds one of this version measured for `key` (None: any key); else
        (None, why it must be measured again)."""
        path = Path(path)
        if not path.is_file():
            return None, f"no {self.what} for this {self.covers} yet"
        try:
            obj = json.loads(path.read_text())
        except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError
            return None, f"the cached {self.what} {path} is unreadable ({e})"
        if not isinstance(obj, dict):
            return None, f"the cached {self.what} {path} is unreadable (not a JSON object)"
        if obj.get(self.version_field) != self.version:
            return None, (f"the cached {self.what} {path} is from another version ({self.version_field} "
                          f"{obj.get(self.version_field)}, this specedge reads {self.version})")
        if key is not None and obj.get("key") != key:
            return None, f"the cached {self.what} {path} was measured for another {self.covers}"
        return obj, ""

    def load(self, path: Path, key: str | None, decode: Callable[[dict], T]) -> tuple[T | None, str]:
        """read, then decode (a ValueError, TypeError or KeyError from it: unreadable, measured again)."""
        obj, why = self.read(path, key)
        if obj is None:
            return None, why
        try:
            return decode(obj), ""
        except (ValueError, TypeError, KeyError) as e:
            return None, f"the cached {self.what} {path} is unreadable ({e})"

    def save(self, obj: dict, path: Path) -> Path:
        """Write `obj` (which carries its version) as indented JSON, atomically: a crash, or another process
        writing the same key, leaves a whole file, never half of one."""
        if obj.get(self.version_field) != self.version:
            raise ValueError(f"a {self.what} must carry {self.version_field}={self.version} to be cached")
        return _write_json_atomic(obj, path)

    def keep(self, obj: dict, path: Path, load: Load, *, log: Log, drift: str = "", subject: str = "",
             again: str = "") -> bool:
        """Cache a measurement of speed unless the machine was not settled while it ran (other processes busy, or
        its rounds disagreed: `drift`); says which in one line. Returns whether it was cached.
        'plan: other processes kept the machine busy while it measured (...): used for this run only, not cached;
        <again>' | 'plan saved to <path> (64 s, quiet (other processes 0.02 cores; ...))'."""
        subject = subject or self.what
        if load.busy or drift:
            log(f"{subject}: {not_settled(load, drift)}: used for this run only, not cached"
                + (f"; {again}" if again else ""))
            return False
        self.save(obj, path)
        log(f"{subject} saved to {path} ({load.wall_s:.0f} s, {load.describe()})")
        return True


def watch(threads: int) -> CpuWatch:
    """`with watch(threads) as w: ...` -> w.load: other processes' CPU use over the block (assembly/contention.py;
    `threads` are this measurement's own, for the load-average fallback)."""
    return CpuWatch(threads)


def recorded(load: Load, drift: str = "") -> dict:
    """The load a measurement ran under, as stored with it: Load's fields, busy and drift."""
    return {**load.to_dict(), "busy": load.busy, "drift": drift}


def described(record: dict) -> str:
    """A stored load record in words (Load.describe): 'quiet (other processes 0.02 cores; load average 1.1 on 2
    cores)'; "" for none."""
    if not record:
        return ""
    load = Load(record.get("other_cores", 0.0), record.get("loadavg", 0.0), record.get("wall_s", 0.0),
                record.get("cores", 0))
    return load.describe(record.get("drift") or "")


def _write_json_atomic(obj, path: Path) -> Path:
    """Write obj as indented JSON to path (parents created) through a sibling temporary file named after this
    process (two processes writing the same key do not share one) and os.replace."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(obj, indent=2))
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path
