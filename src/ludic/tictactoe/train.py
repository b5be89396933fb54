"""Tic-tac-toe recipes: GRPO + LoRA training and evaluation, read top to bottom.

    ludic train tictactoe   ->  train(TrainTicTacToeConfig)
    ludic eval tictactoe    ->  evaluate(EvalTicTacToeConfig)

The wiring is the spine: TicTacToeEnv -> Agent(engine, context, strict
<think>/<move> parser) -> SingleAgentProtocol -> RolloutEngine with
GRPORequestStrategy -> GroupNormalizedReturn -> loss -> Trainer -> publisher.
``--opponent self`` and ``--opponent-pool`` (self-play, a league of frozen
snapshots, bots) swap the first steps for TicTacToeGame + MultiAgentProtocol
(see ``ludic.tictactoe.opponents``).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from ludic.config import dump_config
from ludic.inference.client import ChatClient
from ludic.inference.models import DEFAULT_MODEL
from ludic.recipes.blocks import EvalInferenceBlock, InferenceBlock, ModelBlock, PipelineBlock, TrainRunBlock
from ludic.tictactoe.prompts import (TicTacToeBlock, _starts, answer_parser, env_spec, eval_requests,
                                          make_protocol_factory, prompting, run_eval, tictactoe_metrics,
                                          tictactoe_outcome)
from ludic.rollouts.batch import RolloutBatchSource
from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
from ludic.training.config import TrainerConfig
from ludic.types import Rollout, RolloutRequest

@dataclass
class TrainTicTacToeConfig(ModelBlock, TicTacToeBlock, InferenceBlock, PipelineBlock, TrainRunBlock):
    """Train a model to play tic-tac-toe with GRPO + LoRA."""

    algorithm: str = "grpo"
    """grpo, dr_grpo, dapo, gspo, cispo, rloo, reinforce, reinforce_baseline."""
    group_size: int = 8
    """Episodes per GRPO group (same env seed, different sampling seeds)."""
    rollouts_per_update: int = 16
    """Episodes per optimizer step; must be divisible by group_size."""
    concurrency: int = 32
    """Episodes in flight at once (their model calls are batched)."""
    train_steps: int = 30
    """Optimizer steps."""
    train_temperature: float = 1.0
    max_completion_tokens: int = 48
    """Token limit per model reply; a cut-off reply is a format failure."""
    max_steps_per_episode: int = 5
    opponent: str = "mixed"
    """random, minimax or mixed (epsilon-random minimax), or self (self-play: both seats are the trained policy)."""
    opponent_pool: str = ""
    """Opponent per GRPO group from a mixture, e.g. self:0.4,league:0.3,minimax:0.2,random:0.1 (overrides
    --opponent; league = a frozen earlier snapshot of the policy; the trained seat alternates X/O by group)."""
    league_size: int = 4
    """Frozen snapshots the league keeps (the oldest is dropped); stored in <run_dir>/league."""
    league_every: int = 10
    """Snapshot the policy into the league every N optimizer steps (step 0, the starting policy, included)."""
    agent_starts_as: str = "mixed"
    """x, o, or mixed (50/50 per episode) against a bot --opponent (an --opponent-pool alternates by group)."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=5e-5, max_grad_norm=0.5, checkpoint_every=10))
    """Optimisation (--lr, --max-grad-norm, --ppo-epochs, ...: see TrainerConfig)."""
    merge_turns: bool = True
    """One training sequence per episode when the context is append-only (ctx full); else one item per turn."""
    lora_rank: int = 8
    lora_alpha_mult: float = 2.0
    """LoRA alpha = rank * this."""
    lora_dropout: float = 0.0
    full_finetune: bool = False
    """Train all weights instead of a LoRA adapter."""
    kl_coef: float = 0.0
    behavior_is: str = ""
    """Off-policy correction of sampler/learner mismatch and staleness: token_truncate,
    token_mask, sequence_truncate or sequence_mask ("": none; see LossConfig.behavior_is)."""
    behavior_is_cap: float = 2.0
    """Truncation cap (or top of the kept band) of the importance weight."""
    eval_every: int = 0
    """Evaluate every N steps (0: only at the end if eval_episodes > 0)."""
    eval_episodes: int = 0
    eval_temperature: float = 0.0
    pipeline: int = 0
    """Pipeline RL: this many actor processes roll out and push to Redis while this process
    learns (0: synchronous). ``ludic actor`` / ``ludic learner`` run the parts on other hosts."""
    overlap: bool = False
    """One process, one-step off-policy: an actor thread with its own copy of the model samples
    batch k+1 while this thread trains on batch k (the pipeline with --max-lag 1 unless given, one
    batch ahead at most; a local redis-server carries samples and weights unless --redis-url)."""
    stream_prefix: str = "ludic-tictactoe"


def train(cfg: TrainTicTacToeConfig) -> dict[str, Any]:
    """Run GRPO training; returns the last step's metrics (plus final eval if configured)."""
    return asyncio.run(_train(cfg))


async def _train(cfg: TrainTicTacToeConfig) -> dict[str, Any]:
    from ludic.recipes.backends import make_inference
    from ludic.training.loggers import make_logger
    from ludic.training.lora import save_merged_base

    if cfg.rollouts_per_update % cfg.group_size:
        raise ValueError(
            f"rollouts_per_update ({cfg.rollouts_per_update}) must be divisible by group_size ({cfg.group_size})"
        )
    run_dir = cfg.resolve_run_dir(f"tictactoe-{cfg.algorithm}")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    model, tok = load_train_policy(cfg)
    served = cfg.model
    if cfg.adapter and cfg.inference == "vllm":
        # the policy is base + merged adapter (+ a fresh LoRA): the server must serve those weights
        served = str(save_merged_base(model, tok, run_dir / "base_model"))
        if cfg.port:
            raise ValueError(
                f"--adapter with a running server (--port {cfg.port}): the server must serve the merged "
                f"starting policy, now saved in {served}. Start it with --model {served}, then train with "
                f"--model {served} and no --adapter (or leave --port 0 to let this run start the server)."
            )
    inference = await make_inference(cfg.inference, model, tok, served, run_dir, host=cfg.host, port=cfg.port,
                                     dtype=cfg.dtype)
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    try:
        return await grpo_stage(cfg, model, tok, inference, run_dir, logger)
    finally:
        logger.close()
        await inference.close()


def load_train_policy(cfg: TrainTicTacToeConfig) -> tuple[Any, Any]:
    """(model, tokenizer) to train: ``cfg.model`` (+ ``--adapter`` merged) under a fresh LoRA, or
    the whole model with ``--full-finetune``."""
    from ludic.recipes.blocks import load_policy_for
    from ludic.training.lora import LoraSettings

    lora = None if cfg.full_finetune else LoraSettings(
        rank=cfg.lora_rank, alpha=cfg.lora_rank * cfg.lora_alpha_mult, dropout=cfg.lora_dropout
    )
    return load_policy_for(cfg, lora=lora)


def trainer_config(cfg: TrainTicTacToeConfig) -> Any:
    """The run's TrainerConfig with what it leaves open filled in from the game settings: the LR
    schedule's length (train_steps) and the Dr.GRPO normaliser (the longest possible episode)."""
    return replace(cfg.trainer, total_steps=cfg.trainer.total_steps or cfg.train_steps,
                   norm_max_tokens=cfg.trainer.norm_max_tokens or cfg.max_completion_tokens * cfg.max_steps_per_episode)


def rollout_source(cfg: TrainTicTacToeConfig, client: ChatClient, model: Any, tok: Any,
                   run_dir: Path) -> tuple[Any, Any, Any]:
    """(RolloutBatchSource, algorithm, league or None): games against cfg's opponents, GRPO
    groups, credit and filter; what ``ludic train`` trains on and what a pipeline actor pushes."""
    from ludic.tictactoe.opponents import opponent_metrics, opponent_requests
    from ludic.training.algorithms import algorithm_for

    factory = make_protocol_factory(client, cfg.ctx, cfg.train_temperature, cfg.max_completion_tokens,
                                    **prompting(cfg))
    engine = RolloutEngine({"single_agent": factory}, concurrency=cfg.concurrency,
                           jsonl_path=run_dir / "rollouts.jsonl")
    algo = algorithm_for(cfg)
    starts = _starts(cfg.agent_starts_as)

    def bot_requests() -> list[RolloutRequest]:
        n = cfg.rollouts_per_update // cfg.group_size
        return [RolloutRequest(env_spec(cfg.opponent, cfg.epsilon, starts, cfg.compact, cfg.show_opponent_move,
                                        cfg.show_moves),
                               max_steps=cfg.max_steps_per_episode)
                for _ in range(n)]

    # --opponent self / --opponent-pool: self-play, league and bot games (None for a bot --opponent)
    pool = opponent_requests(cfg, engine, client, model, tok, run_dir)
    source = RolloutBatchSource(
        engine, pool or bot_requests, algo.credit, strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
        sample_filter=algo.sample_filter, metrics_fn=tictactoe_metrics if pool is None else opponent_metrics,
        merge_turns=cfg.merge_turns,
    )
    return source, algo, (pool.league if pool is not None else None)


async def grpo_stage(
    cfg: TrainTicTacToeConfig, model: Any, tok: Any, inference: Any, run_dir: Path, logger: Any
) -> dict[str, Any]:
    """GRPO on an already loaded (LoRA-wrapped) model with a ready inference backend.

    Returns the last step's metrics, plus ``eval_random/*`` and ``eval_minimax/*``
    when ``cfg.eval_episodes`` > 0; writes ``summary.json``.
    """
    from ludic.training.trainer import Trainer

    source, algo, league = rollout_source(cfg, inference.client, model, tok, run_dir)
    tcfg = trainer_config(cfg)
    trainer = Trainer(
        model, algo, source, tcfg, publisher=inference.publisher, logger=logger,
        checkpoint_dir=run_dir / "checkpoints", tokenizer=tok, pad_token_id=tok.pad_token_id,
    )
    resumed = cfg.resume and trainer.resume()
    if resumed:
        print(f"[ludic] resumed from step {trainer.step} in {run_dir}")
    if league is not None:
        if not resumed:
            league.load_state_dict({"snapshots": []})  # a fresh run starts with an empty league
        league.maybe_snapshot(model, trainer.step)  # the starting policy (or the resumed step's)
    eval_engine = RolloutEngine(
        {"single_agent": make_protocol_factory(inference.client, cfg.ctx, cfg.eval_temperature,
                                               cfg.max_completion_tokens, **prompting(cfg))},
        concurrency=cfg.concurrency,
    )
    async def on_step(step: int, metrics: dict[str, Any]) -> None:
        if league is not None:
            league.maybe_snapshot(model, step)
        if cfg.eval_every and cfg.eval_episodes and step % cfg.eval_every == 0 and step < cfg.train_steps:
            ev, _ = await run_eval(eval_engine, eval_requests(cfg.eval_episodes, "random", compact=cfg.compact,
                                                          show_opponent_move=cfg.show_opponent_move,
                                                          show_moves=cfg.show_moves))
            logger.log(step, {f"eval/{k}": v for k, v in ev.items()})

    last = dict(await trainer.train(cfg.train_steps, on_step))
    if cfg.final_save:
        trainer.save()
    if cfg.eval_episodes:
        for opp in ("random", "minimax"):
            ev, _ = await run_eval(eval_engine, eval_requests(cfg.eval_episodes, opp, compact=cfg.compact,
                                                         show_opponent_move=cfg.show_opponent_move,
                                                         show_moves=cfg.show_moves))
            last.update({f"eval_{opp}/{k}": v for k, v in ev.items()})
        logger.log(trainer.step, {k: v for k, v in last.items() if k.startswith("eval_")})
    (run_dir / "summary.json").write_text(json.dumps({k: v for k, v in last.items()
                                                      if isinstance(v, (int, float))}, indent=2))
    return last


@dataclass
class EvalTicTacToeConfig(ModelBlock, TicTacToeBlock, EvalInferenceBlock):
    """Evaluate a model (or LoRA adapter) at tic-tac-toe against a fixed opponent."""

    model: str = DEFAULT_MODEL
    """Base model, or the adapter name served by a vLLM server."""
    episodes: int = 200
    temperature: float | None = None
    """Sampling temperature (default 0.6; --exact needs 0, its default)."""
    max_tokens: int = 48
    concurrency: int = 64
    exact: bool = False
    """Exact evaluation of the greedy policy: every opponent branch (minimax tie-breaks, random or mixed
    moves) and both seats enumerated, no sampling noise; --episodes is not used."""
    all_positions: bool = False
    """With --exact: also score the policy's move on every reachable position (ctx last; with a
    history-dependent ctx the positions met in the games are scored)."""
    out: str = "tictactoe_eval.jsonl"
    """One JSON record per step (with --exact: per distinct decision)."""
    seed: int = 0


def evaluate(cfg: EvalTicTacToeConfig) -> dict[str, float]:
    """Sampled rates with 95% Wilson intervals, or with ``cfg.exact`` the exact metrics
    (``ExactResult.as_metrics``; ``format_table`` prints them)."""
    if cfg.exact and cfg.temperature:
        raise ValueError(f"--exact evaluates the greedy policy (temperature 0), got --temperature {cfg.temperature}; "
                         "drop --exact for a sampled evaluation (it reports 95% confidence intervals)")
    return asyncio.run(_evaluate(cfg))


async def _evaluate(cfg: EvalTicTacToeConfig) -> dict[str, float]:
    from ludic.recipes.backends import make_eval_client

    client, close = await make_eval_client(cfg)
    try:
        if cfg.exact:
            return await _evaluate_exact(cfg, client)
        temperature = 0.6 if cfg.temperature is None else cfg.temperature
        engine = RolloutEngine(
            {"single_agent": make_protocol_factory(client, cfg.ctx, temperature, cfg.max_tokens, **prompting(cfg))},
            concurrency=cfg.concurrency,
        )
        t0 = time.perf_counter()
        metrics, rollouts = await run_eval(engine, eval_requests(cfg.episodes, cfg.opponent, cfg.epsilon, cfg.compact,
                                                                         cfg.show_opponent_move,
                                                                         show_moves=cfg.show_moves))
        metrics["episodes_per_s"] = len(rollouts) / (time.perf_counter() - t0)
        metrics.update(outcome_intervals(rollouts))
        n_tok = [len(s.trace.completion_ids) for r in rollouts for s in r.steps if s.trace]
        metrics["avg_completion_tokens"] = sum(n_tok) / max(len(n_tok), 1)
        write_step_records(cfg.out, rollouts)
        return metrics
    finally:
        await close()


async def _evaluate_exact(cfg: EvalTicTacToeConfig, client: ChatClient) -> dict[str, float]:
    from ludic.tictactoe.exact import exact_eval

    result = await exact_eval(client, ctx=cfg.ctx, system_prompt=cfg.system_prompt, compact=cfg.compact,
                              show_moves=cfg.show_moves, parser=answer_parser(cfg.answer),
                              show_opponent_move=cfg.show_opponent_move, opponent=cfg.opponent, epsilon=cfg.epsilon,
                              max_tokens=cfg.max_tokens, all_positions=cfg.all_positions)
    Path(cfg.out).parent.mkdir(parents=True, exist_ok=True)
    with open(cfg.out, "w") as f:
        for rec in result.records:
            f.write(json.dumps(rec.to_dict()) + "\n")
    return result.as_metrics()


def outcome_intervals(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """95% Wilson intervals of the episode outcome rates: ``win_rate_ci95_low``, ``win_rate_ci95_high``, ..."""
    from ludic.eval.stats import wilson_interval

    outcomes = [tictactoe_outcome(r) for r in rollouts]
    counts = {k: outcomes.count(k) for k in ("win", "draw", "loss", "illegal", "parse_error", "truncated")}
    counts["non_loss"] = counts["win"] + counts["draw"]
    out = {}
    for k, c in counts.items():
        out[f"{k}_rate_ci95_low"], out[f"{k}_rate_ci95_high"] = wilson_interval(c, len(outcomes))
    return out


def write_step_records(path: str | Path, rollouts: Sequence[Rollout]) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w") as f:
        for r in rollouts:
            outcome = tictactoe_outcome(r)
            for s in r.steps:
                rec = {
                    "rollout_id": r.id, "env_seed": r.meta.get("env_seed"), "outcome": outcome,
                    "step_index": s.index, "prev_obs": s.prev_obs, "action": s.action,
                    "parsed_action": s.parsed_action, "reward": s.reward, "total_reward": r.total_reward,
                    "terminated": s.terminated, "truncated": s.truncated,
                    "completion_tokens": len(s.trace.completion_ids) if s.trace else 0,
                    "info": {k: v for k, v in s.info.items() if isinstance(v, (str, int, float, bool, type(None)))},
                }
                f.write(json.dumps(rec) + "\n")
