"""Choosing an inference backend for a run: in-process transformers or vLLM.

``make_inference`` returns the client the agents call and the publisher the
trainer calls after each optimizer step, so recipes do not care which
backend serves the policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Awaitable, Callable

from ludic.inference.client import ChatClient


class EnginePublisher:
    """In-process publisher: the engine shares the trainer's weights, so publishing = a version bump."""

    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def publish(self, model: Any, version: int) -> dict[str, float]:
        self.engine.policy_version = version
        return {"latency_s": 0.0}


@dataclass
class Inference:
    client: ChatClient
    publisher: Any
    close: Callable[[], Awaitable[None]]


async def _noop() -> None:
    return None


async def make_inference(
    kind: str, model: Any, tokenizer: Any, model_name: str, run_dir: Path, *, host: str = "127.0.0.1", port: int = 0
) -> Inference:
    """Backend for a training run on ``model`` (which the trainer updates)."""
    if kind == "transformers":
        from ludic.inference.transformers_engine import TransformersEngine

        engine = TransformersEngine(model, tokenizer)
        return Inference(engine, EnginePublisher(engine), _noop)
    if kind == "vllm":
        from ludic.inference.vllm_backend import make_vllm_training_inference

        return await make_vllm_training_inference(model, tokenizer, model_name, run_dir, host=host, port=port)
    raise ValueError(f"unknown inference backend {kind!r}: use transformers or vllm")


async def make_eval_client(cfg: Any) -> tuple[ChatClient, Callable[[], Awaitable[None]]]:
    """Client for evaluation: a local model (+ adapter) or a vLLM server."""
    if cfg.inference == "transformers":
        from ludic.inference.transformers_engine import TransformersEngine
        from ludic.training.lora import load_policy

        model, tok = load_policy(cfg.model, adapter=cfg.adapter, dtype=cfg.dtype, seed=cfg.seed)
        model.eval()
        return TransformersEngine(model, tok), _noop
    if cfg.inference == "vllm":
        from ludic.inference.vllm_backend import make_vllm_eval_client

        return await make_vllm_eval_client(cfg)
    raise ValueError(f"unknown inference backend {cfg.inference!r}: use transformers or vllm")
