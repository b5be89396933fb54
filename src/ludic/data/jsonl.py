"""JSON Lines datasets: a validating reader and an atomic writer.

``read_jsonl`` checks every line and raises ``DatasetError`` naming
``path:line``, the field and what is wrong, so a broken line in a dataset
of thousands is found at once::

    read_jsonl("train.jsonl", {"prompt": str, "completion": str})
    # DatasetError: train.jsonl:17: field 'prompt': expected str, got int

``schema`` maps required field names to a type or tuple of types (extra
fields are allowed); ``validate`` is an optional per-record check returning
an error message (or None when the record is fine). Blank lines are skipped.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping

Schema = Mapping[str, "type | tuple[type, ...]"]


class DatasetError(ValueError):
    """A dataset file (or one of its lines) is malformed; the message names ``path:line``."""


def _type_name(t: type | tuple[type, ...]) -> str:
    if isinstance(t, tuple):
        return " or ".join(x.__name__ for x in t)
    return t.__name__


def _type_ok(value: Any, t: type | tuple[type, ...]) -> bool:
    types = t if isinstance(t, tuple) else (t,)
    # bool is an int subclass; only accept it where bool is asked for explicitly.
    if isinstance(value, bool) and bool not in types:
        return False
    return isinstance(value, types)


def check_record(record: Any, schema: Schema | None = None) -> str | None:
    """The first problem of a parsed line against ``schema`` (None when fine)."""
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    for field, t in (schema or {}).items():
        if field not in record:
            return f"missing field {field!r}"
        if not _type_ok(record[field], t):
            return f"field {field!r}: expected {_type_name(t)}, got {type(record[field]).__name__}"
    return None


def read_jsonl(
    path: str | os.PathLike[str],
    schema: Schema | None = None,
    *,
    validate: Callable[[dict], str | None] | None = None,
) -> list[dict]:
    """All records of a JSONL file, each checked against ``schema`` and ``validate``.

    Raises ``DatasetError`` ``"<path>:<line>: <problem>"`` at the first bad
    line (invalid JSON, not an object, missing field, wrong type, or the
    validator's message), or ``"<path>: <problem>"`` if the file can't be read.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise DatasetError(f"{path}: cannot read: {e}") from e
    records = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            raise DatasetError(f"{path}:{lineno}: invalid JSON: {e.msg} (column {e.colno})") from None
        problem = check_record(record, schema)
        if problem is None and validate is not None:
            problem = validate(record)
        if problem is not None:
            raise DatasetError(f"{path}:{lineno}: {problem}")
        records.append(record)
    return records


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def write_jsonl(path: str | os.PathLike[str], records: Iterable[Mapping[str, Any]]) -> Path:
    """Write one JSON object per line (UTF-8, non-ASCII kept); returns the path.

    Parent directories are created; the file is written to a temporary file
    in the same directory and renamed into place, so readers never see a
    half-written dataset.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            for record in records:
                f.write(json.dumps(record, ensure_ascii=False) + "\n")
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; give the usual mode
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    return path
