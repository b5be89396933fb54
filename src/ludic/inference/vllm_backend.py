"""Running recipes on vLLM: start/stop the bundled server, build client + publisher.

    ludic train tictactoe --inference vllm              starts a server for the run
    ludic train tictactoe --inference vllm --port 8000  uses a running server
    ludic eval tictactoe --inference vllm --start-server
    ludic eval tictactoe --inference vllm --model ttt_rl   (adapter served with --lora-modules ttt_rl=<dir>)

Training with LoRA publishes the adapter after every optimizer step
(``VLLMAdapterPublisher``: save to ``<run_dir>/adapters/v<N>``, then
``/ludic/load_adapter``); full fine-tuning pushes merged weights by path.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Awaitable, Callable

from ludic.inference.client import ChatClient

STARTUP_TIMEOUT_S = 300


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class VLLMServerProcess:
    """``python -m ludic.inference.vllm_server`` as a subprocess in its own process group.

    Args:
        model: model folder or name (resolved like everywhere else in Ludic).
        port: 0 picks a free port.
        extra_args: more server flags (vLLM's or Ludic's), e.g. ``["--enable-lora"]``.
        dtype: "auto" is float32 on CPUs without native bf16 (vLLM is ~5x faster there in fp32).
    """

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
    ) -> None:
        from ludic.inference.models import resolve_dtype, resolve_model

        self.port = port or free_port()
        self.cmd = [
            sys.executable, "-m", "ludic.inference.vllm_server", "--model", resolve_model(model),
            "--host", host, "--port", str(self.port), "--enforce-eager", "--dtype", resolve_dtype(dtype),
            "--max-model-len", str(max_model_len), "--uvicorn-log-level", "warning", *(extra_args or []),
        ]
        if token:
            self.cmd += ["--ludic-token", token]
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(log_path) if log_path else Path(f"/tmp/ludic-vllm-{self.port}.log")
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = STARTUP_TIMEOUT_S) -> "VLLMServerProcess":
        import httpx

        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vLLM server exited with {self.proc.returncode}; log {self.log_path}:\n"
                                   + self.log_path.read_text()[-3000:])
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(1)
        self.stop()
        raise TimeoutError(f"vLLM server not healthy after {timeout_s}s; log: {self.log_path}")

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


async def make_vllm_training_inference(
    model: Any, tokenizer: Any, model_name: str, run_dir: Path, *, host: str = "127.0.0.1", port: int = 0
) -> Any:
    """Client + publisher for training on a vLLM server (started here when ``port`` is 0)."""
    from ludic.inference.backends import Inference
    from ludic.inference.publish import VLLMAdapterPublisher, VLLMFullWeightsPublisher
    from ludic.inference.vllm_client import VLLMChatClient

    peft = hasattr(model, "peft_config")
    server = None
    if not port:
        rank = max(cfg.r for cfg in model.peft_config.values()) if peft else 16
        server = VLLMServerProcess(
            model_name, extra_args=["--enable-lora", "--max-lora-rank", str(max(rank, 8))],
            log_path=run_dir / "vllm_server.log",
        ).start()
        url = server.url
    else:
        url = f"http://{host}:{port}"
    client = VLLMChatClient(url, tokenizer=tokenizer)
    if peft:
        publisher: Any = VLLMAdapterPublisher([url], run_dir / "adapters")
    else:
        publisher = VLLMFullWeightsPublisher([url], run_dir / "weights")

    async def close() -> None:
        await client.aclose()
        if server is not None:
            server.stop()

    return Inference(client, publisher, close)


async def make_vllm_eval_client(cfg: Any) -> tuple[ChatClient, Callable[[], Awaitable[None]]]:
    """Client for evaluation against a vLLM server (``cfg.start_server`` starts one)."""
    from ludic.inference.models import PACKAGED_ALIASES, load_tokenizer
    from ludic.inference.vllm_client import VLLMChatClient

    server = None
    served_name: str | None = None
    if cfg.start_server:
        extra: list[str] = []
        if cfg.adapter:
            served_name = "ludic_adapter"
            extra = ["--enable-lora", "--max-lora-rank", "64", "--lora-modules", f"{served_name}={cfg.adapter}"]
        server = VLLMServerProcess(cfg.model, port=0, dtype=cfg.dtype, extra_args=extra).start()
        url = server.url
    else:
        url = f"http://{cfg.host}:{cfg.port}"
        # a served adapter name (e.g. ttt_rl from --lora-modules) is requested as given;
        # model folders and the packaged default follow the server's current policy
        served_name = None if cfg.model in PACKAGED_ALIASES or Path(cfg.model).exists() else cfg.model
    try:
        tokenizer = load_tokenizer(cfg.model)
    except Exception:  # a served adapter name: the server renders the chat template
        tokenizer = None
    client = VLLMChatClient(url, tokenizer=tokenizer, model=served_name)

    async def close() -> None:
        await client.aclose()
        if server is not None:
            server.stop()

    return client, close
