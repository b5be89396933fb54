"""Pipeline RL on any environment: ``ludic actor env`` and ``ludic learner env`` take the same environment
spec and GRPO flags as ``ludic train env``, plus the pipeline's (``--redis-url``, ``--stream-prefix``, ...).

    redis-server --port 6379 &
    ludic learner env --env reasoning_gym:chain_sum --redis-url redis://127.0.0.1:6379/0 --run-dir runs/l
    ludic actor env   --env reasoning_gym:chain_sum --redis-url redis://127.0.0.1:6379/0 --run-dir runs/a1
    ludic actor env   --env reasoning_gym:chain_sum --redis-url redis://127.0.0.1:6379/0 --run-dir runs/a2

Each actor samples in process and loads each new policy version the learner announces; each draws its
own training seeds of the env (derived from ``--seed`` and its actor id: ``recipes.pipeline.actor_seed``).
The learner trains ``prompts_per_step x group_size`` episodes a step, checkpoints, resumes, and is the only
process that writes weights. Held-out evaluation and the format cold start belong to ``ludic train env``: run it with
``--train-steps 0`` (or a short ``--format-demos`` run) and pass its adapter to the pipeline.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ludic.errors import UsageError
from ludic.recipes import pipeline
from ludic.recipes.blocks import PipelineBlock, load_policy_for
from ludic.recipes.env import TrainEnvConfig, play_protocols, rollout_source, trainer_config
from ludic.recipes.env_setup import probe_env


@dataclass
class EnvPipelineConfig(TrainEnvConfig, PipelineBlock):
    """An actor or the learner of pipeline RL on any environment (``ludic train env``'s flags, and Redis)."""

    eval_every: int = 0
    """Not in the pipeline: evaluation and keep-best run in ``ludic train env``."""
    keep_best: bool = False
    """Not in the pipeline (see ``eval_every``)."""


def _source(cfg: EnvPipelineConfig, engine: Any, model: Any, tok: Any, run_dir: Path) -> Any:
    from ludic.training.algorithms import algorithm_for

    env = probe_env(cfg.env)
    return rollout_source(cfg, env, play_protocols(cfg, env, engine, model, tok)[0], run_dir, algorithm_for(cfg))


def _load(cfg: EnvPipelineConfig) -> tuple[Any, Any]:
    if cfg.eval_every or cfg.keep_best:
        raise UsageError("--eval-every / --keep-best run in `ludic train env` only: the pipeline's learner does not "
                         "evaluate; evaluate its checkpoints with `ludic eval env --adapter ...`")
    if cfg.format_demos:
        raise UsageError("--format-demos runs in `ludic train env` only: run it there (e.g. with --train-steps 0), "
                         "then give its final adapter to the pipeline with --adapter")
    return load_policy_for(cfg)


ENV = pipeline.PipelineParts(name="env", load=_load, source=_source, trainer_config=trainer_config,
                             episodes_per_step=lambda cfg: cfg.prompts_per_step * cfg.group_size)
"""Any environment's part in the generic pipeline commands (``ludic.recipes.pipeline``)."""


def run_actor(cfg: EnvPipelineConfig) -> int:
    return pipeline.run_actor(cfg, ENV)


def run_learner(cfg: EnvPipelineConfig) -> dict[str, Any]:
    return pipeline.run_learner(cfg, ENV)
