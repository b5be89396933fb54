"""Progress of long work (data generation, SFT, RL, evaluation, model preparation).

On a terminal it is a rich bar with the count, elapsed time, ETA and the key metric. Anywhere else
(CI logs, ``nohup``, a pipe) it is line-oriented and quiet: one line at the start, then at most one
line every ``LUDIC_PROGRESS_EVERY`` seconds (default 30), and one at the end, each with the ETA::

    [SFT] 120/400 (30%)  elapsed 1:02  eta 2:25  loss=0.3100

``LUDIC_PROGRESS`` forces a mode: ``bar``, ``lines`` or ``off``.

    with Progress("eval", total=len(requests), unit="episode") as bar:
        for ... :
            bar.update(1, win_rate=0.4)

    for x in track(items, "datagen"):
        ...
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any, Iterable, Iterator, TextIO, TypeVar

T = TypeVar("T")

MODES = ("bar", "lines", "off")


def progress_mode(stream: TextIO | None = None) -> str:
    """``LUDIC_PROGRESS`` if set, else ``bar`` on a terminal and ``lines`` otherwise."""
    mode = os.environ.get("LUDIC_PROGRESS", "").strip().lower()
    if mode:
        if mode not in MODES:
            raise ValueError(f"LUDIC_PROGRESS={mode!r}: expected one of {', '.join(MODES)}")
        return mode
    stream = stream or sys.stderr
    return "bar" if getattr(stream, "isatty", lambda: False)() else "lines"


def format_seconds(s: float) -> str:
    s = int(max(0.0, s))
    h, rem = divmod(s, 3600)
    return f"{h}:{rem // 60:02d}:{rem % 60:02d}" if h else f"{rem // 60}:{rem % 60:02d}"


def format_metrics(metrics: dict[str, Any]) -> str:
    out = []
    for k, v in metrics.items():
        if isinstance(v, float):
            out.append(f"{k}={v:.4g}")
        elif isinstance(v, (int, str)):
            out.append(f"{k}={v}")
    return "  ".join(out)


class Progress:
    """One long task: ``update(n, **metrics)`` advances it and shows the latest metrics.

    Args:
        desc: what is running ("SFT", "eval vs minimax").
        total: units expected (None: unknown, no ETA).
        unit: the name of one unit, for the lines.
        stream: where it goes (stderr by default, so stdout stays for results).
        every_s: seconds between lines when not on a terminal.
        mode: ``bar``, ``lines`` or ``off``; None picks by ``progress_mode``.
        eta_after: units done before an ETA is shown. Concurrent units (episodes in flight together)
            finish in bursts, so an ETA from the first one is far off; the rollout engine waits for 5%.
    """

    def __init__(self, desc: str, total: int | None = None, *, unit: str = "it", stream: TextIO | None = None,
                 every_s: float | None = None, mode: str | None = None, start: int = 0, eta_after: int = 1) -> None:
        self.desc, self.total, self.unit, self.eta_after = desc, total, unit, max(1, eta_after)
        self.stream = stream or sys.stderr
        self.mode = mode or progress_mode(self.stream)
        self.every_s = float(os.environ.get("LUDIC_PROGRESS_EVERY", 30.0)) if every_s is None else every_s
        self.n = self.start = start
        self.metrics: dict[str, Any] = {}
        self.t0 = time.monotonic()
        self._last_line = -float("inf")
        self._bar: Any = None
        self._task: Any = None
        self.closed = False
        if self.mode == "bar":
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn,
                                           TimeRemainingColumn)
                from rich.progress import Progress as RichProgress
            except ImportError:  # pragma: no cover - rich is a core dependency
                self.mode = "lines"
            else:
                self._bar = RichProgress(
                    TextColumn("[bold cyan]{task.description}"), BarColumn(), MofNCompleteColumn(),
                    TimeElapsedColumn(), TextColumn("eta"), TimeRemainingColumn(), TextColumn("{task.fields[metrics]}"),
                    console=Console(file=self.stream), transient=False)
                self._bar.start()
                self._task = self._bar.add_task(desc, total=total, completed=start, metrics="")
        elif self.mode == "lines":
            self._line()

    @property
    def console(self) -> Any:
        """The rich console under the bar (print through it so lines appear above the bar), or None."""
        return self._bar.console if self._bar is not None else None

    def eta_s(self) -> float | None:
        done = self.n - self.start
        if not self.total or done < self.eta_after:
            return None
        return (time.monotonic() - self.t0) / done * max(0, self.total - self.n)

    def line(self) -> str:
        """The text of one progress line (what ``lines`` mode prints)."""
        count = f"{self.n}/{self.total} ({100 * self.n / self.total:.0f}%)" if self.total else f"{self.n} {self.unit}"
        eta = self.eta_s()
        parts = [f"[{self.desc}] {count}", f"elapsed {format_seconds(time.monotonic() - self.t0)}"]
        if eta is not None and self.n < (self.total or 0):
            parts.append(f"eta {format_seconds(eta)}")
        if self.metrics:
            parts.append(format_metrics(self.metrics))
        return "  ".join(parts)

    def due(self) -> bool:
        """Whether the next line is due: ``every_s`` seconds since the last one."""
        return time.monotonic() - self._last_line >= self.every_s

    def write_line(self, text: str) -> None:
        """Print one line to the stream and start the interval to the next afresh."""
        self._last_line = time.monotonic()
        print(text, file=self.stream, flush=True)

    def _line(self) -> None:
        self.write_line(self.line())

    def update(self, n: int = 1, **metrics: Any) -> None:
        self.n += n
        self.metrics.update(metrics)
        if self.mode == "bar":
            self._bar.update(self._task, completed=self.n, metrics=format_metrics(self.metrics))
        elif self.mode == "lines" and self.due():
            self._line()

    def set_total(self, total: int) -> None:
        self.total = total
        if self._bar is not None:
            self._bar.update(self._task, total=total)

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        if self.mode == "bar":
            self._bar.stop()
        elif self.mode == "lines" and self.n > self.start:
            self._line()

    def __enter__(self) -> "Progress":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def track(items: Iterable[T], desc: str, total: int | None = None, unit: str = "it", **kw: Any) -> Iterator[T]:
    """Iterate ``items`` with a ``Progress`` (total from ``len(items)`` when it has one)."""
    if total is None and hasattr(items, "__len__"):
        total = len(items)  # type: ignore[arg-type]
    with Progress(desc, total, unit=unit, **kw) as bar:
        for x in items:
            yield x
            bar.update(1)
