"""``ludic recipe tictactoe --ctx truncated``: the seed's own tic-tac-toe workflow, end to end.

The user's documented route (cold start, then RL with ``TruncatedThinkingContext``),
on the packaged model:

    0. base: exact evaluation vs minimax (ctx truncated: the positions met in the games)
       and a sampled one vs random (95% intervals)
    1. cold-start data: the solver teacher plays whole games against random, mixed and
       minimax opponents with templated ``<think>`` thoughts; the won and drawn games become
       multi-turn records whose earlier thoughts read ``[TRUNCATED]`` (the base model never
       writes the format, so rejection sampling cannot start from it)
    2. SFT (full fine-tuning) on those records
    3. rejection sampling: the SFT model plays (FullDialog, T=0.8) against the mixed opponent;
       its won games become records and a second, short SFT round trains on them beside the
       teacher's (on its own, one kept game in 16 made 4 steps of SFT unlearn the format)
    4. GRPO + LoRA with ctx truncated against the mixed opponent (``grpo_stage``)
    5. the same evaluations after each stage; report.md / report.json in its own run dir

It sits outside ``make train`` and its 30-minute budget; it has no bar of its own.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ludic.recipes.blocks import ModelBlock, RunBlock, load_policy_for
from ludic.tictactoe.prompts import ColdStartBlock


@dataclass
class SeedRecipeConfig(ModelBlock, ColdStartBlock, RunBlock):
    """The seed's workflow: teacher cold start, rejection sampling, SFT, GRPO with ctx truncated."""

    ctx: str = "truncated"
    """Prompt view: truncated (earlier thinking replaced by [TRUNCATED], as in the seed), full or last."""
    teacher_episodes: int = 80
    """Solver-teacher games whose won and drawn turns make the SFT records."""
    rs_episodes: int = 16
    """Rejection-sampling episodes played by the SFT model (wins kept)."""
    rs_sft_steps: int = 4
    """SFT steps on the kept games beside the teacher records."""
    grpo_steps: int = 3
    """GRPO + LoRA steps after the two SFT stages."""
    group_size: int = 4
    rollouts_per_update: int = 8
    """GRPO episodes per step (group_size per group)."""
    grpo_lr: float = 1e-4
    lora_rank: int = 16
    """Rank of the GRPO adapter (alpha = 2 x rank)."""
    max_completion_tokens: int = 48
    """Token limit per reply: a templated thought and the move."""
    eval_episodes: int = 20
    """Sampled episodes vs random per evaluation (the exact tree vs random is too large with history)."""

    @classmethod
    def from_recipe(cls, cfg: Any) -> "SeedRecipeConfig":
        """The seed workflow with the settings a ``RecipeConfig`` shares with it."""
        return cls(model=cfg.model, adapter=cfg.adapter, dtype=cfg.dtype, device=cfg.device, run_dir=cfg.run_dir,
                   ctx=cfg.ctx, logger=cfg.logger,
                   seed=cfg.seed, micro_token_budget=cfg.micro_token_budget)


def seed_recipe(cfg: SeedRecipeConfig) -> dict[str, Any]:
    return asyncio.run(_seed_recipe(cfg))


async def _seed_recipe(cfg: SeedRecipeConfig) -> dict[str, Any]:
    from ludic.config import dump_config
    from ludic.data.offline import sft_item
    from ludic.tictactoe.synth import teacher_records
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.recipes.backends import in_process
    from ludic.tictactoe.datagen import rejection_sample
    from ludic.recipes.sft import SFTConfig, sft_stage
    from ludic.tictactoe.train import TrainTicTacToeConfig, grpo_stage
    from ludic.tictactoe.prompts import SYSTEM_PROMPT
    from ludic.recipes.common import Clock, machine
    from ludic.training.config import TrainerConfig
    from ludic.training.loggers import logger_names, make_logger
    from ludic.training.lora import LoraSettings, apply_lora

    logger_names(cfg.logger)  # a typo fails now, not after the first stage
    if cfg.ctx not in ("truncated", "full"):
        raise ValueError(f"the seed workflow runs with ctx truncated (or full), got {cfg.ctx!r}")
    run_dir = cfg.resolve_run_dir("recipe-tictactoe-seed")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    clock = Clock(0)
    results: dict[str, dict[str, Any]] = {}
    model, tok = load_policy_for(cfg)
    engine = TransformersEngine(model, tok)

    async def evaluate(stage: str) -> None:
        t0 = time.perf_counter()
        results[stage] = await seed_eval(engine, cfg)
        mm, rd = results[stage]["minimax"], results[stage]["random"]
        print(f"[seed recipe] {stage}: exact vs minimax non-loss X {mm['x/non_loss_rate']:.1%} "
              f"O {mm['o/non_loss_rate']:.1%} | sampled vs random non-loss {rd['non_loss_rate']:.1%} "
              f"[{rd['non_loss_rate_ci95_low']:.1%}, {rd['non_loss_rate_ci95_high']:.1%}] "
              f"legal {rd['legal_move_rate']:.1%}", flush=True)
        clock.add(f"eval_{stage}", time.perf_counter() - t0)

    async def sft(name: str, records: list[dict], steps: int) -> None:
        t0 = time.perf_counter()
        items = [sft_item(r, tok) for r in records]
        sft_cfg = SFTConfig(model=cfg.model, batch_size=cfg.sft_batch_size, max_steps=steps, final_save=False,
                            resume=False, seed=cfg.seed,
                            trainer=TrainerConfig(lr=cfg.sft_lr, lr_schedule="cosine", warmup_steps=max(1, steps // 20),
                                                  micro_token_budget=cfg.micro_token_budget))
        logger = make_logger(cfg.logger, run_dir / name, asdict(sft_cfg), total_steps=steps)
        await sft_stage(sft_cfg, model, tok, items, run_dir / name, logger, steps)
        logger.close()
        clock.add(name, time.perf_counter() - t0)

    await evaluate("base")

    t0 = time.perf_counter()
    records = teacher_records(cfg.teacher_episodes, SYSTEM_PROMPT, ctx=cfg.ctx, keep=("win", "draw"), seed=cfg.seed)
    clock.add("datagen", time.perf_counter() - t0)
    sft_steps = math.ceil(cfg.sft_epochs * len(records) / cfg.sft_batch_size)
    print(f"[seed recipe] teacher: {cfg.teacher_episodes} games -> {len(records)} records; SFT {sft_steps} steps",
          flush=True)
    await sft("sft", records, sft_steps)
    await evaluate("sft")

    t0 = time.perf_counter()
    rs_records, kept = await rejection_sample(engine, cfg.rs_episodes, ("win",), opponent="mixed", ctx=cfg.ctx,
                                              max_tokens=cfg.max_completion_tokens, seed=cfg.seed + 1)
    clock.add("rejection_sampling", time.perf_counter() - t0)
    print(f"[seed recipe] rejection sampling: kept {kept}/{cfg.rs_episodes} won games, {len(rs_records)} records",
          flush=True)
    if rs_records:  # with the teacher records beside them: a handful of won games alone unlearns the format
        await sft("sft_rs", rs_records + records, cfg.rs_sft_steps)
        await evaluate("sft_rs")

    t0 = time.perf_counter()
    for p in model.parameters():
        p.requires_grad_(False)
    model = apply_lora(model, LoraSettings(rank=cfg.lora_rank, alpha=2.0 * cfg.lora_rank))
    engine.model = model
    grpo_cfg = TrainTicTacToeConfig(
        model=cfg.model, ctx=cfg.ctx, group_size=cfg.group_size, rollouts_per_update=cfg.rollouts_per_update,
        train_steps=cfg.grpo_steps, opponent="mixed", max_completion_tokens=cfg.max_completion_tokens,
        lora_rank=cfg.lora_rank, final_save=True, resume=False, seed=cfg.seed, concurrency=64,
        trainer=TrainerConfig(lr=cfg.grpo_lr, max_grad_norm=0.5, micro_token_budget=cfg.micro_token_budget),
    )
    grpo_dir = run_dir / "grpo"
    grpo_dir.mkdir(parents=True, exist_ok=True)
    logger = make_logger(cfg.logger, grpo_dir, asdict(grpo_cfg), total_steps=cfg.grpo_steps)
    await grpo_stage(grpo_cfg, model, tok, in_process(engine), grpo_dir, logger)
    logger.close()
    clock.add("grpo", time.perf_counter() - t0)
    await evaluate("grpo")

    report = {"results": results, "seconds": clock.seconds, "total_seconds": clock.elapsed(),
              "teacher_records": len(records), "sft_steps": sft_steps, "rs_kept": kept, "rs_records": len(rs_records),
              "machine": machine(), "config": asdict(cfg)}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_seed_report(run_dir, report)
    print(f"[seed recipe] report: {run_dir / 'report.md'}", flush=True)
    return report


async def seed_eval(client: Any, cfg: SeedRecipeConfig) -> dict[str, dict[str, float]]:
    """Exact vs minimax (both seats, every tie-break; positions met) and sampled vs random."""
    from ludic.tictactoe.exact import exact_eval
    from ludic.tictactoe.train import outcome_intervals
    from ludic.tictactoe.prompts import SYSTEM_PROMPT, eval_requests, make_protocol_factory, run_eval
    from ludic.rollouts.engine import RolloutEngine

    exact = await exact_eval(client, ctx=cfg.ctx, system_prompt=SYSTEM_PROMPT, opponent="minimax",
                             max_tokens=cfg.max_completion_tokens)
    engine = RolloutEngine({"single_agent": make_protocol_factory(client, cfg.ctx, 0.0, cfg.max_completion_tokens)},
                           concurrency=64)
    sampled, rollouts = await run_eval(engine, eval_requests(cfg.eval_episodes, "random"))
    sampled.update(outcome_intervals(rollouts))
    return {"minimax": exact.as_metrics(), "random": sampled}


def write_seed_report(run_dir: Path, report: dict[str, Any]) -> None:
    rows = ["| stage | exact vs minimax: non-loss X | O | mean | illegal or unparsable | sampled vs random: non-loss "
            "(95% CI) | win | legal moves |", "|---|---|---|---|---|---|---|---|"]
    for stage, r in report["results"].items():
        mm, rd = r["minimax"], r["random"]
        rows.append(f"| {stage} | {mm['x/non_loss_rate']:.1%} | {mm['o/non_loss_rate']:.1%} | {mm['non_loss_rate']:.1%} | "
                    f"{mm['illegal_rate'] + mm['parse_error_rate']:.1%} | {rd['non_loss_rate']:.1%} "
                    f"({rd['non_loss_rate_ci95_low']:.1%}-{rd['non_loss_rate_ci95_high']:.1%}) | {rd['win_rate']:.1%} | "
                    f"{rd['legal_move_rate']:.1%} |")
    times = "\n".join(f"| {k} | {v / 60:.2f} min |" for k, v in report["seconds"].items())
    m, c = report["machine"], report["config"]
    text = (
        "# Tic-tac-toe: the seed's workflow (ctx truncated)\n\n"
        f"Teacher cold start ({c['teacher_episodes']} solver games -> {report['teacher_records']} multi-turn records "
        f"with `[TRUNCATED]` thoughts), SFT {report['sft_steps']} steps, rejection sampling "
        f"({report['rs_kept']}/{c['rs_episodes']} won games kept -> {report['rs_records']} records, "
        f"SFT {c['rs_sft_steps']} steps), GRPO + LoRA {c['grpo_steps']} steps vs the mixed opponent.\n\n"
        + "\n".join(rows)
        + f"\n\n| stage | wall time |\n|---|---|\n{times}\n| **total** | **{report['total_seconds'] / 60:.2f} min** |\n\n"
        f"Machine: {m['cpus']} CPUs ({', '.join(m['isa'])}), torch {m['torch']}, dtype {c['dtype']}.\n"
    )
    (run_dir / "report.md").write_text(text)
