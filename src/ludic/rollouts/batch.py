"""From rollouts to SAW items, and the batch sources the trainer pulls from.

``build_saw_items`` turns the trained steps of each rollout into SAW items:
the exact prompt ids as state, the exact sampled ids as action, the credit as
weight, the sampler's log-probs and policy versions for importance
correction. Failed episodes (inference errors, env exceptions) and rollouts
of frozen opponents (``meta["trainable"] = False``) give no items; credit
never sees them.

Multi-turn episodes, two modes (chosen per rollout, automatically):

* **one sequence per episode** when every turn's prompt extends the previous
  turn's prompt + completion token for token (``FullDialog`` with token-in).
  The sampled tokens of all turns are trained; the template, environment and
  opponent tokens between them are in the sequence but masked. The whole
  history is read once instead of once per turn, and the episode is one
  item, so it counts once in the loss.
* **one item per turn** when the context rewrites history
  (``TruncatedThinkingContext``, ``LastObservationContext``): each turn's
  prompt is a different text, so it must be scored on its own. Each of an
  episode's n items gets ``episode_share = 1/n``, and the per-sequence loss
  normalisers count episodes, not items: an episode counts once whatever its
  number of turns. (Token-level aggregation, DAPO's, stays a token mean.)

A rollout whose chain breaks part way (a context that fell back to
re-rendering) gives one item per maximal run of extending turns.

Batch sources implement ``async next_batch() -> SAWBatch``:
    RolloutBatchSource   synchronous RL: generate, assign credit, return
    OfflineBatchSource   SFT-style data from JSONL (see ludic.data)
    (Redis pipeline sources live in ludic.pipeline)
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Protocol, Sequence

from ludic.rollouts.credit import CreditAssigner
from ludic.rollouts.engine import IdentityStrategy, RequestStrategy, RolloutEngine, outcome_counts
from ludic.types import Rollout, RolloutRequest, SAWBatch, SAWItem, Step

SampleFilter = Callable[[SAWItem], bool]
"""True keeps the item."""


class BatchSource(Protocol):
    """Where the trainer's batches come from."""

    async def next_batch(self) -> SAWBatch: ...


def _extends(prev: Step, cur: Step) -> bool:
    """True when ``cur``'s prompt starts with ``prev``'s prompt + completion, token for token."""
    a, b = prev.trace, cur.trace
    assert a is not None and b is not None
    n = len(a.prompt_ids) + len(a.completion_ids)
    same_sampling = (a.scoring_temperature, a.top_p, a.top_k) == (b.scoring_temperature, b.top_p, b.top_k)
    return same_sampling and len(b.prompt_ids) >= n and b.prompt_ids[:n] == a.prompt_ids + a.completion_ids


def turn_chains(steps: Sequence[Step], merge: bool = True) -> list[list[Step]]:
    """The trained steps (with sampled tokens) grouped into maximal runs of extending prompts."""
    chains: list[list[Step]] = []
    for s in steps:
        if s.trace is None or not s.trace.completion_ids:
            continue
        if merge and chains and _extends(chains[-1][-1], s):
            chains[-1].append(s)
        else:
            chains.append([s])
    return chains


def _item_meta(r: Rollout, chain: list[Step]) -> dict[str, Any]:
    last = chain[-1]
    assert last.trace is not None
    return {
        "rollout_id": r.id, "step_index": chain[0].index, "turns": len(chain),
        "group_id": r.meta.get("group_id"), "agent_id": r.meta.get("agent_id"),
        "reward": sum(s.reward for s in chain), "total_reward": r.total_reward,
        "finish_reason": last.trace.finish_reason.value, "parse_error": any(s.parse_error for s in chain),
        "truncated": last.truncated, "terminated": last.terminated,
    }


def _chain_item(r: Rollout, chain: list[Step], weights: dict, share: float) -> SAWItem:
    """One item for a run of turns; a single turn is a plain (unmasked) item."""
    first = chain[0].trace
    assert first is not None
    sampling = {"temperature": first.scoring_temperature, "top_p": first.top_p, "top_k": first.top_k}
    if len(chain) == 1:
        return SAWItem(
            prompt_ids=first.prompt_ids, completion_ids=first.completion_ids, weight=weights[chain[0].index],
            logprobs=first.logprobs, policy_versions=first.policy_versions, meta=_item_meta(r, chain),
            episode_share=share, **sampling,
        )
    ids: list[int] = []
    mask: list[int] = []
    logps: list[float] = []
    versions: list[int] = []
    tw: list[float] = []
    seen = len(first.prompt_ids)  # tokens of the full sequence already laid out
    for s in chain:
        t = s.trace
        assert t is not None
        glue = t.prompt_ids[seen:]  # template, env and opponent text since the last completion
        ids += glue
        mask += [0] * len(glue)
        logps += [0.0] * len(glue)
        versions += [-1] * len(glue)
        tw += [0.0] * len(glue)
        n = len(t.completion_ids)
        ids += t.completion_ids
        mask += [1] * n
        logps += t.logprobs
        versions += t.policy_versions
        tw += [weights[s.index]] * n
        seen = len(t.prompt_ids) + n
    turn_w = [weights[s.index] for s in chain]
    return SAWItem(
        prompt_ids=first.prompt_ids, completion_ids=tuple(ids), weight=sum(turn_w) / len(turn_w),
        logprobs=tuple(logps), policy_versions=tuple(versions), meta=_item_meta(r, chain),
        action_mask=tuple(mask), token_weights=tuple(tw), episode_share=share, **sampling,
    )


def is_trained(r: Rollout) -> bool:
    """False for the rollout of a frozen opponent (``meta["trainable"] = False``)."""
    return r.meta.get("trainable", True) is not False


def build_saw_items(
    rollouts: Sequence[Rollout], credit: CreditAssigner, *, merge_turns: bool = True
) -> list[SAWItem]:
    """SAW items of the usable rollouts (not failed, not a frozen opponent's): one per episode or
    one per turn (module doc).

    ``merge_turns=False`` forces one item per turn everywhere (for comparisons).
    """
    if getattr(credit, "needs_turn_items", False) and merge_turns:
        raise ValueError(f"{credit!r} gives each turn its own value: build one item per turn (merge_turns=False)")
    usable = [r for r in rollouts if not r.meta.get("failed") and is_trained(r)]
    weights = credit.compute(usable)
    extras = getattr(credit, "step_extras", None) or {}
    items = []
    for r in usable:
        w = {}
        for s in r.steps:
            if s.trace is None or not s.trace.completion_ids:
                continue
            v = float(weights[(r.id, s.index)])
            if not math.isfinite(v):
                raise ValueError(f"credit for rollout {r.id} step {s.index} is not finite: {v}")
            w[s.index] = v
        chains = turn_chains(r.steps, merge_turns)
        for chain in chains:
            item = _chain_item(r, chain, w, 1.0 / len(chains))
            extra = extras.get((r.id, chain[0].index)) if len(chain) == 1 else None
            if extra:  # per-turn values of the credit assigner (GAE: value_old, value_target)
                item.meta.update(extra)
            items.append(item)
    return items


def drop_parse_errors(item: SAWItem) -> bool:
    return not item.meta.get("parse_error", False)


def drop_truncated(item: SAWItem) -> bool:
    return not item.meta.get("truncated", False)


def drop_zero_weight(item: SAWItem, eps: float = 1e-8) -> bool:
    """Zero-advantage items (e.g. zero-variance GRPO groups) carry no gradient in most losses."""
    if item.token_weights is not None:
        return any(abs(w) > eps for w in item.token_weights)
    return abs(item.weight) > eps


class RolloutBatchSource:
    """Synchronous on-policy batches: generate rollouts now, assign credit, return items.

    Args:
        engine: runs the episodes.
        requests_fn: returns the base requests for the next batch (curriculum lives here).
        credit: credit assigner.
        strategy: request expansion (``GRPORequestStrategy`` for groups).
        sample_filter: keep-predicate applied after credit assignment.
        metrics_fn: extra metrics from the rollouts (win rate, ...), merged into batch meta
            (outcome metrics cover the trained rollouts; frozen opponents' are only counted).
        merge_turns: one item per episode when its prompts extend each other (module doc);
            False gives one item per turn everywhere.
    """

    def __init__(
        self,
        engine: RolloutEngine,
        requests_fn: Callable[[], Sequence[RolloutRequest]],
        credit: CreditAssigner,
        *,
        strategy: RequestStrategy | None = None,
        sample_filter: SampleFilter | None = None,
        metrics_fn: Callable[[Sequence[Rollout]], dict[str, Any]] | None = None,
        merge_turns: bool = True,
    ) -> None:
        if strategy is None and getattr(credit, "needs_groups", False):
            raise ValueError(
                f"{type(credit).__name__} compares rollouts within groups, but no request strategy makes "
                "groups: pass strategy=GRPORequestStrategy(group_size) (or strategy=IdentityStrategy() if "
                "your requests carry their own group ids)"
            )
        self.engine = engine
        self.requests_fn = requests_fn
        self.credit = credit
        self.strategy = strategy or IdentityStrategy()
        self.sample_filter = sample_filter
        self.metrics_fn = metrics_fn
        self.merge_turns = merge_turns
        self.last_rollouts: list[Rollout] = []

    def state_dict(self) -> dict[str, Any]:
        """What a resumed run needs to draw the same requests and seeds: the strategy's RNG, the
        engine's episode counter (default env seeds), and ``requests_fn``'s own state if it has one."""
        state: dict[str, Any] = {"episodes": self.engine.episodes}
        if hasattr(self.strategy, "state_dict"):
            state["strategy"] = self.strategy.state_dict()
        if hasattr(self.requests_fn, "state_dict"):
            state["requests"] = self.requests_fn.state_dict()  # type: ignore[attr-defined]
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.engine.episodes = int(state.get("episodes", 0))
        if "strategy" in state and hasattr(self.strategy, "load_state_dict"):
            self.strategy.load_state_dict(state["strategy"])
        if "requests" in state and hasattr(self.requests_fn, "load_state_dict"):
            self.requests_fn.load_state_dict(state["requests"])  # type: ignore[attr-defined]

    async def next_batch(self) -> SAWBatch:
        t0 = time.perf_counter()
        requests = self.strategy.expand(self.requests_fn())
        rollouts = await self.engine.generate_rollouts(requests)
        self.last_rollouts = rollouts
        items = build_saw_items(rollouts, self.credit, merge_turns=self.merge_turns)
        n_before, n_tokens_before = len(items), sum(it.num_action_tokens for it in items)
        if self.sample_filter is not None:
            items = [it for it in items if self.sample_filter(it)]
        dt = time.perf_counter() - t0
        n_tokens = sum(it.num_action_tokens for it in items)
        episodes = sum(it.episode_share for it in items)
        trained = [r for r in rollouts if is_trained(r)]  # outcome metrics: the policy's own rollouts
        meta: dict[str, Any] = {
            "num_rollouts": len(rollouts),
            "num_frozen_rollouts": len(rollouts) - len(trained),
            "num_items": len(items),
            "num_items_filtered": n_before - len(items),
            # the trainer counts these as tokens of the step without signal (scale_lr_by_signal)
            "filtered_action_tokens": n_tokens_before - n_tokens,
            "generation_s": dt,
            "episodes_per_s": len(rollouts) / dt if dt > 0 else 0.0,
            "completion_tokens": n_tokens,
            "items_per_episode": len(items) / episodes if episodes else 0.0,
            "sequence_tokens_per_episode": sum(it.num_tokens for it in items) / episodes if episodes else 0.0,
            **outcome_counts(trained),
            **getattr(self.credit, "last_stats", {}),  # a credit assigner's own diagnostics (MMDTarget)
        }
        if self.metrics_fn is not None:
            meta.update(self.metrics_fn(trained))
        return SAWBatch(items=items, meta=meta)
