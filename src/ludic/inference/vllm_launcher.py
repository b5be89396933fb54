"""Start and stop the bundled vLLM server (``python -m ludic.inference.vllm_server``) as a subprocess.

Serving only: recipes choose backends and publishers in ``ludic.recipes.backends``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from ludic.inference.wire import TOKEN_ENV

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ServerProcess:
    """An HTTP server as a subprocess in its own process group: started, waited for until ``health``
    answers 200 (or the process exits), stopped with its whole group. ``env`` is the child's
    environment (a copy of this process's, to edit before ``start``)."""

    name = "server"
    slug = "server"
    """In the default log path, /tmp/ludic-<slug>-<port>.log."""
    health = "/health"

    def __init__(self, cmd: list[str], port: int, log_path: str | Path | None = None) -> None:
        self.cmd, self.port = cmd, port
        self.env = dict(os.environ)
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/ludic-{self.slug}-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> "ServerProcess":
        import httpx

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                     env=self.env)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_path.read_text()[-3000:])
            try:
                if httpx.get(self.url + self.health, timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"{self.name} not healthy after {timeout_s}s; log: {self.log_path}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        pgid = os.getpgid(self.proc.pid)
        os.killpg(pgid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(pgid, signal.SIGKILL)
            self.proc.wait(10)
        try:  # stragglers (engine core, worker) in the same group
            os.killpg(pgid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class VLLMServerProcess(ServerProcess):
    """``python -m ludic.inference.vllm_server`` as a subprocess in its own process group.

    Args:
        model: model folder or name (resolved like everywhere else in Ludic).
        port: 0 picks a free port.
        extra_args: more server flags (vLLM's or Ludic's), e.g. ``["--enable-lora"]``.
        dtype: "auto" is float32 on CPUs without native bf16 (vLLM is ~5x faster there in fp32).
        allowed_dirs: folders the server may load adapters / weights from (where this run's
            publisher writes them); passed as ``--allowed-weight-dirs``.
        token: bearer token, passed in the child's environment (``$LUDIC_SERVER_TOKEN``), never
            on its command line; None leaves this process's environment as it is.
    """

    name = "vLLM server"
    slug = "vllm"

    def __init__(
        self,
        model: str,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        dtype: str = "auto",
        extra_args: list[str] | None = None,
        token: str | None = None,
        log_path: str | Path | None = None,
        max_model_len: int = 2048,
        allowed_dirs: list[str | Path] | None = None,
    ) -> None:
        from ludic.inference.models import resolve_dtype, resolve_model

        port = port or free_port()
        cmd = [
            sys.executable, "-m", "ludic.inference.vllm_server", "--model", resolve_model(model),
            "--host", host, "--port", str(port), "--enforce-eager", "--dtype", resolve_dtype(dtype),
            "--max-model-len", str(max_model_len), "--uvicorn-log-level", "warning", *(extra_args or []),
        ]
        for d in allowed_dirs or ():
            cmd += ["--allowed-weight-dirs", str(Path(d).resolve())]
        super().__init__(cmd, port, log_path)
        if token:
            self.env[TOKEN_ENV] = token

