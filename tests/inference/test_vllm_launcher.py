"""VLLMServerProcess builds the server's command line and environment (no server is started)."""

from __future__ import annotations

from ludic.inference.vllm_launcher import VLLMServerProcess
from ludic.inference.wire import TOKEN_ENV


def test_token_travels_in_the_environment_not_the_command_line(packaged_dir) -> None:
    srv = VLLMServerProcess(str(packaged_dir), token="s3cret-token")
    assert not any("s3cret-token" in a for a in srv.cmd), srv.cmd
    assert srv.env[TOKEN_ENV] == "s3cret-token"
