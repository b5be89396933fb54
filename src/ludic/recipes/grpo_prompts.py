"""GRPO on a prompt dataset with a reward function: ``ludic train prompts``.

Each JSONL record ``{"prompt": ...}`` becomes a single-turn ``PromptEnv``; a
group of completions per prompt is scored by a named reward function (e.g.
``move_quality``: win 1.0, block 0.8, centre 0.6, corner 0.4, edge 0.2,
invalid -1.0, judged for the side to move) and normalised within its group.

    ludic datagen thinktactoe --kind grpo --output data/tictactoe_grpo.jsonl
    ludic train prompts --data data/tictactoe_grpo.jsonl --reward move_quality --raw-prompts
"""

from __future__ import annotations

import asyncio
import random
import statistics
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Sequence

from ludic.recipes.blocks import GRPOBlock, LoraBlock, ModelBlock, TrainRunBlock, load_policy_for
from ludic.training.config import TrainerConfig
from ludic.types import Rollout


@dataclass
class TrainPromptsConfig(ModelBlock, LoraBlock, GRPOBlock, TrainRunBlock):
    """GRPO on a JSONL prompt dataset scored by a reward function."""

    data: str = "data/tictactoe_grpo.jsonl"
    reward: str = "move_quality"
    """Registered reward function (prompt, completion) -> float."""
    raw_prompts: bool = True
    """Feed prompts as raw text (no chat template), as the ThinkTacToe datasets expect."""
    stop: str = "<|end|>"
    """Stop string for completions ('' for none)."""
    group_size: int = 4
    train_steps: int = 20
    max_completion_tokens: int = 32
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-5))
    """Optimisation (--lr, --max-grad-norm, --lr-schedule, ...: see TrainerConfig)."""
    logs_dir: str | None = None
    """Also write the seed's text log (grpo_training_logs_<time>.txt) here (default: the run dir)."""


def reward_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    rewards = [r.total_reward for r in rollouts if not r.meta.get("failed")]
    if not rewards:
        return {}
    return {"reward_mean": statistics.fmean(rewards), "reward_std": statistics.pstdev(rewards)}


def train_prompts(cfg: TrainPromptsConfig) -> dict[str, Any]:
    return asyncio.run(_train_prompts(cfg))


async def _train_prompts(cfg: TrainPromptsConfig) -> dict[str, Any]:
    from ludic.agents.agent import Agent
    from ludic.config import dump_config
    from ludic.context import make_context
    from ludic.data.jsonl import read_jsonl
    from ludic.data.text_logs import TextLogLogger
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.algorithms import algorithm_for
    from ludic.training.loggers import MultiLogger, make_logger
    from ludic.training.trainer import Trainer
    from ludic.types import EnvSpec, RolloutRequest

    records = read_jsonl(cfg.data, {"prompt": str})
    run_dir = cfg.resolve_run_dir("grpo-prompts")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    model, tok = load_policy_for(cfg)
    engine = TransformersEngine(model, tok)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.max_completion_tokens,
                              stop=(cfg.stop,) if cfg.stop else ())

    def factory() -> SingleAgentProtocol:
        ctx = make_context("raw" if cfg.raw_prompts else "last")
        return SingleAgentProtocol(Agent(engine, ctx, sampling=sampling, reject_incomplete=False))

    order = list(range(len(records)))
    rng = random.Random(cfg.seed)
    rng.shuffle(order)
    cursor = 0

    def requests_fn() -> list[RolloutRequest]:
        nonlocal cursor
        out = []
        for _ in range(cfg.prompts_per_step):
            rec = records[order[cursor % len(order)]]
            cursor += 1
            out.append(RolloutRequest(EnvSpec("prompt", {"prompt": rec["prompt"], "reward": cfg.reward}),
                                      max_steps=1))
        return out

    algo = algorithm_for(cfg)
    source = RolloutBatchSource(
        RolloutEngine({"single_agent": factory}, concurrency=64, jsonl_path=run_dir / "rollouts.jsonl"),
        requests_fn, algo.credit, strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
        sample_filter=algo.sample_filter, metrics_fn=reward_metrics,
    )
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    logger = MultiLogger(logger.loggers + [TextLogLogger(cfg.logs_dir or run_dir, "grpo")])
    trainer = Trainer(
        model, algo, source,
        replace(cfg.trainer, total_steps=cfg.trainer.total_steps or cfg.train_steps,
                norm_max_tokens=cfg.trainer.norm_max_tokens or cfg.max_completion_tokens),
        publisher=InProcessPublisher(engine), logger=logger, checkpoint_dir=run_dir / "checkpoints",
        tokenizer=tok, pad_token_id=tok.pad_token_id,
    )
    if cfg.resume:
        trainer.resume()
    cursor = trainer.step * cfg.prompts_per_step  # resumed runs continue through the dataset
    last = await trainer.train(cfg.train_steps)
    if cfg.final_save:
        trainer.save()
    logger.close()
    return {**last, "run_dir": str(run_dir)}
