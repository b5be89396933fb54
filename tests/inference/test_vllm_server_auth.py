"""The server's allowed weight roots (pure path logic; the routes are tested on a real server in
tests/integration/test_vllm.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from ludic.inference.vllm_server.auth import AllowedDirs, PathNotAllowed


def test_allowed_dirs_resolve_before_checking(tmp_path: Path) -> None:
    root, sibling = tmp_path / "runs", tmp_path / "runs-other"
    (root / "a" / "v1").mkdir(parents=True)
    sibling.mkdir()
    (root / "escape").symlink_to(sibling)
    allowed = AllowedDirs([root, tmp_path / "uploads"])
    assert allowed.check(root / "a" / "v1") == (root / "a" / "v1").resolve()
    assert allowed.check(root / "not-yet-written") == (root / "not-yet-written").resolve()
    for bad in (sibling, f"{root}/../runs-other", root / "escape", root / "a" / ".." / ".." / "runs-other", "/etc"):
        with pytest.raises(PathNotAllowed) as e:
            allowed.check(bad)
        assert str(bad) in str(e.value) and str(root) in str(e.value) and "--allowed-weight-dirs" in str(e.value)
