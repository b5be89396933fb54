r"""Direct preference optimisation: the loss, preference pairs as SAWItems, and a Trainer objective.

For preference pair i (prompt x, chosen y_c, rejected y_r), with sequence
log-probs summed over the completion tokens under the policy pi and the
frozen reference pi_ref:

    c_i = log pi(y_c | x) - log pi_ref(y_c | x)        chosen log-ratio
    r_i = log pi(y_r | x) - log pi_ref(y_r | x)        rejected log-ratio
    d_i = c_i - r_i
    chosen reward  = beta * c_i,  rejected reward = beta * r_i   (no gradient; logged)

Per-pair loss l_i for each ``loss_type`` (eps = ``label_smoothing``):

    sigmoid  l_i = -(1 - eps) * log sigma(beta d_i) - eps * log sigma(-beta d_i)
             (DPO; eps > 0 is conservative DPO, cDPO: labels flipped with probability eps)
    hinge    l_i = max(0, 1 - beta d_i)                                          (SLiC)
    ipo      l_i = (c_i / |y_c| - r_i / |y_r| - 1 / (2 beta))^2                 (IPO)

IPO uses per-token (length-normalised) log-ratios, |y| = number of completion
tokens (at least 1), as TRL does; beta is the paper's tau. These are TRL 1.16's
``DPOTrainer`` losses ("sigmoid", "hinge", "ipo") term for term. TRL 1.16 no
longer applies ``label_smoothing`` to "sigmoid" (only its "robust" / "exo_pair"
/ "aot" losses read it); the cDPO form above is the one older TRL used and the
one its "aot" loss still uses (equal to it for a single pair).

The batch loss is the mean over pairs. ``make_dpo_objective`` computes each
micro-batch's share, ``sum of its pairs' losses / pairs in the whole batch``,
so micro-batch losses (and gradients) sum to the batch loss. A pair's two
items must share a micro-batch: give the Trainer ``group_key="pair_id"``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from ludic.data.jsonl import read_jsonl
from ludic.data.offline import OfflineBatchSource, prompt_ids_for
from ludic.tokenization import encode, render_ids
from ludic.training.microbatch import MicroBatch
from ludic.training.scoring import score_actions
from ludic.types import SAWBatch, SAWItem

DPO_LOSS_TYPES = ("sigmoid", "ipo", "hinge")
ROLES = ("chosen", "rejected")


def dpo_loss(
    policy_chosen: Tensor,
    policy_rejected: Tensor,
    ref_chosen: Tensor,
    ref_rejected: Tensor,
    *,
    beta: float = 0.1,
    loss_type: str = "sigmoid",
    label_smoothing: float = 0.0,
    chosen_len: Tensor | None = None,
    rejected_len: Tensor | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per-pair DPO loss (see the module docstring for the formulas).

    Args:
        policy_chosen, policy_rejected: [P] sequence log-probs under the policy (carry grad).
        ref_chosen, ref_rejected: [P] sequence log-probs under the reference.
        beta: inverse temperature (IPO: the regularisation tau).
        loss_type: "sigmoid" | "ipo" | "hinge".
        label_smoothing: cDPO label-flip probability in [0, 0.5) ("sigmoid" only).
        chosen_len, rejected_len: [P] completion token counts (required by "ipo").

    Returns:
        (per_pair_loss [P], chosen_rewards [P], rejected_rewards [P]); rewards are detached.
    """
    _check_loss_args(beta, loss_type, label_smoothing)
    shape = policy_chosen.shape
    for name, t in (("policy_rejected", policy_rejected), ("ref_chosen", ref_chosen), ("ref_rejected", ref_rejected)):
        if t.shape != shape:
            raise ValueError(f"dpo_loss: {name} shape {tuple(t.shape)} != policy_chosen shape {tuple(shape)}")
    chosen_ratio = policy_chosen - ref_chosen
    rejected_ratio = policy_rejected - ref_rejected
    delta = chosen_ratio - rejected_ratio
    if loss_type == "sigmoid":
        loss = -F.logsigmoid(beta * delta)
        if label_smoothing:
            loss = (1 - label_smoothing) * loss - label_smoothing * F.logsigmoid(-beta * delta)
    elif loss_type == "hinge":
        loss = torch.relu(1 - beta * delta)
    else:  # ipo
        if chosen_len is None or rejected_len is None:
            raise ValueError("dpo_loss: loss_type='ipo' needs chosen_len and rejected_len (completion token counts)")
        c_len = torch.as_tensor(chosen_len, dtype=chosen_ratio.dtype, device=chosen_ratio.device).clamp(min=1.0)
        r_len = torch.as_tensor(rejected_len, dtype=chosen_ratio.dtype, device=chosen_ratio.device).clamp(min=1.0)
        loss = (chosen_ratio / c_len - rejected_ratio / r_len - 1 / (2 * beta)) ** 2
    return loss, beta * chosen_ratio.detach(), beta * rejected_ratio.detach()


def _check_loss_args(beta: float, loss_type: str, label_smoothing: float) -> None:
    if loss_type not in DPO_LOSS_TYPES:
        raise ValueError(f"DPO loss_type={loss_type!r} is not one of {DPO_LOSS_TYPES}")
    if not beta > 0:
        raise ValueError(f"DPO beta must be > 0, got {beta}")
    if not 0.0 <= label_smoothing < 0.5:
        raise ValueError(f"DPO label_smoothing must be in [0, 0.5), got {label_smoothing}")
    if label_smoothing and loss_type != "sigmoid":
        raise ValueError(f"DPO label_smoothing applies to loss_type='sigmoid' only, not {loss_type!r}")


@dataclass(frozen=True)
class DPOLossConfig:
    """Which preference loss to use (validated on construction)."""

    beta: float = 0.1
    """Inverse temperature; higher keeps the policy closer to the reference (IPO: tau)."""
    loss_type: str = "sigmoid"
    """"sigmoid" (DPO) | "ipo" | "hinge"."""
    label_smoothing: float = 0.0
    """cDPO label-flip probability in [0, 0.5), "sigmoid" only."""

    def __post_init__(self) -> None:
        _check_loss_args(self.beta, self.loss_type, self.label_smoothing)


# ---------------------------------------------------------------- data


def _check_dpo(record: dict[str, Any]) -> str | None:
    prompt = record.get("prompt")
    if isinstance(prompt, list):
        if not prompt or not all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in prompt
        ):
            return "'prompt' as a list must be non-empty {role, content} messages"
    elif not isinstance(prompt, str):
        return "needs 'prompt': a string or a list of {role, content} messages"
    for key in ROLES:
        if not isinstance(record.get(key), str) or not record[key]:
            return f"needs {key!r}: a non-empty string"
    return None


def read_dpo_records(path: str | Path) -> list[dict[str, Any]]:
    """Preference records ``{"prompt": str | messages, "chosen": str, "rejected": str}`` (bad lines name file:line)."""
    return read_jsonl(path, validate=_check_dpo)


def _completion_ids(text: str, tokenizer: Any) -> list[int]:
    ids = encode(tokenizer, text)
    eos = tokenizer.eos_token_id
    if eos is not None and ids[-1:] != [eos]:
        ids.append(eos)  # as TRL: every completion ends with EOS (the chat template's end of turn)
    return ids


def dpo_items(record: dict[str, Any], tokenizer: Any, chat: bool = True, pair_id: Any = 0) -> tuple[SAWItem, SAWItem]:
    """One preference record -> (chosen item, rejected item) sharing the prompt ids.

    A messages-list prompt always gets the chat template; a string prompt gets
    it when ``chat`` (as one user turn), else it is raw text. Completions end
    with EOS. Items have weight 1 and meta ``{"pair_id", "role"}``.
    """
    prompt = record["prompt"]
    if isinstance(prompt, list):
        prompt_ids = render_ids(tokenizer, prompt)
    else:
        prompt_ids = prompt_ids_for({"prompt": prompt}, tokenizer, chat)
    return tuple(  # type: ignore[return-value]
        SAWItem(tuple(prompt_ids), tuple(_completion_ids(record[role], tokenizer)), 1.0,
                meta={"pair_id": pair_id, "role": role})
        for role in ROLES
    )


class PairBatchSource(OfflineBatchSource):
    """OfflineBatchSource over (chosen, rejected) pairs: shuffles, shards and batches whole pairs.

    ``pairs_per_batch`` pairs (2x as many items) per step and rank; resumable
    like ``OfflineBatchSource``.
    """

    def __init__(self, pairs: Sequence[tuple[SAWItem, SAWItem]], pairs_per_batch: int, **kw: Any) -> None:
        super().__init__(pairs, pairs_per_batch, **kw)  # type: ignore[arg-type]

    async def next_batch(self) -> SAWBatch:
        pairs: list[Any] = self._take()
        items = [it for pair in pairs for it in pair]
        return SAWBatch(items=items, meta={"epoch": self.epoch, "num_pairs": len(pairs)})


# ---------------------------------------------------------------- objective


def pair_indices(items: Sequence[SAWItem]) -> tuple[list[int], list[int]]:
    """Positions of the chosen and rejected item of each pair (in order of first appearance)."""
    found: dict[str, dict[Any, int]] = {"chosen": {}, "rejected": {}}
    for i, it in enumerate(items):
        role, pid = it.meta.get("role"), it.meta.get("pair_id")
        if role not in ROLES or pid is None:
            raise ValueError(f"DPO item {i} needs meta 'pair_id' and 'role' (chosen/rejected), got {it.meta!r}")
        if pid in found[role]:
            raise ValueError(f"DPO pair {pid!r} has two {role} items in one micro-batch")
        found[role][pid] = i
    chosen, rejected = found["chosen"], found["rejected"]
    if chosen.keys() != rejected.keys():
        odd = sorted(map(str, chosen.keys() ^ rejected.keys()))
        raise ValueError(f"DPO pairs split or incomplete in a micro-batch: {odd[:5]} (use group_key='pair_id')")
    order = list(chosen)
    return [chosen[p] for p in order], [rejected[p] for p in order]


def sequence_logps(token_logp: Tensor, seg: Tensor, num_items: int) -> Tensor:
    """[B] sums of per-token log-probs by item (``seg``)."""
    return token_logp.new_zeros(num_items).index_add(0, seg, token_logp)


def make_dpo_objective(
    cfg: DPOLossConfig | None = None,
) -> Callable[[Any, MicroBatch, dict[str, float]], tuple[Tensor, dict[str, Tensor]]]:
    """A Trainer ``objective``: DPO loss of the micro-batch's pairs / pairs in the whole batch.

    References come from ``trainer.ref_logp(mb)`` (``training.reference``), scored before the policy's
    forward. Stats ("rewards/*") are means over the
    micro-batch's pairs ("loss" is its share of the batch loss).
    """
    cfg = cfg or DPOLossConfig()

    def dpo_objective(trainer: Any, mb: MicroBatch, totals: dict[str, float]) -> tuple[Tensor, dict[str, Tensor]]:
        ci, ri = pair_indices(mb.items)
        n = len(mb.items)
        with torch.no_grad():  # first: a snapshot reference swaps weights in place
            ref_tok = trainer.ref_logp(mb)
        logp, _ = score_actions(trainer.model, mb, bottom=trainer.bottom_cache)
        ref_tok = ref_tok.to(logp.dtype)
        seq = sequence_logps(logp, mb.seg, n)
        ref = sequence_logps(ref_tok, mb.seg, n)
        lens = torch.bincount(mb.seg, minlength=n).to(logp.dtype)
        c = torch.tensor(ci, dtype=torch.long, device=seq.device)
        r = torch.tensor(ri, dtype=torch.long, device=seq.device)
        per_pair, chosen_rw, rejected_rw = dpo_loss(
            seq[c], seq[r], ref[c], ref[r], beta=cfg.beta, loss_type=cfg.loss_type,
            label_smoothing=cfg.label_smoothing, chosen_len=lens[c], rejected_len=lens[r],
        )
        total_pairs = totals["segments"] / 2
        loss = per_pair.sum() / total_pairs
        margin = chosen_rw - rejected_rw
        stats = {
            "loss": loss.detach(),
            "rewards/chosen": chosen_rw.mean(),
            "rewards/rejected": rejected_rw.mean(),
            "rewards/accuracy": (margin > 0).float().mean(),
            "rewards/margin": margin.mean(),
        }
        return loss, stats

    return dpo_objective


__all__ = [
    "DPO_LOSS_TYPES", "DPOLossConfig", "PairBatchSource", "dpo_items", "dpo_loss", "make_dpo_objective",
    "pair_indices", "read_dpo_records", "sequence_logps",
]
