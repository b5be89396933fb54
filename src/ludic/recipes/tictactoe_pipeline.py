"""Pipeline RL for tic-tac-toe: ``ludic actor tictactoe``, ``ludic learner tictactoe`` and the
local topology ``ludic train tictactoe --pipeline N`` (a redis-server, N actor processes, this
process as the learner). Actors sample in process (``--inference transformers``: weights come
through Redis) or from a vLLM server (``--inference vllm --port P``: the learner pushes each
version to the server, which swaps it in while requests run; tokens carry the server's version). Same flags as ``ludic train tictactoe``; the actors and the learner of
one run must get the same model, prompt and GRPO flags, and the same --redis-url and --stream-prefix.

    ludic learner tictactoe --redis-url redis://10.0.0.1:6379/0 --run-dir runs/p1 --train-steps 100
    ludic actor tictactoe   --redis-url redis://10.0.0.1:6379/0 --run-dir runs/p1-actor-a --actor-id a
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path
from typing import Any

from ludic.recipes.tictactoe import TrainTicTacToeConfig, load_train_policy, rollout_source, trainer_config
from ludic.recipes.common import default_run_dir


def _server_url(cfg: TrainTicTacToeConfig) -> str:
    if cfg.inference not in ("transformers", "vllm"):
        raise ValueError(f"unknown inference backend {cfg.inference!r}: use transformers or vllm")
    if not cfg.port:
        raise ValueError("a pipeline actor or learner with --inference vllm needs the server's --port "
                         "(ludic train tictactoe --pipeline N --inference vllm starts one)")
    return f"http://{cfg.host}:{cfg.port}"


def _streams(cfg: TrainTicTacToeConfig) -> Any:
    from ludic.pipeline.streams import PipelineStreams

    if not cfg.redis_url:
        raise ValueError("--redis-url is required (e.g. redis://127.0.0.1:6379/0)")
    return PipelineStreams(cfg.redis_url, prefix=cfg.stream_prefix)


def run_actor(cfg: TrainTicTacToeConfig) -> int:
    """Roll out and push until ``cfg.actor_batches`` batches are pushed (or forever)."""
    return asyncio.run(_run_actor(cfg))


async def _run_actor(cfg: TrainTicTacToeConfig) -> int:
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.pipeline.actor import Actor

    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir("tictactoe-actor")
    run_dir.mkdir(parents=True, exist_ok=True)
    if cfg.inference == "vllm":  # the learner pushes weights to the server; tokens carry its version
        from ludic.inference.models import load_tokenizer
        from ludic.inference.vllm_client import VLLMChatClient

        model, tok = None, load_tokenizer(cfg.model)
        engine: Any = VLLMChatClient(_server_url(cfg), tokenizer=tok)
    else:
        model, tok = load_train_policy(cfg)
        engine = TransformersEngine(model, tok)
    source, _, _ = rollout_source(cfg, engine, model, tok, run_dir)
    actor_id = cfg.actor_id or f"actor-{os.getpid()}"
    actor = Actor(_streams(cfg), source, engine, model=model, max_unread=cfg.max_unread, actor_id=actor_id,
                  log_path=run_dir / f"actor-{actor_id}.jsonl")
    pushed = await actor.run(cfg.actor_batches or None)
    print(f"[actor {actor_id}] pushed {pushed} items", flush=True)
    return pushed


def run_learner(cfg: TrainTicTacToeConfig, health_fn: Any = None) -> dict[str, Any]:
    return asyncio.run(_run_learner(cfg, health_fn))


async def _run_learner(cfg: TrainTicTacToeConfig, health_fn: Any = None) -> dict[str, Any]:
    from ludic.config import dump_config
    from ludic.pipeline.actor import make_learner
    from ludic.training.algorithms import algorithm_for
    from ludic.training.loggers import make_logger

    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir("tictactoe-learner")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    model, tok = load_train_policy(cfg)
    algo = algorithm_for(cfg)
    tcfg = trainer_config(cfg)
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    streams = _streams(cfg)
    inner = None
    if cfg.inference == "vllm":  # push to the server (under its --allowed-weight-dirs), then announce
        from ludic.inference.publish import VLLMAdapterPublisher, VLLMFullWeightsPublisher

        url = _server_url(cfg)
        inner = (VLLMFullWeightsPublisher([url], run_dir / "server_weights") if cfg.full_finetune
                 else VLLMAdapterPublisher([url], run_dir / "server_adapters"))
    trainer = make_learner(model, tok, algo, tcfg, streams, run_dir, batch_size=cfg.rollouts_per_update,
                           logger=logger, timeout_s=cfg.batch_timeout_s or None, inner_publisher=inner,
                           health_fn=health_fn)
    if cfg.resume and trainer.resume():
        print(f"[learner] resumed from step {trainer.step} in {run_dir}", flush=True)
    last: dict[str, Any] = {}

    def keep(step: int, metrics: dict[str, Any]) -> None:
        last.update(metrics)

    try:
        await trainer.train(cfg.train_steps, keep)
        if cfg.final_save:
            trainer.save()
    finally:
        logger.close()
    return {**last, "step": trainer.step, "totals": dict(trainer.source.totals)}


def run_local(cfg: TrainTicTacToeConfig) -> dict[str, Any]:
    """``ludic train tictactoe --pipeline N``: Redis (``cfg.redis_url`` or a local server in
    ``<run_dir>/redis``), N actor processes (logs in ``<run_dir>/actors``), the learner here.
    ``--overlap``: one actor on a thread of this process instead (``ActorThread``), one batch ahead
    of the learner (max_unread 1) and max_lag 1 unless --max-lag says otherwise."""
    from ludic.pipeline.actor import ActorThread
    from ludic.pipeline.redis_server import RedisServer

    if cfg.overlap and cfg.pipeline:
        raise ValueError(f"--overlap runs one actor thread in this process; --pipeline {cfg.pipeline} runs actor "
                         "processes: choose one")
    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(
        f"tictactoe-{'overlap' if cfg.overlap else 'pipeline'}-{cfg.algorithm}")
    cfg = replace(cfg, run_dir=str(run_dir))
    if cfg.overlap and cfg.trainer.max_lag is None:
        cfg = replace(cfg, trainer=replace(cfg.trainer, max_lag=1))
    if cfg.overlap and cfg.inference != "vllm" and (os.cpu_count() or 1) < 4:
        print(f"[ludic] --overlap: the actor thread and the learner share this machine's {os.cpu_count()} cores; "
              "on 2 cores it measured 0.84-0.88x the synchronous loop (benchmarks part g). It pays where "
              "generation has cores or a device of its own.", flush=True)
    server = vllm = None
    if not cfg.redis_url:
        server = RedisServer(run_dir / "redis").start()
        cfg = replace(cfg, redis_url=server.url)
    if cfg.inference == "vllm" and not cfg.port:  # one server for the actors; the learner pushes to it
        from ludic.inference.vllm_launcher import VLLMServerProcess

        vllm = VLLMServerProcess(cfg.model, extra_args=["--enable-lora", "--max-lora-rank", str(max(cfg.lora_rank, 8))],
                                 log_path=run_dir / "vllm_server.log", dtype=cfg.dtype, allowed_dirs=[run_dir]).start()
        cfg = replace(cfg, port=vllm.port)
    actors: list[subprocess.Popen] = []
    thread = None
    try:
        for k in range(cfg.pipeline):
            actors.append(spawn_actor(cfg, f"a{k}", run_dir / "actors" / f"a{k}"))
        if cfg.overlap:
            actor_dir = run_dir / "actors" / "overlap"
            actor_dir.mkdir(parents=True, exist_ok=True)
            actor_cfg = replace(cfg, actor_id="overlap", run_dir=str(actor_dir), overlap=False, logger="none",
                                max_unread=1)  # sample the next batch only once the learner took this one
            thread = ActorThread(lambda: _run_actor(actor_cfg)).start()
        return run_learner(cfg, health_fn=thread.check if thread else None)
    finally:
        if thread is not None:
            thread.stop()
        for p in actors:
            p.terminate()
        for p in actors:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()
        if server is not None:
            server.stop()
        if vllm is not None:
            vllm.stop()


def cli_args(cfg: TrainTicTacToeConfig, **overrides: Any) -> list[str]:
    """Flags that rebuild ``cfg`` (with ``overrides``) through ``parse_config``."""
    from ludic.config import to_argv

    return to_argv(replace(cfg, **overrides))


def spawn_actor(cfg: TrainTicTacToeConfig, actor_id: str, run_dir: Path, *, env: dict[str, str] | None = None,
                batches: int = 0) -> subprocess.Popen:
    """Start ``ludic actor tictactoe`` for this run as a subprocess (output in run_dir/actor.log)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    args = cli_args(cfg, actor_id=actor_id, run_dir=str(run_dir), actor_batches=batches, pipeline=0,
                    logger="none")
    log = open(run_dir / "actor.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "ludic", "actor", "tictactoe", *args], stdout=log,
                            stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})
