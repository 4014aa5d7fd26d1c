"""Progress of a long loop (a benchmark sweep, the tuner's trials), with no dependency.

On a terminal one bar is redrawn in place; where the output is a log (a file, a pipe, mpirun's
forwarding) every step is one plain line, so a log shows how far a run got and when.

    with Progress(len(rows), "sweep") as p:
        for row in rows:
            p.step(f"{row} done", keep=True)   # keep: a result line, printed above the bar

RAWFLUX_PROGRESS (rawflux/env.py) picks the mode: auto (default), bar, lines, off. ``enabled=False``
(ranks other than 0, a --quiet run) prints nothing at all; mode "off" prints only the kept lines.
"""
from __future__ import annotations

import shutil
import sys
import time

from .. import env

MODES = ("bar", "lines", "off")


def _hms(s: float) -> str:
    s = int(s + 0.5)
    h, m = divmod(s, 3600)
    m, s = divmod(m, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def is_rank0() -> bool:
    """True unless an MPI launcher says this process is not rank 0 (no mpi4py import: that would
    initialise MPI in code that does not otherwise need it)."""
    return env.launcher_rank() in (None, 0)


class Progress:
    def __init__(self, total: int, label: str = "", *, stream=None, mode: str | None = None, enabled: bool = True,
                 width: int = 24, clock=time.monotonic):
        self.total, self.label, self.count = max(0, int(total)), label, 0
        self._stream, self._clock, self._width = stream, clock, width
        self._t0 = clock()
        self._drawn = False  # bar mode: a bar is on the current line
        mode = env.progress() if mode is None else mode
        if mode == "auto":
            mode = "bar" if _isatty(self.stream) else "lines"
        if mode not in MODES:
            raise ValueError(f"progress mode {mode!r}: use auto, {', '.join(MODES)}")
        self.mode = mode if enabled else None

    @property
    def stream(self):
        # sys.stdout at the time of writing (a test's capture, a notebook's redirection)
        return self._stream if self._stream is not None else sys.stdout

    def _timing(self) -> str:
        el = self._clock() - self._t0
        if 0 < self.count < self.total:
            return f"{_hms(el)}, ~{_hms(el / self.count * (self.total - self.count))} left"
        return _hms(el)

    def line(self, msg: str = "") -> str:
        """The log line of the current count."""
        head = f"[{self.count}/{self.total} {self._timing()}]"
        body = ": ".join(x for x in (self.label, msg) if x)
        return f"{head} {body}" if body else head

    def bar(self, msg: str = "") -> str:
        """The terminal bar of the current count (no line end)."""
        frac = self.count / self.total if self.total else 1.0
        fill = int(round(frac * self._width))
        text = (f"{self.label + ' ' if self.label else ''}|{'#' * fill}{'.' * (self._width - fill)}| "
                f"{self.count}/{self.total} {100 * frac:3.0f}% {self._timing()}" + (f" {msg}" if msg else ""))
        cols = shutil.get_terminal_size((100, 20)).columns
        return text[: max(20, cols - 1)]

    def _put(self, text: str) -> None:
        out = self.stream
        out.write(text)
        out.flush()

    def step(self, msg: str = "", n: int = 1, *, keep: bool = False) -> None:
        """Count ``n`` more done. ``msg``: what was done; ``keep``: it is a result (stays on the
        terminal above the bar, and is printed even in mode off)."""
        self.count = min(self.total, self.count + n) if self.total else self.count + n
        if self.mode is None:
            return
        if self.mode == "lines":
            self._put(self.line(msg) + "\n")
        elif self.mode == "off":
            if keep and msg:
                self._put(msg + "\n")
        else:
            clear = "\r\x1b[K" if self._drawn else ""
            if keep and msg:
                self._put(f"{clear}{msg}\n{self.bar()}")
            else:
                self._put(f"{clear}{self.bar(msg)}")
            self._drawn = True

    def write(self, msg: str) -> None:
        """A line that is no step (a note, a warning): above the bar on a terminal."""
        if self.mode is None:
            return
        if self.mode == "bar" and self._drawn:
            self._put(f"\r\x1b[K{msg}\n{self.bar()}")
        else:
            self._put(msg + "\n")

    def close(self) -> None:
        """End the bar's line (the terminal's next output starts on a fresh one)."""
        if self.mode == "bar" and self._drawn:
            self._put(f"\r\x1b[K{self.bar()}\n")
            self._drawn = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False


def _isatty(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed file
        return False
