"""Progress on stderr for pulls, plans and benchmarks: a tqdm bar on a terminal, plain lines anywhere else.

tqdm redraws its bar with `\\r` frames, which a log file, a CI log or a pipe keeps as one long line of frames; so
where the stream is not a terminal, `LineBar` writes one line per phase (its description) and per tenth of the work
done instead, and nothing before the first of them (an early error comes without a stray "0%" line).
"""
from __future__ import annotations

import sys
from typing import IO, Any


def progress_bar(total: float | None, *, desc: str = "", unit: str = "it", enabled: bool = True,
                 unit_scale: bool = False, file: IO[str] | None = None, **tqdm_kw: Any):
    """A progress bar with tqdm's interface (update, set_description, write, close, total, n, `with`): tqdm's own on
    a terminal; LineBar elsewhere; tqdm's disabled bar when not `enabled`."""
    stream = file or sys.stderr
    is_tty = getattr(stream, "isatty", lambda: False)()
    if enabled and not is_tty:
        return LineBar(total, desc=desc, unit=unit, unit_scale=unit_scale, file=stream)
    from tqdm import tqdm
    return tqdm(total=total, desc=desc, unit=unit, unit_scale=unit_scale, file=stream, disable=not enabled,
                **tqdm_kw)


def _fmt(n: float, unit_scale: bool) -> str:
    if not unit_scale:
        return f"{n:g}"
    for scale, prefix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= scale:
            return f"{n / scale:.1f} {prefix}"
    return f"{n:g} "


class LineBar:
    """tqdm's interface, written as whole lines: "DESC: 40% (39.3 MB/98.4 MB)"."""

    STEP = 10  # percent between lines

    def __init__(self, total: float | None, *, desc: str = "", unit: str = "it", unit_scale: bool = False,
                 file: IO[str]) -> None:
        self.total, self.n, self.desc = total, 0, desc
        self._unit, self._scale, self._file = unit, unit_scale, file
        self._shown = -1  # the last tenth written for this description (-1: none yet)

    def __enter__(self) -> "LineBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _line(self, text: str) -> None:
        print(text, file=self._file, flush=True)

    def _count(self) -> str:
        unit = self._unit if not self._scale else self._unit.strip()
        done = _fmt(self.n, self._scale)
        if not self.total:
            return f"{done}{unit}" if self._scale else f"{done} {unit}"
        return f"{done}{unit}/{_fmt(self.total, self._scale)}{unit}" if self._scale else \
            f"{done}/{_fmt(self.total, False)} {unit}"

    def refresh(self) -> None:
        """A line when the work has crossed another tenth since the last line of this phase."""
        if not self.total:
            return
        pct = min(100, int(100 * self.n / self.total))
        tenth = pct // self.STEP
        if tenth > self._shown:
            self._shown = tenth
            self._line(f"{self.desc}: {pct}% ({self._count()})" if self.desc else f"{pct}% ({self._count()})")

    def update(self, n: float = 1) -> None:
        self.n += n
        self.refresh()

    def set_description(self, desc: str, refresh: bool = True) -> None:
        """A new phase: its own line; the next line comes at the next tenth."""
        if desc != self.desc:
            self.desc = desc
            self._shown = int(100 * self.n / self.total) // self.STEP if self.total else -1
            self._line(desc)
        if refresh:
            self.refresh()

    def write(self, text: str, file: IO[str] | None = None) -> None:
        print(text, file=file or self._file, flush=True)

    def close(self) -> None:
        pass
