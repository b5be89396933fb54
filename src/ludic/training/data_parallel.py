"""Data parallel pieces of a trainer step: every rank trains on its own share of the batch, and these make
the step the same as one process training on the whole batch (``Trainer._optimize`` calls them).

- ``global_totals``: the batch-wide normalisers (trained tokens, episodes, advantage mean and spread)
  summed over ranks, so that micro-batch losses on any rank sum to the single-process batch loss;
- ``all_reduce_grads``: sum the gradients over ranks (plain data parallel), or turn FSDP2's
  reduce-scattered mean into that sum;
- ``idle_forward_backward``: a rank with no items still joins FSDP2's collectives;
- ``sum_over_ranks``: the summed statistics (loss terms) of the global batch, for the log.

Single process: every function is the identity or a local sum.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from ludic.distributed import is_distributed, is_sharded, reduce_floats
from ludic.training.objective import SUMMED_STATS
from ludic.types import SAWItem


def global_totals(items: list[SAWItem], norm_max_tokens: int | None = None) -> dict[str, float]:
    """Normalisers over the global batch: trained ``tokens``, ``segments`` (episodes: each counts once),
    the number of items, the longest item (or ``norm_max_tokens``: Dr.GRPO's constant) and the weights'
    mean and standard deviation."""
    weights = [it.weight for it in items]
    tokens, segs, s1, s2, n_items = reduce_floats([
        sum(it.num_action_tokens for it in items),
        sum(it.episode_share for it in items),
        sum(weights),
        sum(w * w for w in weights),
        len(items),
    ])
    longest = reduce_floats([max((it.num_action_tokens for it in items), default=1)], op="max")[0]
    mean = s1 / n_items if n_items else 0.0
    var = max(s2 / n_items - mean * mean, 0.0) if n_items else 0.0
    return {
        "tokens": max(tokens, 1.0), "segments": max(segs, 1.0), "segments_raw": n_items,
        "max_tokens": float(norm_max_tokens or longest),
        "adv_mean": mean, "adv_std": math.sqrt(var),
    }


def all_reduce_grads(model: Any, optimizer: torch.optim.Optimizer) -> None:
    """Sum gradients over ranks (plain data parallel; FSDP reduce-scatters its own mean, made a sum here).

    Every rank takes part, also one that had no items: its gradient is zero.
    """
    if not is_distributed():
        return
    import torch.distributed as dist

    if is_sharded(model):  # FSDP reduce-scattered the mean; the normalisers want the sum
        world = dist.get_world_size()
        for p in model.parameters():
            if p.grad is not None:
                p.grad.mul_(world)
        return

    params = [p for g in optimizer.param_groups for p in g["params"]]
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    grads = [p.grad for p in params]
    flat = torch.cat([g.reshape(-1).float() for g in grads])
    dist.all_reduce(flat)
    offset = 0
    for g in grads:
        n = g.numel()
        g.copy_(flat[offset : offset + n].view_as(g).to(g.dtype))
        offset += n


def idle_forward_backward(model: Any, pad_token_id: int, device: Any) -> None:
    """A zero-weight forward/backward on one token, so a rank without items joins FSDP's collectives."""
    ids = torch.full((1, 2), pad_token_id, dtype=torch.long, device=device)
    out = model(input_ids=ids, attention_mask=torch.ones_like(ids))
    (out.logits.float().sum() * 0.0).backward()


def token_means_over_ranks(weighted: dict[str, float], n_tok: float) -> dict[str, float]:
    """Token-weighted stats (``kl``, ``entropy``, clip fractions: each a sum of value x tokens) as means
    over the global batch's tokens, so a distributed step logs what one process would, not rank 0's share."""
    if not is_distributed():
        return {k: v / max(n_tok, 1) for k, v in weighted.items()}
    import torch.distributed as dist

    names: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(names, sorted(weighted))
    keys = sorted(set().union(*names))
    t = reduce_floats([weighted.get(k, 0.0) for k in keys] + [float(n_tok)])
    return {k: t[i] / max(t[-1], 1.0) for i, k in enumerate(keys)}


def sum_over_ranks(sums: dict[str, float]) -> dict[str, float]:
    """The summed stats (loss terms with whole-batch normalisers) of the global batch: the loss a
    distributed step logs is the single-process loss, not this rank's share."""
    if not is_distributed():
        return sums
    keys = sorted(SUMMED_STATS)
    t = reduce_floats([sums.get(k, 0.0) for k in keys] + [float(k in sums) for k in keys])
    n = len(keys)
    return {k: float(t[i]) for i, k in enumerate(keys) if t[n + i] > 0}
