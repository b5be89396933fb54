"""Choosing an inference backend for a recipe: in-process transformers or vLLM.

``make_inference`` returns the client the agents call and the publisher the
trainer calls after each optimizer step, so recipes do not care which
backend serves the policy. This is recipe wiring: it lives here, not in
``ludic.inference``, so serving code never imports training code.

    ludic train tictactoe --inference vllm              starts a server for the run
    ludic train tictactoe --inference vllm --port 8000  uses a running server, which must have been
                                                        started with --allowed-weight-dirs covering the
                                                        run directory (pushes are folders there)
    ludic eval tictactoe --inference vllm --start-server
    ludic eval tictactoe --inference vllm --model ttt_rl   (adapter served with --lora-modules ttt_rl=<dir>)

Training with LoRA publishes the adapter after every optimizer step
(``VLLMAdapterPublisher``: save to ``<run_dir>/adapters/v<N>``, then
``/ludic/load_adapter``); full fine-tuning pushes merged weights by path.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from ludic.inference.client import ChatClient


@dataclass
class Inference:
    """What a recipe needs from a backend."""

    client: ChatClient
    """What agents call."""
    publisher: Any
    """What the trainer calls after an optimizer step (``publish(model, version)``)."""
    close: Callable[[], Awaitable[None]]
    """Stops what the backend started (servers, HTTP sessions)."""


async def _noop() -> None:
    return None


def in_process(engine: Any) -> Inference:
    """An in-process engine (TransformersEngine sharing the trainer's model, or VLLMEngineClient)."""
    from ludic.inference.publish import InProcessPublisher

    return Inference(engine, InProcessPublisher(engine), _noop)


async def make_inference(
    kind: str, model: Any, tokenizer: Any, model_name: str, run_dir: Path, *, host: str = "127.0.0.1", port: int = 0,
    dtype: str = "auto",
) -> Inference:
    """Backend for a training run on ``model`` (which the trainer updates); ``model_name`` is what a
    started vLLM server serves (the base weights under the LoRA)."""
    from ludic.distributed import is_sharded

    if is_sharded(model) and kind != "vllm":
        raise ValueError(f"a sharded (FSDP2) policy samples on a vLLM server: use --inference vllm, not {kind!r}")
    if kind == "transformers":
        from ludic.inference.transformers_engine import TransformersEngine

        return in_process(TransformersEngine(model, tokenizer))
    if kind == "vllm":
        return await make_vllm_training_inference(model, tokenizer, model_name, run_dir, host=host, port=port,
                                                  dtype=dtype)
    raise ValueError(f"unknown inference backend {kind!r}: use transformers or vllm")


async def make_eval_client(cfg: Any) -> tuple[ChatClient, Callable[[], Awaitable[None]]]:
    """Client for evaluation: a local model (+ adapter) or a vLLM server."""
    if cfg.inference == "transformers":
        from ludic.inference.transformers_engine import TransformersEngine
        from ludic.recipes.blocks import load_policy_for

        model, tok = load_policy_for(cfg)
        model.eval()
        return TransformersEngine(model, tok), _noop
    if cfg.inference == "vllm":
        return await make_vllm_eval_client(cfg)
    raise ValueError(f"unknown inference backend {cfg.inference!r}: use transformers or vllm")


async def make_vllm_training_inference(
    model: Any, tokenizer: Any, model_name: str, run_dir: Path, *, host: str = "127.0.0.1", port: int = 0,
    dtype: str = "auto",
) -> Any:
    """Client + publisher for training on a vLLM server (started here when ``port`` is 0).

    A model sharded by FSDP2 (every rank of the run calls this): one server, started by rank 0 and its
    URL broadcast, every rank sampling its own share of the rollouts from it, and a
    ``GatheringPublisher``: all ranks join the gather, rank 0 pushes the merged full weights (by path on
    one machine, NCCL on GPUs with ``transport="nccl"``)."""
    from ludic.distributed import broadcast_object, is_rank0
    from ludic.inference.vllm_publish import VLLMAdapterPublisher, VLLMFullWeightsPublisher
    from ludic.inference.vllm_client import VLLMChatClient
    from ludic.inference.vllm_launcher import VLLMServerProcess
    from ludic.distributed import is_sharded
    from ludic.training.fsdp import GatheringPublisher

    sharded = is_sharded(model)
    peft = hasattr(model, "peft_config") and not sharded  # a sharded LoRA is published merged
    server = None
    if not port and (is_rank0() or not sharded):
        rank = max(cfg.r for cfg in model.peft_config.values()) if peft else 16
        lora = [] if sharded else ["--enable-lora", "--max-lora-rank", str(max(rank, 8))]
        server = VLLMServerProcess(model_name, extra_args=lora, log_path=run_dir / "vllm_server.log", dtype=dtype,
                                   allowed_dirs=[run_dir]).start()
    url = server.url if server is not None else f"http://{host}:{port}" if port else None
    if sharded:
        url = broadcast_object(url)
    client = VLLMChatClient(url, tokenizer=tokenizer)
    if peft:
        publisher: Any = VLLMAdapterPublisher([url], run_dir / "adapters")
    elif sharded:
        publisher = GatheringPublisher(VLLMFullWeightsPublisher([url], run_dir / "weights"))
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
    from ludic.inference.vllm_launcher import VLLMServerProcess

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
