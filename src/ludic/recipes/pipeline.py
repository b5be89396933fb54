"""The pipeline commands of any recipe: ``ludic actor <recipe>`` rolls out and pushes samples to Redis,
``ludic learner <recipe>`` trains on them and announces each new policy version.

A recipe takes part by describing itself as ``PipelineParts``: how it loads the policy, how it builds its
rollout source (the same ``RolloutBatchSource`` its synchronous ``ludic train`` uses), its trainer config
and how many episodes make one step. The actors and the learner of one run get the same flags (model,
env or game, GRPO settings) and the same ``--redis-url`` and ``--stream-prefix``::

    ludic learner env --env reasoning_gym:chain_sum --redis-url redis://10.0.0.1:6379/0 --run-dir runs/l
    ludic actor env   --env reasoning_gym:chain_sum --redis-url redis://10.0.0.1:6379/0 --run-dir runs/a1

Each actor draws its own env and sampling seeds: its seed is derived from ``--seed`` and its actor id
(``actor_seed``; the id defaults to ``actor-<n>``, numbered in Redis as actors start), so actors started
alike never push the same episodes. Give ``--actor-id`` (and ``--seed``) for an actor whose draws repeat
when it is started again.

Actors sample in process (``--inference transformers``: weights come through Redis) or, where the recipe
has an inference block, from a vLLM server (``--inference vllm --port P``: the learner pushes each version
to the server, and tokens carry the server's version).
"""

from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any, Callable


@dataclass
class PipelineParts:
    """What the generic actor and learner need from a recipe."""

    name: str
    """Names the default run directories (runs/<name>-actor-<time>, runs/<name>-learner-<time>)."""
    load: Callable[[Any], tuple[Any, Any]]
    """cfg -> (model, tokenizer): the policy to train, as the recipe's ``ludic train`` loads it."""
    source: Callable[[Any, Any, Any, Any, Path], Any]
    """(cfg, engine, model or None, tokenizer, run_dir) -> the recipe's RolloutBatchSource on ``engine``."""
    trainer_config: Callable[[Any], Any]
    """cfg -> the TrainerConfig of a step (schedule length and normaliser filled in)."""
    episodes_per_step: Callable[[Any], int]
    """cfg -> episodes in one learner batch (one optimizer step)."""


def server_url(cfg: Any) -> str:
    if cfg.inference not in ("transformers", "vllm"):
        raise ValueError(f"unknown inference backend {cfg.inference!r}: use transformers or vllm")
    if not cfg.port:
        raise ValueError("a pipeline actor or learner with --inference vllm needs the server's --port "
                         "(ludic train tictactoe --pipeline N --inference vllm starts one)")
    return f"http://{cfg.host}:{cfg.port}"


def streams_of(cfg: Any) -> Any:
    from ludic.pipeline.streams import PipelineStreams

    if not cfg.redis_url:
        raise ValueError("--redis-url is required (e.g. redis://127.0.0.1:6379/0)")
    return PipelineStreams(cfg.redis_url, prefix=cfg.stream_prefix)


def actor_seed(seed: int, actor_id: str) -> int:
    """The seed of actor ``actor_id`` in a run started with ``--seed seed`` (its training seeds and its GRPO
    request strategy): 31 bits of SHA-256 of both, the same on every host and Python, different per actor."""
    digest = hashlib.sha256(f"{int(seed)}:{actor_id}".encode()).digest()
    return int.from_bytes(digest[:4], "little") & 0x7FFFFFFF


def run_actor(cfg: Any, parts: PipelineParts) -> int:
    """Roll out and push until ``cfg.actor_batches`` batches are pushed (or forever); returns the items pushed."""
    return asyncio.run(actor_loop(cfg, parts))


async def actor_loop(cfg: Any, parts: PipelineParts) -> int:
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.pipeline.actor import Actor

    run_dir = cfg.resolve_run_dir(f"{parts.name}-actor", lock=False)  # actors write beside a run, never own it
    run_dir.mkdir(parents=True, exist_ok=True)
    if getattr(cfg, "inference", "transformers") == "vllm":  # the learner pushes weights to the server
        from ludic.inference.models import load_tokenizer
        from ludic.inference.vllm_client import VLLMChatClient

        model, tok = None, load_tokenizer(cfg.model)
        engine: Any = VLLMChatClient(server_url(cfg), tokenizer=tok)
    else:
        model, tok = parts.load(cfg)
        engine = TransformersEngine(model, tok)
    streams = streams_of(cfg)
    actor_id = cfg.actor_id or streams.new_actor_id()
    seed = actor_seed(cfg.seed, actor_id)  # not --seed itself: actors started alike must not play the same episodes
    print(f"[actor {actor_id}] seed {seed} (from --seed {cfg.seed} and the actor id)", flush=True)
    source = parts.source(replace(cfg, seed=seed), engine, model, tok, run_dir)
    actor = Actor(streams, source, engine, model=model, max_unread=cfg.max_unread, actor_id=actor_id,
                  log_path=run_dir / f"actor-{actor_id}.jsonl")
    pushed = await actor.run(cfg.actor_batches or None)
    print(f"[actor {actor_id}] pushed {pushed} items", flush=True)
    return pushed


def run_learner(cfg: Any, parts: PipelineParts, health_fn: Any = None) -> dict[str, Any]:
    """Train ``cfg.train_steps`` steps on the actors' samples; returns the last step's metrics."""
    return asyncio.run(_run_learner(cfg, parts, health_fn))


async def _run_learner(cfg: Any, parts: PipelineParts, health_fn: Any = None) -> dict[str, Any]:
    from ludic.config import dump_config
    from ludic.pipeline.actor import make_learner
    from ludic.training.algorithms import algorithm_for
    from ludic.training.loggers import make_logger

    run_dir = cfg.resolve_run_dir(f"{parts.name}-learner")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    model, tok = parts.load(cfg)
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    inner = None
    if getattr(cfg, "inference", "transformers") == "vllm":  # push to the server, then announce
        from ludic.inference.vllm_publish import VLLMAdapterPublisher, VLLMFullWeightsPublisher

        url = server_url(cfg)
        inner = (VLLMFullWeightsPublisher([url], run_dir / "server_weights") if cfg.full_finetune
                 else VLLMAdapterPublisher([url], run_dir / "server_adapters"))
    trainer = make_learner(model, tok, algorithm_for(cfg), parts.trainer_config(cfg), streams_of(cfg), run_dir,
                           batch_size=parts.episodes_per_step(cfg), logger=logger,
                           timeout_s=cfg.batch_timeout_s or None, inner_publisher=inner, health_fn=health_fn)
    if cfg.resume and trainer.resume():
        print(f"[learner] resumed from step {trainer.step} in {run_dir}", flush=True)
    try:
        last = await trainer.train(cfg.train_steps)
        if cfg.final_save:
            trainer.save()
    finally:
        logger.close()
    return {**last, "step": trainer.step, "totals": dict(trainer.source.totals)}
