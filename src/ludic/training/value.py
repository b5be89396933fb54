"""A value head on the policy, for PPO with GAE.

The head is one linear layer on the decoder's final hidden state, read at the last prompt
token of a turn (the position that predicts the turn's first action token): V(s_t) for the
state the agent saw. It lives on the policy model as ``model.value_head`` (fp32), so it trains
with the LoRA parameters in the same optimizer and is saved with the trainer's checkpoints.

Samplers (vLLM, the in-process engine) return no values, so ``ValueFunction`` runs a no-grad
pass on the learner over each turn's prompt before credit assignment: the ``GAE`` credit
assigner calls it with the batch's rollouts. During the update the same position's hidden state
(already computed for the log-probs) gives the values the value loss trains.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ludic.types import Rollout, SAWItem


class ValueHead(nn.Module):
    """``hidden [.., H] -> value [..]``: a linear layer, zero-initialised (V = 0 at the start)."""

    def __init__(self, hidden_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(hidden_size, 1)
        nn.init.zeros_(self.proj.weight)
        nn.init.zeros_(self.proj.bias)

    def forward(self, hidden: Tensor) -> Tensor:
        return self.proj(hidden.float()).squeeze(-1)


def attach_value_head(model: Any) -> ValueHead:
    """Give ``model`` (peft-wrapped or not) a trainable ``value_head`` (fp32); returns it."""
    existing = value_head(model)
    if existing is not None:
        return existing
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    if hidden is None:
        raise ValueError(f"attach_value_head: {type(model).__name__} has no config.hidden_size")
    head = ValueHead(int(hidden)).to(next(model.parameters()).device)
    model.value_head = head  # a registered submodule: in parameters(), state_dict(), the optimizer
    return head


def value_head(model: Any) -> ValueHead | None:
    """The model's value head, or None."""
    head = getattr(model, "value_head", None)
    return head if isinstance(head, ValueHead) else None


def segment_starts(seg: Tensor, num_segments: int) -> Tensor:
    """Index of each segment's first token in a flat ``seg`` [N] (segments in order, each non-empty)."""
    counts = torch.bincount(seg, minlength=num_segments)
    if bool((counts == 0).any()):
        raise ValueError("segment_starts: a segment has no action token (nothing to read its value from)")
    return torch.cumsum(counts, 0) - counts


class ValueFunction:
    """``rollouts -> {(rollout id, step index): V(s_t)}`` from the learner's value head, no grad.

    Each step's prompt (its trace's ``prompt_ids``) plus its first sampled token is scored in
    micro-batches of ``micro_token_budget`` tokens; the value is read where the logits of that
    first token come from, the same position the training pass reads it from.
    """

    def __init__(self, model: Any, pad_token_id: int, micro_token_budget: int = 8192) -> None:
        if value_head(model) is None:
            raise ValueError("ValueFunction: the model has no value head (attach_value_head first)")
        self.model, self.pad_token_id, self.budget = model, pad_token_id, micro_token_budget

    @torch.no_grad()
    def __call__(self, rollouts: Sequence[Rollout]) -> dict[tuple[str, int], float]:
        items = [SAWItem(s.trace.prompt_ids, s.trace.completion_ids[:1], 0.0,
                         meta={"key": (r.id, s.index)})
                 for r in rollouts for s in r.steps if s.trace is not None and s.trace.completion_ids]
        return {key: v for key, v in zip([it.meta["key"] for it in items], self.values(items))}

    @torch.no_grad()
    def values(self, items: Sequence[SAWItem]) -> list[float]:
        """V at the position predicting each item's first completion token."""
        from ludic.training.microbatch import collate, split_by_token_budget
        from ludic.training.scoring import score_hidden
        from ludic.training.packed import packable

        head = value_head(self.model)
        assert head is not None
        device = next(self.model.parameters()).device
        out: dict[int, float] = {}
        index = {id(it): i for i, it in enumerate(items)}
        was_training = self.model.training
        self.model.eval()
        try:
            for group in split_by_token_budget(list(items), self.budget, flat=packable(self.model)):
                mb = collate(group, self.pad_token_id, device)
                _, _, h = score_hidden(self.model, mb)
                v = head(h[segment_starts(mb.seg, len(group))])
                for it, x in zip(group, v.tolist()):
                    out[index[id(it)]] = float(x)
        finally:
            self.model.train(was_training)
        return [out[i] for i in range(len(items))]
