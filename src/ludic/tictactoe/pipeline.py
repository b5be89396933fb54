"""Pipeline RL for tic-tac-toe: ``ludic actor tictactoe``, ``ludic learner tictactoe`` (the generic
commands of ``ludic.recipes.pipeline`` on tic-tac-toe's parts) and the local topology ``ludic train
tictactoe --pipeline N`` (a redis-server, N actor processes, this process as the learner).

Actors sample in process (``--inference transformers``: weights come through Redis) or from a vLLM server
(``--inference vllm --port P``: the learner pushes each version to the server, which swaps it in while
requests run; tokens carry the server's version). Same flags as ``ludic train tictactoe``; the actors and
the learner of one run must get the same model, prompt and GRPO flags, and the same --redis-url and
--stream-prefix.

    ludic learner tictactoe --redis-url redis://10.0.0.1:6379/0 --run-dir runs/p1 --train-steps 100
    ludic actor tictactoe   --redis-url redis://10.0.0.1:6379/0 --run-dir runs/p1-actor-a --actor-id a
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from ludic.recipes import pipeline
from ludic.recipes.pipeline import PipelineParts
from ludic.tictactoe.train import TrainTicTacToeConfig, load_train_policy, rollout_source, trainer_config


TICTACTOE = PipelineParts(
    name="tictactoe", load=load_train_policy,
    source=lambda cfg, engine, model, tok, run_dir: rollout_source(cfg, engine, model, tok, run_dir)[0],
    trainer_config=trainer_config, episodes_per_step=lambda cfg: cfg.rollouts_per_update,
)
"""Tic-tac-toe's part in the generic pipeline commands (``ludic.recipes.pipeline``)."""


def run_actor(cfg: TrainTicTacToeConfig) -> int:
    """Roll out and push until ``cfg.actor_batches`` batches are pushed (or forever)."""
    return pipeline.run_actor(cfg, TICTACTOE)


def run_learner(cfg: TrainTicTacToeConfig, health_fn: Any = None) -> dict[str, Any]:
    return pipeline.run_learner(cfg, TICTACTOE, health_fn)


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
    run_dir = cfg.resolve_run_dir(
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
            thread = ActorThread(lambda: pipeline.actor_loop(actor_cfg, TICTACTOE)).start()
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
