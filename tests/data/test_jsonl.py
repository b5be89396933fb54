"""Generic JSONL reader/writer: round trip, atomic write, file:line errors."""

from __future__ import annotations

import json

import pytest

from ludic.data.jsonl import DatasetError, read_jsonl, write_jsonl

SCHEMA = {"prompt": str, "score": (int, float)}


def test_round_trip_creates_parents_and_keeps_unicode(tmp_path):
    path = tmp_path / "a" / "b" / "data.jsonl"
    records = [{"prompt": "héllo ✓", "score": 1}, {"prompt": "x", "score": 0.5, "extra": [1, 2]}]
    assert write_jsonl(path, records) == path
    assert read_jsonl(path, SCHEMA) == records
    assert "héllo ✓" in path.read_text(encoding="utf-8")
    assert path.read_text().count("\n") == 2
    assert [p.name for p in path.parent.iterdir()] == ["data.jsonl"]  # no temp file left behind


def test_write_is_atomic_on_failure(tmp_path):
    path = tmp_path / "data.jsonl"
    write_jsonl(path, [{"prompt": "old", "score": 1}])

    def records():
        yield {"prompt": "new", "score": 2}
        raise RuntimeError("generator broke")

    with pytest.raises(RuntimeError):
        write_jsonl(path, records())
    assert read_jsonl(path) == [{"prompt": "old", "score": 1}]  # old file intact
    assert [p.name for p in tmp_path.iterdir()] == ["data.jsonl"]


def test_blank_lines_are_skipped_and_line_numbers_count_them(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "a", "score": 1}\n\n   \n{"prompt": 3, "score": 1}\n')
    with pytest.raises(DatasetError, match=r"d\.jsonl:4: field 'prompt': expected str, got int"):
        read_jsonl(path, SCHEMA)
    path.write_text('{"prompt": "a", "score": 1}\n\n')
    assert len(read_jsonl(path, SCHEMA)) == 1


@pytest.mark.parametrize(
    "line, message",
    [
        ('{"prompt": "a", "score": ', r"invalid JSON"),
        ('["prompt", "a"]', r"expected a JSON object, got list"),
        ('{"score": 1}', r"missing field 'prompt'"),
        ('{"prompt": "a", "score": "high"}', r"field 'score': expected int or float, got str"),
        ('{"prompt": "a", "score": true}', r"field 'score': expected int or float, got bool"),
        ('{"prompt": "", "score": 1}', r"prompt is empty"),
    ],
)
def test_each_problem_names_file_line_and_field(tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "ok", "score": 1}) + "\n" + line + "\n")

    def validate(record):
        return "prompt is empty" if record["prompt"] == "" else None

    with pytest.raises(DatasetError, match=rf"^{path}:2: {message}") as e:
        read_jsonl(path, SCHEMA, validate=validate)
    assert isinstance(e.value, ValueError)


def test_missing_file_is_a_dataset_error(tmp_path):
    with pytest.raises(DatasetError, match=r"nope\.jsonl: cannot read"):
        read_jsonl(tmp_path / "nope.jsonl")
