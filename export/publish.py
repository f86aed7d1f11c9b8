"""Publishing an export atomically: write into a staging sibling, then move it into place.

    stage = stage_dir(out)       # <parent>/.<name>.partial-<pid>, fresh; stale stages of dead exports removed
    ... write the artifact into stage ...
    publish(stage, out)          # out now holds the finished artifact (a previous one set aside, then removed)

`out` only ever receives a finished artifact, so an export killed midway leaves no directory a later run would
trust. Used by `specedge export` and by the planner's on-demand exports (assembly/plan_run.py).
"""
from __future__ import annotations

import os
import shutil
from pathlib import Path

from ..models.catalog import pid_alive
from ..models.manifest import MANIFEST


def stage_dir(out: Path) -> Path:
    """A fresh sibling `.<name>.partial-<pid>` of `out` to export into. Raises ValueError when `out` exists and is
    not an exported artifact (and not an empty directory): nothing is overwritten that an export did not write."""
    out = Path(out)
    if out.exists() and not (out / MANIFEST).is_file() and (not out.is_dir() or any(out.iterdir())):
        raise ValueError(f"--out {out} exists and is not an exported artifact (no {MANIFEST}); pass a new or empty "
                         "directory")
    out.parent.mkdir(parents=True, exist_ok=True)
    for stale in out.parent.glob(f".{out.name}.partial-*"):
        pid = stale.name.rpartition("-")[2]
        if pid.isdigit() and not pid_alive(int(pid)):
            shutil.rmtree(stale, ignore_errors=True)
    stage = out.with_name(f".{out.name}.partial-{os.getpid()}")
    shutil.rmtree(stage, ignore_errors=True)
    return stage


def publish(stage: Path, out: Path) -> None:
    """Move a finished export into `out`; a previous artifact there is set aside first and removed after."""
    old = Path(out).with_name(f".{Path(out).name}.old-{os.getpid()}")
    if Path(out).exists():
        os.replace(out, old)
    os.replace(stage, out)
    shutil.rmtree(old, ignore_errors=True)
