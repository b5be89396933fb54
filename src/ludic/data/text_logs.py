"""Training logs in the ThinkTacToe text format (a ``MetricsLogger``).

``TextLogLogger(logs_dir, "grpo")`` writes
``<logs_dir>/grpo_training_logs_YYYYMMDD_HHMMSS.txt``::

    === GRPO Training Logs ===
    Started at: 2024-01-15 14:30:25
    ==================================================

    Step 10: {
      "loss": 0.0612,
      "reward_mean": 0.75
    }
    ------------------------------

one ``Step N: <JSON, indent 2>`` block and a line of 30 ``-`` per logged
step, flushed at once. ``read_text_log`` parses such a file back.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from pathlib import Path
from typing import Any

from ludic.data.jsonl import DatasetError

HEADER_RULE = "=" * 50
STEP_RULE = "-" * 30
TIME_FORMAT = "%Y-%m-%d %H:%M:%S"
FILE_TIME_FORMAT = "%Y%m%d_%H%M%S"

_KIND_RE = re.compile(r"[a-z0-9_]+")
_TITLE_RE = re.compile(r"=== (.+) Training Logs ===")
_STEP_RE = re.compile(r"Step (-?\d+): (.*)")


def _scalar(value: Any) -> Any:
    """A JSON scalar for ``value`` (bool/int/float/str/None, or a 1-element tensor/array), else a sentinel."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if hasattr(value, "item"):  # numpy scalars/arrays, torch tensors: only one element
        try:
            item = value.item()
        except (ValueError, RuntimeError, TypeError):
            return _SKIP
        return item if isinstance(item, (bool, int, float)) else _SKIP
    return _SKIP


_SKIP = object()


def log_filename(kind: str, started: datetime) -> str:
    """``{kind}_training_logs_YYYYMMDD_HHMMSS.txt``."""
    return f"{kind}_training_logs_{started.strftime(FILE_TIME_FORMAT)}.txt"


class TextLogLogger:
    """``MetricsLogger`` writing the seed's text log format.

    Args:
        logs_dir: directory (created if missing).
        kind: ``"sft"``, ``"dpo"``, ``"grpo"`` (any lowercase word of
            ``[a-z0-9_]``; the header shows it upper-cased).
        started: start time for the header and file name (default: now).

    Only scalar metrics are written (bool, int, float, str, None, one-element
    tensors/arrays); other values are dropped. NaN/inf are written as
    Python's ``json`` does (``NaN``, ``Infinity``), as the original did. If the
    file name is taken (two runs in one second) a ``_2``, ``_3``... suffix is added.
    """

    def __init__(self, logs_dir: str | Path, kind: str, started: datetime | None = None) -> None:
        if not _KIND_RE.fullmatch(kind):
            raise ValueError(f"log kind must be a lowercase word like 'sft', 'dpo' or 'grpo', got {kind!r}")
        self.kind = kind
        self.started = (started or datetime.now()).replace(microsecond=0)
        logs_dir = Path(logs_dir)
        logs_dir.mkdir(parents=True, exist_ok=True)
        self.path = logs_dir / log_filename(kind, self.started)
        n = 1
        while True:
            try:
                self._f = self.path.open("x", encoding="utf-8")
                break
            except FileExistsError:
                n += 1
                self.path = self.path.with_name(f"{log_filename(kind, self.started)[:-4]}_{n}.txt")
        self._f.write(f"=== {kind.upper()} Training Logs ===\n"
                      f"Started at: {self.started.strftime(TIME_FORMAT)}\n{HEADER_RULE}\n\n")
        self._f.flush()

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        values = {str(k): v for k, v in ((k, _scalar(v)) for k, v in metrics.items()) if v is not _SKIP}
        self._f.write(f"Step {int(step)}: {json.dumps(values, indent=2)}\n{STEP_RULE}\n")
        self._f.flush()

    def close(self) -> None:
        if not self._f.closed:
            self._f.close()

    def __enter__(self) -> TextLogLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_text_log(path: str | Path) -> tuple[dict[str, Any], list[tuple[int, dict[str, Any]]]]:
    """Parse a text log: ``({"title", "kind", "started"}, [(step, metrics), ...])``.

    ``kind`` is the lower-cased title word (``"grpo"``); ``started`` a
    datetime. Raises ``DatasetError`` naming ``path:line`` on a malformed file.
    """
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")

    def fail(lineno: int, what: str) -> DatasetError:
        return DatasetError(f"{path}:{lineno}: {what}")

    head = lines[:4] + [""] * (4 - len(lines[:4]))
    title = _TITLE_RE.fullmatch(head[0])
    if title is None:
        raise fail(1, f"expected '=== <KIND> Training Logs ===', got {head[0]!r}")
    if not head[1].startswith("Started at: "):
        raise fail(2, f"expected 'Started at: YYYY-mm-dd HH:MM:SS', got {head[1]!r}")
    try:
        started = datetime.strptime(head[1][len("Started at: "):], TIME_FORMAT)
    except ValueError:
        raise fail(2, f"bad start time {head[1]!r}") from None
    if head[2] != HEADER_RULE:
        raise fail(3, "expected a line of 50 '='")
    if head[3] != "":
        raise fail(4, "expected a blank line after the header")
    info = {"title": f"{title.group(1)} Training Logs", "kind": title.group(1).lower(), "started": started}

    steps: list[tuple[int, dict[str, Any]]] = []
    i = 4
    while i < len(lines):
        if lines[i] == "" and all(ln == "" for ln in lines[i:]):
            break  # trailing newline(s)
        m = _STEP_RE.fullmatch(lines[i])
        if m is None:
            raise fail(i + 1, f"expected 'Step N: {{', got {lines[i]!r}")
        start, body = i, [m.group(2)]
        i += 1
        while i < len(lines) and lines[i] != STEP_RULE:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise fail(start + 1, "step block not closed by a line of 30 '-'")
        try:
            metrics = json.loads("\n".join(body))
        except json.JSONDecodeError as e:
            raise fail(start + 1 + e.lineno - 1, f"invalid JSON in step block: {e.msg}") from None
        if not isinstance(metrics, dict):
            raise fail(start + 1, "step metrics are not a JSON object")
        steps.append((int(m.group(1)), metrics))
        i += 1
    return info, steps

