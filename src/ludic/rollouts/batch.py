"""From rollouts to SAW items, and the batch sources the trainer pulls from.

``build_saw_items`` turns each step that has tokens into one SAWItem: the
exact prompt ids as state, the exact sampled ids as action, the credit as
weight, the sampler's log-probs and policy versions for importance
correction. Failed episodes (inference errors) give no items.

Batch sources implement ``async next_batch() -> SAWBatch``:
    RolloutBatchSource   synchronous RL: generate, assign credit, return
    OfflineBatchSource   SFT-style data from JSONL (see ludic.data)
    (Redis pipeline sources live in ludic.pipeline)
"""

from __future__ import annotations

import time
from typing import Any, Callable, Protocol, Sequence

from ludic.rollouts.credit import CreditAssigner
from ludic.rollouts.engine import IdentityStrategy, RequestStrategy, RolloutEngine, outcome_counts
from ludic.types import Rollout, RolloutRequest, SAWBatch, SAWItem

SampleFilter = Callable[[SAWItem], bool]
"""True keeps the item."""


class BatchSource(Protocol):
    """Where the trainer's batches come from."""

    async def next_batch(self) -> SAWBatch: ...


def build_saw_items(rollouts: Sequence[Rollout], credit: CreditAssigner) -> list[SAWItem]:
    """One SAWItem per step with completion tokens; failed rollouts are skipped."""
    usable = [r for r in rollouts if not r.meta.get("failed")]
    weights = credit.compute(usable)
    items = []
    for r in usable:
        for s in r.steps:
            if s.trace is None or not s.trace.completion_ids:
                continue
            w = weights[(r.id, s.index)]
            if w != w or w in (float("inf"), float("-inf")):
                raise ValueError(f"credit for rollout {r.id} step {s.index} is not finite: {w}")
            meta = {
                "rollout_id": r.id, "step_index": s.index, "group_id": r.meta.get("group_id"),
                "agent_id": r.meta.get("agent_id"), "reward": s.reward, "total_reward": r.total_reward,
                "finish_reason": s.trace.finish_reason.value, "parse_error": s.parse_error,
                "truncated": s.truncated, "terminated": s.terminated,
            }
            items.append(
                SAWItem(
                    prompt_ids=s.trace.prompt_ids, completion_ids=s.trace.completion_ids,
                    weight=float(w), logprobs=s.trace.logprobs,
                    policy_versions=s.trace.policy_versions, meta=meta,
                )
            )
    return items


def drop_parse_errors(item: SAWItem) -> bool:
    return not item.meta.get("parse_error", False)


def drop_truncated(item: SAWItem) -> bool:
    return not item.meta.get("truncated", False)


def drop_zero_weight(item: SAWItem, eps: float = 1e-8) -> bool:
    """Zero-advantage items (e.g. zero-variance GRPO groups) carry no gradient in most losses."""
    return abs(item.weight) > eps


class RolloutBatchSource:
    """Synchronous on-policy batches: generate rollouts now, assign credit, return items.

    Args:
        engine: runs the episodes.
        requests_fn: returns the base requests for the next batch (curriculum lives here).
        credit: credit assigner.
        strategy: request expansion (``GRPORequestStrategy`` for groups).
        sample_filter: keep-predicate applied after credit assignment.
        metrics_fn: extra metrics from the rollouts (win rate, ...), merged into batch meta.
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
        self.last_rollouts: list[Rollout] = []

    async def next_batch(self) -> SAWBatch:
        t0 = time.perf_counter()
        requests = self.strategy.expand(self.requests_fn())
        rollouts = await self.engine.generate_rollouts(requests)
        self.last_rollouts = rollouts
        items = build_saw_items(rollouts, self.credit)
        n_before = len(items)
        if self.sample_filter is not None:
            items = [it for it in items if self.sample_filter(it)]
        dt = time.perf_counter() - t0
        n_tokens = sum(len(it.completion_ids) for it in items)
        meta: dict[str, Any] = {
            "num_rollouts": len(rollouts),
            "num_items": len(items),
            "num_items_filtered": n_before - len(items),
            "generation_s": dt,
            "episodes_per_s": len(rollouts) / dt if dt > 0 else 0.0,
            "completion_tokens": n_tokens,
            **outcome_counts(rollouts),
        }
        if self.metrics_fn is not None:
            meta.update(self.metrics_fn(rollouts))
        return SAWBatch(items=items, meta=meta)
