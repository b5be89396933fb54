"""Direct preference optimisation on JSONL pairs: ``ludic dpo`` (also under ``torchrun``).

    PairBatchSource(dpo_items(read_dpo_records(data))) -> make_dpo_objective() -> Trainer(group_key="pair_id")

Records are ``{"prompt": str | messages, "chosen": str, "rejected": str}``
(``ludic datagen thinktactoe --kind dpo`` writes them). The reference policy is
a frozen copy of the starting model (full fine-tuning, or LoRA continuing an
``--adapter``) or the LoRA base with the adapter disabled (a fresh LoRA). The
seed's ``train_dpo.py --path CHECKPOINT`` is ``ludic dpo --model CHECKPOINT``;
its defaults (3 epochs, 8 pairs per step, beta 0.1, lr 1e-6 with linear decay,
max length 1024, frozen-copy reference) are the defaults here. Checkpoints are
Hugging Face folders with the tokenizer; the final model is also written to
``<run_dir>/final`` and the last step's metrics to ``<run_dir>/summary.json``.
"""

from __future__ import annotations

import asyncio
import copy
import json
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from ludic.inference.models import DEFAULT_MODEL
from ludic.recipes.blocks import (LoraBlock, ModelBlock, OfflineBlock, TrainRunBlock, load_policy_for,
                                  open_offline_logger)
from ludic.training.config import TrainerConfig

REFERENCES = ("auto", "base", "copy")


@dataclass
class DPOTrainConfig(ModelBlock, LoraBlock, OfflineBlock, TrainRunBlock):
    """Direct preference optimisation (DPO / IPO / hinge) on preference pairs."""

    model: str = DEFAULT_MODEL
    """Policy to start from, usually an SFT checkpoint folder (the seed's --path)."""
    adapter: str | None = None
    """Start from this LoRA adapter (on --model): trained further with LoRA, merged into the weights with
    --full-finetune."""
    data: str = "tictactoe_dpo_template.jsonl"
    """One or more JSONL files of {prompt, chosen, rejected}, comma-separated."""
    epochs: float = 3.0
    batch_size: int = 8
    """Preference pairs per optimizer step per rank (2x as many sequences)."""
    chat_template: bool = False
    """Wrap string prompts as a user turn of the chat template (messages prompts always use it). Off by
    default: the ThinkTacToe data is raw text, as in the seed."""
    full_finetune: bool = True
    beta: float = 0.1
    """Inverse temperature: higher keeps the policy closer to the reference (IPO: tau)."""
    loss_type: str = "sigmoid"
    """sigmoid (DPO), ipo or hinge."""
    label_smoothing: float = 0.0
    """cDPO label-flip probability in [0, 0.5) (sigmoid only)."""
    reference: str = "auto"
    """auto, base (LoRA only: the base model with the adapter disabled) or copy (a frozen copy of the
    starting policy). auto: base for a fresh LoRA adapter, copy otherwise."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-6, lr_schedule="linear"))
    """Optimisation (--lr, --lr-schedule, --max-seq-len, ...: see TrainerConfig). Pairs whose prompt alone
    fills max_seq_len are dropped; longer ones lose completion tokens."""


def dpo(cfg: DPOTrainConfig) -> dict[str, Any]:
    return asyncio.run(_dpo(cfg))


def resolve_reference(reference: str, *, lora: bool, adapter: str | None) -> str:
    """"base" or "copy" for the ``--reference`` flag (see ``DPOTrainConfig.reference``)."""
    if reference not in REFERENCES:
        raise ValueError(f"reference must be one of {REFERENCES}, got {reference!r}")
    if reference == "auto":
        return "base" if lora and adapter is None else "copy"
    if reference == "base" and not lora:
        raise ValueError("reference='base' (adapter disabled) needs LoRA: use --no-full-finetune or --reference copy")
    return reference


def load_pairs(paths: list[str], tokenizer: Any, chat: bool, max_seq_len: int) -> tuple[list[tuple[Any, Any]], int]:
    """(pairs, number dropped because a prompt alone fills ``max_seq_len``)."""
    from ludic.training.dpo import dpo_items, read_dpo_records

    pairs, dropped = [], 0
    for path in paths:
        for rec in read_dpo_records(path):
            pair = dpo_items(rec, tokenizer, chat, pair_id=len(pairs) + dropped)
            if len(pair[0].prompt_ids) >= max_seq_len:
                dropped += 1
                continue
            pairs.append(pair)
    return pairs, dropped


async def _dpo(cfg: DPOTrainConfig) -> dict[str, Any]:
    from ludic.distributed import broadcast_object, init_distributed, shutdown_distributed
    from ludic.training.dpo import DPOLossConfig

    DPOLossConfig(beta=cfg.beta, loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing)  # fail fast
    reference = resolve_reference(cfg.reference, lora=not cfg.full_finetune, adapter=cfg.adapter)
    rank, world = init_distributed()
    run_dir = Path(broadcast_object(str(cfg.resolve_run_dir("dpo"))))
    model, tok = load_policy_for(cfg)
    if cfg.full_finetune and cfg.adapter is not None:
        model = model.merge_and_unload().requires_grad_(True)
    pairs, dropped = load_pairs(cfg.data_paths(), tok, cfg.chat_template, cfg.trainer.max_seq_len)
    if not pairs:
        raise ValueError(f"no preference pairs fit max_seq_len={cfg.trainer.max_seq_len} in {cfg.data}")
    if dropped and rank == 0:
        print(f"[ludic] dropped {dropped} pairs whose prompt alone fills max_seq_len={cfg.trainer.max_seq_len}")
    steps = cfg.steps_for(len(pairs), world)
    logger = open_offline_logger(cfg, run_dir, steps, "dpo")
    last = await dpo_stage(cfg, model, tok, pairs, run_dir, logger, steps, reference=reference)
    if logger is not None:
        logger.close()
    shutdown_distributed()
    return {**last, "run_dir": str(run_dir), "steps": steps, "num_pairs": len(pairs), "dropped_pairs": dropped,
            "reference": reference}


async def dpo_stage(
    cfg: DPOTrainConfig, model: Any, tok: Any, pairs: list, run_dir: Path, logger: Any, steps: int,
    *, reference: str = "copy",
) -> dict[str, Any]:
    """Run ``steps`` DPO optimizer steps on ``pairs`` (sharded over ranks); save to ``run_dir/final``.

    ``reference`` "copy" freezes a copy of ``model`` as it is now; "base" uses
    the LoRA base with the adapter disabled.
    """
    from ludic.rollouts.credit import ConstantCredit
    from ludic.training.algorithms import Algorithm
    from ludic.distributed import init_distributed
    from ludic.training.dpo import DPOLossConfig, PairBatchSource, make_dpo_objective
    from ludic.training.losses import LossConfig
    from ludic.training.trainer import Trainer

    rank, world = init_distributed()
    loss_cfg = DPOLossConfig(beta=cfg.beta, loss_type=cfg.loss_type, label_smoothing=cfg.label_smoothing)
    ref_model = copy.deepcopy(model).eval().requires_grad_(False) if reference == "copy" else None
    source = PairBatchSource(pairs, cfg.batch_size, seed=cfg.seed, rank=rank, world_size=world)
    tcfg = replace(cfg.trainer, total_steps=cfg.trainer.total_steps or steps)
    algorithm = Algorithm("dpo", ConstantCredit(), LossConfig(kind="sft"))  # only its name is used
    trainer = Trainer(model, algorithm, source, tcfg, logger=None, checkpoint_dir=run_dir / "checkpoints",
                      tokenizer=tok, ref_model=ref_model, pad_token_id=tok.pad_token_id,
                      objective=make_dpo_objective(loss_cfg), group_key="pair_id")
    if cfg.resume:
        trainer.resume()
    last: dict[str, Any] = {}
    keys = ("loss", "rewards/chosen", "rewards/rejected", "rewards/accuracy", "rewards/margin")

    def on_step(step: int, metrics: dict[str, Any]) -> None:
        nonlocal last
        last = {k: metrics[k] for k in keys if k in metrics}
        last.update(grad_norm=metrics["grad_norm"], learning_rate=metrics["lr"], num_tokens=metrics["train_tokens"],
                    epoch=step * cfg.batch_size * world / len(pairs),
                    train_tokens_per_s=metrics["train_tokens_per_s"], step_s=metrics["step_s"])
        if logger is not None and (step % cfg.log_every == 0 or step == steps):
            logger.log(step, last)

    await trainer.train(steps, on_step)
    if rank == 0:
        if cfg.final_save:
            trainer.save()
            final = run_dir / "final"
            model.save_pretrained(final)
            tok.save_pretrained(final)
        if last:  # a resumed, already finished run keeps its summary
            (run_dir / "summary.json").write_text(json.dumps(last, indent=2))
    return last
