"""The objective of a micro-batch: score the action tokens with the policy (and its value head, and the
reference policy when the loss needs them), then apply the algorithm's loss (``compute_loss``). The
``Trainer`` calls ``trainer.objective(trainer, micro_batch, totals)``; ``policy_gradient_objective`` is the
default, and a recipe may pass its own."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable

import torch

from ludic.training.losses import LossInputs, compute_loss
from ludic.training.microbatch import MicroBatch
from ludic.training.scoring import score_actions, score_hidden
from ludic.training.value import segment_starts, value_head

if TYPE_CHECKING:
    from ludic.training.trainer import Trainer

Objective = Callable[[Any, MicroBatch, dict[str, float]], tuple[torch.Tensor, dict[str, torch.Tensor]]]


def policy_gradient_objective(
    trainer: "Trainer", mb: MicroBatch, totals: dict[str, float]
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Score the action tokens and apply ``trainer.algorithm.loss`` (``compute_loss``)."""
    loss_cfg = trainer.algorithm.loss
    values = value_old = value_target = None
    ref_logp = trainer.ref_logp(mb) if loss_cfg.needs_ref_logp else None  # first: a snapshot reference swaps weights
    if loss_cfg.needs_values:
        head = value_head(trainer.model)
        if head is None:
            raise ValueError(f"vf_coef={loss_cfg.vf_coef}: the model has no value head (attach_value_head)")
        logp, entropy, hidden = score_hidden(trainer.model, mb, need_entropy=loss_cfg.needs_entropy,
                                             bottom=trainer.bottom_cache)
        values = head(hidden[segment_starts(mb.seg, len(mb.items))])
        value_old, value_target = (_meta_tensor(mb, key) for key in ("value_old", "value_target"))
    else:
        logp, entropy = score_actions(trainer.model, mb, need_entropy=loss_cfg.needs_entropy,
                                      bottom=trainer.bottom_cache)
    old = mb.old_logp
    if old is None and loss_cfg.needs_old_logp:
        old = logp.detach()  # offline data: on-policy ratio of 1
    elif old is not None and bool(torch.isnan(old).any()):
        # NaN = the sampler's log-prob is unknown (a reply the policy did not sample, e.g. an exploring move
        # of FunctionClient(logprob=nan)): score it with a ratio of 1, as if on-policy
        old = torch.where(torch.isnan(old), logp.detach(), old)
    inp = LossInputs(
        logp=logp, adv=mb.adv, seg=mb.seg, total_tokens=totals["tokens"], total_segments=totals["segments"],
        old_logp=old, ref_logp=ref_logp, entropy=entropy, max_tokens=totals["max_tokens"],
        adv_mean=totals["adv_mean"], adv_std=totals["adv_std"], token_adv=mb.token_adv, seg_weight=mb.seg_weight,
        same_version=None if mb.versions is None else mb.versions == trainer.policy_version,
        values=values, value_old=value_old, value_target=value_target,
    )
    return compute_loss(inp, loss_cfg)


def _meta_tensor(mb: MicroBatch, key: str) -> torch.Tensor:
    """[S] float of ``item.meta[key]`` (a credit assigner's per-turn extra, e.g. GAE's value target)."""
    missing = [i for i, it in enumerate(mb.items) if key not in it.meta]
    if missing:
        raise ValueError(f"item {missing[0]} of the micro-batch has no meta[{key!r}]: the value loss needs a credit "
                         f"assigner that gives per-turn value targets (GAE) and one item per turn")
    return torch.tensor([float(it.meta[key]) for it in mb.items], dtype=torch.float32, device=mb.adv.device)


# Stats from compute_loss that are this micro-batch's share of a batch total (summed);
# every other stat is a per-token mean (averaged, weighted by tokens).
SUMMED_STATS = {"loss", "policy_loss", "kl_loss", "entropy_loss", "value_loss", "sampler_tokens"}
