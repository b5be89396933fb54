"""Per-row sampling of the next token from a batch's logits (``TransformersEngine``'s decode steps).

``sample`` applies each row's temperature, top-k and top-p and draws by inverse CDF from the row's own seeded
generator (``generator``), so a seeded row gives the same token whatever else is in the batch; ``inverse_cdf``
is the two-level draw over a 49,152-token vocabulary.
"""

from __future__ import annotations

import random

import torch


def generator(seed: int | None) -> torch.Generator:
    g = torch.Generator()
    g.manual_seed(seed if seed is not None else random.getrandbits(63))
    return g


def sample(
    logits: torch.Tensor, temps: torch.Tensor, top_ps: torch.Tensor, top_ks: torch.Tensor,
    gens: list[torch.Generator],
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row temperature / top-k / top-p sampling by inverse CDF; temperature 0 is greedy.

    logits: [B, V] float32 -> (token ids [B], their log-probs [B] in the distribution drawn from:
    log_softmax of the scaled, truncated logits; temperature-1 log-probs for greedy rows). Each row
    draws one uniform number from its own generator (``inverse_cdf``), so a seeded row gives the
    same token whatever else is in the batch. About 1 ms a step for 16 rows of a 49152-token
    vocabulary, against 5.4 ms for Gumbel-max (V random numbers and two logs per row).
    """
    greedy = temps <= 0
    scaled = logits
    if bool((temps != 1).any()):
        scaled = logits / torch.where(greedy, torch.ones_like(temps), temps.clamp(min=1e-6))[:, None]
    if bool((top_ks > 0).any()):
        k = top_ks.clamp(min=1, max=logits.shape[-1])
        kth = scaled.sort(dim=-1, descending=True).values.gather(1, (k - 1)[:, None])
        scaled = scaled.masked_fill(((top_ks > 0) & ~greedy)[:, None] & (scaled < kth), float("-inf"))
    if bool((top_ps < 1).any()):
        probs = torch.softmax(scaled, dim=-1)
        sorted_p, order = probs.sort(dim=-1, descending=True)
        drop_sorted = (sorted_p.cumsum(-1) - sorted_p) >= top_ps[:, None]  # keep the first token always
        drop = torch.zeros_like(drop_sorted).scatter(1, order, drop_sorted) & ~greedy[:, None]
        scaled = scaled.masked_fill(drop, float("-inf"))
    # probabilities up to their sum (exp of the max-shifted logits): the draw needs no normalised
    # distribution, and the chosen token's log-prob is its shifted logit minus log(sum)
    top = scaled.max(dim=-1, keepdim=True).values
    probs = (scaled - top).exp_()
    u = torch.tensor([torch.rand(1, generator=g, dtype=torch.float64).item() for g in gens],
                     dtype=torch.float64, device=logits.device)
    chosen, total = inverse_cdf(probs, u)
    if bool(greedy.any()):
        chosen = torch.where(greedy, logits.argmax(dim=-1), chosen)
    logp = scaled.gather(1, chosen[:, None])[:, 0] - top[:, 0] - total.log().float()
    return chosen, logp


def inverse_cdf(probs: torch.Tensor, u: torch.Tensor, block: int = 256) -> tuple[torch.Tensor, torch.Tensor]:
    """For each row of ``probs`` [B, V] (non-negative, not necessarily normalised), the index i with
    cdf[i-1] <= u * total < cdf[i], for ``u`` [B] in [0, 1): a draw from the row's distribution that
    never returns a zero-probability index; and the row's total [B] (float64). Two levels: the sums
    of ``block``-token blocks (fp32 vectorised sums, about 1e-7 relative error, as the fp32
    probabilities themselves have) and their float64 running total pick a block, then a float64
    running sum inside that block only, onto which the residual is rescaled (the two sums of a block
    differ by rounding). A full fp32 cumsum over V is a sequential pass and loses ~1e-5 of the mass
    over 49152 terms; block sums in float64 (a cast of every probability) took 1.2 ms of a 2.5 ms
    sampling step for 16 x 49152 logits, fp32 block sums 0.02 ms."""
    B, V = probs.shape
    nb = -(-V // block)
    if nb * block != V:
        probs = torch.nn.functional.pad(probs, (0, nb * block - V))
    blocks = probs.view(B, nb, block)
    sums = blocks.sum(-1)  # [B, nb] fp32
    ends = sums.double().cumsum(-1)
    target = (u * ends[:, -1])[:, None]
    b = torch.searchsorted(ends, target, right=True).clamp(max=nb - 1)  # [B, 1]; its block has mass > 0
    before = torch.where(b > 0, ends.gather(1, (b - 1).clamp(min=0)), torch.zeros_like(target))
    inner = blocks[torch.arange(B, device=probs.device), b[:, 0]].double().cumsum(-1)  # [B, block]
    resid = (target - before) * (inner[:, -1:] / sums.gather(1, b).double())
    j = torch.searchsorted(inner, resid, right=True)
    last = (inner < inner[:, -1:]).sum(-1, keepdim=True)  # the block's last index with mass (rounding guard)
    return (b * block + torch.minimum(j, last))[:, 0], ends[:, -1]
