"""Build C for a test: each source compiled on its own core, then linked (the sanitizer build of csrc/native took
46 s serially on 2 cores, 23 s so: mm_q4k.c alone takes 16 s under ASan)."""
from __future__ import annotations

import os
import subprocess
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path


def build(cc: str, flags: list[str], sources: list[Path], out: Path, *, link: tuple[str, ...] | list[str] = (),
          timeout: int = 300) -> str:
    """Compile `sources` with `flags` to objects beside `out`, link them with `flags` + `link` into `out`; returns
    "" or the first failing step's command and stderr."""
    objects = [out.parent / f"{out.name}.{i}.{src.stem}.o" for i, src in enumerate(sources)]

    def step(cmd: list[str]) -> str:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
        return "" if r.returncode == 0 else f"{' '.join(cmd)}\n{r.stderr[-3000:]}"
    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        errors = [e for e in pool.map(lambda so: step([cc, "-c", *flags, str(so[0]), "-o", str(so[1])]),
                                      zip(sources, objects)) if e]
    return errors[0] if errors else step([cc, *flags, *map(str, objects), "-o", str(out), *link])
