"""Supervised fine-tuning on JSONL data: ``ludic sft`` (also under ``torchrun``).

    OfflineBatchSource(load_sft_items(data)) -> make_sft() (uniform NLL on completion tokens) -> Trainer

Checkpoints are Hugging Face folders (full model, or a LoRA adapter) with the
tokenizer; the final model is also written to ``<run_dir>/final``.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ludic.recipes.blocks import (LoraBlock, ModelBlock, OfflineBlock, TrainRunBlock, load_policy_for,
                                  open_offline_logger)
from ludic.training.config import TrainerConfig


@dataclass
class SFTConfig(ModelBlock, LoraBlock, OfflineBlock, TrainRunBlock):
    """Supervised fine-tuning (uniform-weight NLL on completion tokens)."""

    data: str = "data/tictactoe_sft_train_data.jsonl"
    """One or more JSONL files, comma-separated."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-4, lr_schedule="cosine"))
    """Optimisation (--lr, --lr-schedule, --warmup-steps, --max-grad-norm, ...: see TrainerConfig)."""
    full_finetune: bool = True
    """Train all weights (else a LoRA adapter with lora_rank / lora_alpha); --adapter: continue that one."""
    fsdp: bool = True
    """Under torchrun: shard the model with FSDP2 (fully_shard); False replicates it and sums gradients."""
    fsdp_mixed_precision: str = "auto"
    """Under torchrun (FSDP2): auto (compute in --dtype over fp32 shards) | bf16 | none (shard as loaded)."""


def sft(cfg: SFTConfig) -> dict[str, Any]:
    return asyncio.run(_sft(cfg))


async def _sft(cfg: SFTConfig) -> dict[str, Any]:
    from ludic.data.offline import load_sft_items
    from ludic.distributed import broadcast_object, init_distributed, shutdown_distributed

    rank, world = init_distributed()
    run_dir = Path(broadcast_object(str(cfg.resolve_run_dir("sft"))))
    model, tok = load_policy_for(cfg)
    if world > 1 and cfg.fsdp:
        from ludic.training.fsdp import shard_model

        model = shard_model(model, mixed_precision=cfg.fsdp_mixed_precision if cfg.trainer.master_weights else "none")
    items = load_sft_items(cfg.data_paths(), tok, cfg.chat_template)
    steps = cfg.steps_for(len(items), world)
    logger = open_offline_logger(cfg, run_dir, steps, "sft")
    last = await sft_stage(cfg, model, tok, items, run_dir, logger, steps)
    if logger is not None:
        logger.close()
    shutdown_distributed()
    return {**last, "run_dir": str(run_dir), "steps": steps, "num_examples": len(items)}


async def sft_stage(
    cfg: SFTConfig, model: Any, tok: Any, items: list, run_dir: Path, logger: Any, steps: int
) -> dict[str, Any]:
    """Run ``steps`` SFT optimizer steps on ``items`` (sharded over ranks); save to ``run_dir/final``."""
    from ludic.data.offline import OfflineBatchSource
    from ludic.training.algorithms import make_sft
    from ludic.distributed import init_distributed
    from ludic.training.trainer import Trainer

    rank, world = init_distributed()
    source = OfflineBatchSource(items, cfg.batch_size, seed=cfg.seed, rank=rank, world_size=world)
    tcfg = replace(cfg.trainer, total_steps=cfg.trainer.total_steps or steps)
    trainer = Trainer(model, make_sft(), source, tcfg, logger=None, checkpoint_dir=run_dir / "checkpoints",
                      tokenizer=tok, pad_token_id=tok.pad_token_id)
    if cfg.resume:
        trainer.resume()
    def on_step(step: int, metrics: dict[str, Any]) -> None:
        if logger is not None and (step % cfg.log_every == 0 or step == steps):
            logger.log(step, {"loss": metrics["loss"], "grad_norm": metrics["grad_norm"], "learning_rate": metrics["lr"],
                              "num_tokens": metrics["train_tokens"], "epoch": step * cfg.batch_size * world / len(items),
                              "train_tokens_per_s": metrics["train_tokens_per_s"], "step_s": metrics["step_s"]})

    last = await trainer.train(steps, on_step)
    if cfg.final_save:
        from ludic.distributed import is_sharded
        from ludic.training.fsdp import full_state_dict

        trainer.save()  # collective when sharded: every rank joins the gather
        state = full_state_dict(model) if is_sharded(model) else None
        if rank == 0:
            final = run_dir / "final"
            model.save_pretrained(final, **({"state_dict": state} if state is not None else {}))
            tok.save_pretrained(final)
    return last


def demo_batch(items: int, steps: int, epochs: float = 1.0) -> int:
    """Demos per step of a cold start, so that ``steps`` steps make ``epochs`` passes over ``items`` demos (at
    least one demo a step)."""
    return max(1, int(items * epochs) // max(1, steps))


async def demo_sft(model: Any, tok: Any, items: list, *, steps: int, batch: int, lr: float, trainer: TrainerConfig,
                   logger: str, desc: str, seed: int, publisher: Any = None) -> None:
    """A short SFT cold start on teacher demonstrations (``--tool-demos``, ``--format-demos``):
    ``steps`` optimizer steps of ``batch`` items, uniform NLL on the teacher's tokens, cosine decay
    from ``lr``, one pass per batch, no checkpoints. ``trainer`` gives the rest (micro-batch budget,
    clipping, ...). The steps show on the console when ``logger`` names rich or print."""
    from ludic.data.offline import OfflineBatchSource
    from ludic.training.algorithms import make_sft
    from ludic.training.loggers import RichLogger, logger_names
    from ludic.training.trainer import Trainer

    console = RichLogger(steps, desc=desc, label=desc) if {"rich", "print"} & set(logger_names(logger)) else None
    tcfg = replace(trainer, lr=lr, total_steps=steps, lr_schedule="cosine", ppo_epochs=1, num_minibatches=1,
                   kl_target=None, checkpoint_every=0)
    sft = Trainer(model, make_sft(), OfflineBatchSource(items, batch, seed=seed), tcfg, publisher=publisher,
                  logger=console, tokenizer=tok, pad_token_id=tok.pad_token_id)
    await sft.train(steps)
