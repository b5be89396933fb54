"""``ludic recipe tictactoe``: make a small LLM play tic-tac-toe well, on a CPU.

    0. evaluate the base model (vs random, vs minimax)
    1. generate cold-start data: the perfect solver plays, with templated thoughts
    2. SFT (full fine-tuning) on that data
    3. evaluate
    4. GRPO with a LoRA adapter against an epsilon-mixed opponent
    5. evaluate, and write report.md, report.json and learning_curve.png

Everything happens in one process on one model object (no reloads), with the
in-process batched engine for rollouts. Each stage's wall time is recorded.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ludic.inference.models import DEFAULT_MODEL


@dataclass
class RecipeConfig:
    """Cold start + GRPO recipe for tic-tac-toe on the packaged SmolLM2-135M-Instruct."""

    model: str = DEFAULT_MODEL
    run_dir: str | None = None
    ctx: str = "last"
    """Prompt view: last (latest board only), truncated or full."""
    compact: bool = True
    """Compact board rendering (fewer prompt tokens)."""
    show_opponent_move: bool = False
    """The board says everything; the opponent's last move would only add tokens."""
    data: str = "positions"
    """positions: every position the deterministic solver teacher can face (335, ctx last only);
    episodes: teacher games against mixed opponents (any ctx)."""
    teacher_episodes: int = 3000
    """Episodes for data=episodes."""
    sft_epochs: float = 3.0
    sft_steps: int = 0
    """Fixed number of SFT steps (0: sft_epochs decides)."""
    sft_batch_size: int = 16
    sft_lr: float = 2e-4
    grpo_steps: int = 4
    group_size: int = 8
    rollouts_per_update: int = 16
    grpo_lr: float = 2e-4
    lora_rank: int = 16
    opponent: str = "mixed"
    epsilon: float = 0.3
    max_completion_tokens: int = 32
    eval_episodes: int = 60
    eval_base: bool = True
    micro_token_budget: int = 4096
    logger: str = "rich"
    dtype: str = "auto"
    seed: int = 0


def recipe(cfg: RecipeConfig) -> dict[str, Any]:
    return asyncio.run(_recipe(cfg))


async def _recipe(cfg: RecipeConfig) -> dict[str, Any]:
    from ludic.config import dump_config
    from ludic.data.offline import sft_item
    from ludic.data.synth import teacher_position_records, teacher_records
    from ludic.recipes.backends import in_process
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.recipes.sft import SFTConfig, sft_stage
    from ludic.recipes.tictactoe import (
        SYSTEM_PROMPT, TrainTicTacToeConfig, default_run_dir, eval_requests, grpo_stage, make_protocol_factory,
        run_eval,
    )
    from ludic.rollouts.engine import RolloutEngine
    from ludic.training.config import TrainerConfig
    from ludic.training.loggers import make_logger
    from ludic.training.lora import LoraSettings, apply_lora, load_policy

    run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir("recipe-tictactoe")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    times: dict[str, float] = {}
    results: dict[str, dict[str, float]] = {}
    model, tok = load_policy(cfg.model, dtype=cfg.dtype, seed=cfg.seed)
    engine = TransformersEngine(model, tok)

    async def evaluate(stage: str) -> None:
        t0 = time.perf_counter()
        ev_engine = RolloutEngine({"single_agent": make_protocol_factory(
            engine, cfg.ctx, 0.0, cfg.max_completion_tokens)}, concurrency=64)
        for opp in ("random", "minimax"):
            reqs = eval_requests(cfg.eval_episodes, opp, compact=cfg.compact,
                                 show_opponent_move=cfg.show_opponent_move)
            metrics, rollouts = await run_eval(ev_engine, reqs)
            results[f"{stage}/{opp}"] = metrics
            print(f"[recipe] {stage} vs {opp}: " + ", ".join(
                f"{k}={v:.2f}" for k, v in metrics.items() if k in ("legal_move_rate", "win_rate", "draw_rate",
                                                                     "loss_rate", "non_loss_rate")), flush=True)
        times[f"eval_{stage}"] = time.perf_counter() - t0

    if cfg.eval_base:
        await evaluate("base")

    t0 = time.perf_counter()
    if cfg.data == "positions":
        if cfg.ctx != "last":
            raise ValueError("data=positions writes history-free prompts: use ctx=last (or data=episodes)")
        records = teacher_position_records(SYSTEM_PROMPT, compact=cfg.compact)
    elif cfg.data == "episodes":
        records = teacher_records(cfg.teacher_episodes, SYSTEM_PROMPT, ctx=cfg.ctx, keep=("win", "draw"),
                                  seed=cfg.seed, compact=cfg.compact)
    else:
        raise ValueError(f"data must be positions or episodes, got {cfg.data!r}")
    items = [sft_item(r, tok) for r in records]
    times["datagen"] = time.perf_counter() - t0
    print(f"[recipe] teacher data ({cfg.data}): {len(records)} records", flush=True)

    t0 = time.perf_counter()
    sft_steps = cfg.sft_steps or math.ceil(cfg.sft_epochs * len(items) / cfg.sft_batch_size)
    sft_cfg = SFTConfig(model=cfg.model, batch_size=cfg.sft_batch_size, max_steps=sft_steps, final_save=True,
                        resume=False, seed=cfg.seed,
                        trainer=TrainerConfig(lr=cfg.sft_lr, lr_schedule="cosine", micro_token_budget=cfg.micro_token_budget,
                                              warmup_steps=max(1, sft_steps // 20)))
    sft_dir = run_dir / "sft"
    sft_logger = make_logger(cfg.logger, sft_dir, asdict(sft_cfg), total_steps=sft_steps)
    await sft_stage(sft_cfg, model, tok, items, sft_dir, sft_logger, sft_steps)
    sft_logger.close()
    times["sft"] = time.perf_counter() - t0
    await evaluate("sft")

    t0 = time.perf_counter()
    for p in model.parameters():
        p.requires_grad_(False)
    model = apply_lora(model, LoraSettings(rank=cfg.lora_rank, alpha=2.0 * cfg.lora_rank))
    engine.model = model
    grpo_cfg = TrainTicTacToeConfig(
        model=str(sft_dir / "final"), ctx=cfg.ctx, compact=cfg.compact,
        show_opponent_move=cfg.show_opponent_move, group_size=cfg.group_size,
        rollouts_per_update=cfg.rollouts_per_update, train_steps=cfg.grpo_steps,
        opponent=cfg.opponent, epsilon=cfg.epsilon, max_completion_tokens=cfg.max_completion_tokens,
        lora_rank=cfg.lora_rank,
        trainer=TrainerConfig(lr=cfg.grpo_lr, max_grad_norm=0.5, micro_token_budget=cfg.micro_token_budget),
        final_save=True, resume=False, seed=cfg.seed, concurrency=64,
    )
    grpo_dir = run_dir / "grpo"
    grpo_dir.mkdir(parents=True, exist_ok=True)
    grpo_logger = make_logger(cfg.logger, grpo_dir, asdict(grpo_cfg), total_steps=cfg.grpo_steps)
    await grpo_stage(grpo_cfg, model, tok, in_process(engine), grpo_dir, grpo_logger)
    grpo_logger.close()
    times["grpo"] = time.perf_counter() - t0
    await evaluate("grpo")

    report = {"results": results, "seconds": times, "total_seconds": sum(times.values()),
              "sft_records": len(records), "sft_steps": sft_steps, "config": asdict(cfg)}
    (run_dir / "report.json").write_text(json.dumps(report, indent=2))
    write_report(run_dir, report)
    return report


def _metrics(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def write_report(run_dir: Path, report: dict[str, Any]) -> None:
    """report.md (a table per stage and opponent, stage times) and learning_curve.png."""
    rows = ["| stage | opponent | legal moves | win | draw | loss | non-loss | optimal moves |",
            "|---|---|---|---|---|---|---|---|"]
    for key, m in report["results"].items():
        stage, opp = key.split("/")
        rows.append(
            f"| {stage} | {opp} | {m['legal_move_rate']:.1%} | {m['win_rate']:.1%} | {m['draw_rate']:.1%} | "
            f"{m['loss_rate']:.1%} | {m['non_loss_rate']:.1%} | {m['optimal_move_rate']:.1%} |"
        )
    times = "\n".join(f"| {k} | {v / 60:.1f} min |" for k, v in report["seconds"].items())
    text = (
        "# Tic-tac-toe recipe report\n\n" + "\n".join(rows)
        + f"\n\n| stage | wall time |\n|---|---|\n{times}\n| total | {report['total_seconds'] / 60:.1f} min |\n"
        + f"\nSFT records: {report['sft_records']}\n\n![learning curve](learning_curve.png)\n"
    )
    (run_dir / "report.md").write_text(text)
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    sft = _metrics(run_dir / "sft" / "metrics.jsonl")
    grpo = [m for m in _metrics(run_dir / "grpo" / "metrics.jsonl") if "reward_mean" in m]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    axes[0].plot([m["step"] for m in sft], [m["loss"] for m in sft])
    axes[0].set(title="SFT loss", xlabel="step", ylabel="NLL per token")
    for key in ("reward_mean", "non_loss_rate", "legal_move_rate"):
        axes[1].plot([m["step"] for m in grpo], [m.get(key) for m in grpo], label=key)
    axes[1].set(title="GRPO (training episodes)", xlabel="step")
    axes[1].legend()
    fig.tight_layout()
    fig.savefig(run_dir / "learning_curve.png", dpi=100)
    plt.close(fig)
