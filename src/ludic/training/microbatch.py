"""Micro-batching under a budget: the trainer splits an optimizer batch into micro-batches that fit
``micro_token_budget`` (``longest sequence * count``) or, by default, the bytes a micro-batch keeps for its
backward (``training.memory``), each packed to compute little (padded: the prompt prefix all rows share
counted once; flat: the real tokens of the flat pass's prefix tree), and ``collate`` lays one out as
right-padded tensors with the flattened action-token layout the losses read (``MicroBatch``).

Scoring those tensors is ``training.scoring``; the flat pass's cost model is ``training.packed``.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ludic.tokenization import MIN_SHARED_PREFIX, common_prefix_len
from ludic.training.memory import MicroBatchMemory
from ludic.training.packed import TreeCost, tree_cost
from ludic.types import SAWItem


@dataclass
class MicroBatch:
    """Right-padded tensors of one micro-batch plus the flattened action-token layout."""

    input_ids: Tensor
    """[B, T] long."""
    attention_mask: Tensor
    """[B, T] long."""
    rows: Tensor
    """[N] long: batch row of each action token."""
    cols: Tensor
    """[N] long: position (in the row) of the hidden state that predicts the token."""
    targets: Tensor
    """[N] long: the action token ids."""
    seg: Tensor
    """[N] long: segment (item) index in [0, B)."""
    old_logp: Tensor | None
    """[N] float sampler log-probs, or None when the items have none (offline data)."""
    adv: Tensor
    """[B] float: item weights."""
    items: list[SAWItem]
    token_adv: Tensor | None = None
    """[N] float per-token credit, when some item carries per-turn weights (a merged episode)."""
    seg_weight: Tensor | None = None
    """[B] float: each item's share of its episode (``SAWItem.episode_share``), None when all are 1."""
    temperature: Tensor | None = None
    """[N] float sampling temperature of each action token (logits are divided by it); None when all 1."""
    versions: Tensor | None = None
    """[N] long policy version that sampled each action token (-1: unknown); None when no item has versions."""


def truncate_item(item: SAWItem, max_seq_len: int) -> SAWItem | None:
    """Cut completion tokens beyond ``max_seq_len``; None when no trained token would be left."""
    if item.num_tokens <= max_seq_len:
        return item
    keep = max_seq_len - len(item.prompt_ids)
    cut = lambda v: None if v is None else v[:keep]  # noqa: E731
    if keep < 1 or (item.action_mask is not None and not any(item.action_mask[:keep])):
        return None
    return dataclasses.replace(
        item, completion_ids=item.completion_ids[:keep], logprobs=cut(item.logprobs),
        policy_versions=cut(item.policy_versions), action_mask=cut(item.action_mask),
        token_weights=cut(item.token_weights),
        meta={**item.meta, "seq_len_truncated": True, "seq_len_original": item.num_tokens},
    )


FORWARD_OVERHEAD_TOKENS = 32
"""The fixed cost of one more decoder call, counted in token positions (a guess; it only
breaks ties between packings)."""


def admit_items(items: Sequence[SAWItem], policy_version: int, max_lag: int | None,
                max_seq_len: int) -> tuple[list[SAWItem], dict[str, int]]:
    """The items a step trains on: those at most ``max_lag`` policy versions old, cut to ``max_seq_len``
    (``truncate_item``), with the counts of each kind dropped or cut (the trainer logs them)."""
    kept, stale, cut_n, dropped = [], 0, 0, 0
    for it in items:
        v = it.min_policy_version
        if max_lag is not None and v is not None and policy_version - v > max_lag:
            stale += 1
            continue
        cut = truncate_item(it, max_seq_len)
        if cut is None:
            dropped += 1
        else:
            cut_n += cut is not it
            kept.append(cut)
    return kept, {"stale_dropped": stale, "seq_truncated": cut_n, "seq_dropped": dropped}


def micro_batch_cost(items: Sequence[SAWItem], share_prefix: bool = True, flat: bool = False) -> int:
    """Token positions the decoder computes for ``items`` as one micro-batch: the shared prompt
    prefix once, then the rest of every row, padded to the longest (``_hidden_states``) or, with
    ``flat``, unpadded (``packed.packed_states``)."""
    if flat:
        return tree_cost(items) if share_prefix else sum(it.num_tokens for it in items)
    prefix = shared_prefix_len(items) if share_prefix else 0
    return _cost(len(items), max(it.num_tokens for it in items), prefix if prefix >= MIN_SHARED_PREFIX else 0)


def split_by_token_budget(
    items: Sequence[SAWItem], budget: int, group_key: str | None = None, share_prefix: bool = True,
    flat: bool = False, memory: MicroBatchMemory | None = None,
) -> list[list[SAWItem]]:
    """Pack items into micro-batches with ``max_len * count <= budget`` each, or with ``memory``
    (``training.memory.MicroBatchMemory``) into micro-batches that keep at most ``budget`` bytes for their
    backward (``memory.flat`` of the flat pass's layout with ``flat``, else ``memory.padded``).

    Two packings are built and the cheaper one (``micro_batch_cost`` plus a per-call overhead)
    is used: items sorted by length and packed greedily (least padding), and, with
    ``share_prefix``, items sorted by prompt and cut where the next item would cost more inside
    the micro-batch than in a new one. The second keeps prompts that share a long prefix (a
    GRPO group: one prompt, many samples) together, so the prefix is computed once per
    micro-batch instead of once per sample. ``flat``: costs are those of the flat pass
    (``packed.packable`` models), where padding costs nothing, so groups of different prompts that
    share a system prompt join.

    With ``group_key``, items sharing ``meta[group_key]`` (e.g. a DPO pair) stay
    in one micro-batch. A unit larger than the budget gets a micro-batch of its own.
    """
    units: dict[Any, list[SAWItem]] = {}
    for i, it in enumerate(items):
        key = it.meta.get(group_key, ("__item__", i)) if group_key else i
        units.setdefault(key, []).append(it)
    fits = _Fits(budget, memory, flat, share_prefix)
    by_length = _pack(sorted(units.values(), key=lambda u: max(it.num_tokens for it in u)), fits)
    if not share_prefix or len(units) < 2:
        return by_length
    by_prompt = sorted(units.values(), key=lambda u: list(u[0].prompt_ids))
    by_prompt = _pack_flat(by_prompt, fits) if flat else _pack(by_prompt, fits, share_prefix=True)

    def total(packing: list[list[SAWItem]]) -> int:
        return sum(micro_batch_cost(mb, share_prefix, flat) + FORWARD_OVERHEAD_TOKENS for mb in packing)

    return by_prompt if total(by_prompt) < total(by_length) else by_length


class _Fits:
    """Whether a micro-batch fits the budget: ``longest * count`` tokens, or its bytes (``memory``)."""

    def __init__(self, budget: int, memory: MicroBatchMemory | None, flat: bool, share_prefix: bool) -> None:
        self.budget, self.memory, self.flat, self.share_prefix = budget, memory, flat, share_prefix

    def __call__(self, count: int, longest: int, prefix: list[int], tree: TreeCost) -> bool:
        if self.memory is None:
            return longest * count <= self.budget
        if self.flat:
            return self.memory.flat(tree) <= self.budget
        return self.memory.padded(count, longest, _capped(prefix, count) if self.share_prefix else 0) <= self.budget


def _pack(units: Sequence[list[SAWItem]], fits: _Fits, share_prefix: bool = False) -> list[list[SAWItem]]:
    """Greedy packing in the given order; with ``share_prefix`` a unit also starts a new
    micro-batch when adding it costs more than a micro-batch of its own would."""
    out: list[list[SAWItem]] = []
    cur: list[SAWItem] = []
    prefix: list[int] = []  # the prompt tokens every item of ``cur`` starts with
    cur_longest = 0
    tree = TreeCost()
    for unit in units:
        longest = max(cur_longest, *(it.num_tokens for it in unit))
        joined = _common(prefix if cur else list(unit[0].prompt_ids), unit)
        joined_tree = tree.add(unit) if fits.memory is not None else tree
        split = bool(cur) and not fits(len(cur) + len(unit), longest, joined, joined_tree)
        if cur and not split and share_prefix:
            before = _cost(len(cur), cur_longest, _capped(prefix, len(cur)))
            after = _cost(len(cur) + len(unit), longest, _capped(joined, len(cur) + len(unit)))
            split = after - before > micro_batch_cost(unit) + FORWARD_OVERHEAD_TOKENS
        if split:
            out.append(cur)
            cur = []
            joined = _common(list(unit[0].prompt_ids), unit)
            longest = max(it.num_tokens for it in unit)
            joined_tree = TreeCost().add(unit) if fits.memory is not None else tree
        cur.extend(unit)
        prefix, cur_longest, tree = joined, longest, joined_tree
    if cur:
        out.append(cur)
    return out


def _pack_flat(units: Sequence[list[SAWItem]], fits: _Fits) -> list[list[SAWItem]]:
    """``_pack`` with ``share_prefix`` for the flat pass, whose cost is ``packed.tree_cost``: a unit
    joins unless that costs more than a micro-batch of its own."""
    out: list[list[SAWItem]] = []
    cur: list[SAWItem] = []
    cost, longest = TreeCost(), 0
    for unit in units:
        longest = max(longest, *(it.num_tokens for it in unit))
        joined = cost.add(unit)
        split = bool(cur) and not fits(len(cur) + len(unit), longest, [], joined)
        alone = TreeCost().add(unit)
        if cur and (split or joined.tokens - cost.tokens > alone.tokens + FORWARD_OVERHEAD_TOKENS):
            out.append(cur)
            cur, joined, longest = [], alone, max(it.num_tokens for it in unit)
        cur.extend(unit)
        cost = joined
    if cur:
        out.append(cur)
    return out


def _common(prefix: list[int], unit: Sequence[SAWItem]) -> list[int]:
    n = len(prefix)
    for it in unit:
        ids = it.prompt_ids
        n = min(n, len(ids) - 1)
        i = 0
        while i < n and ids[i] == prefix[i]:
            i += 1
        n = i
    return prefix[:n]


def _capped(prefix: list[int], count: int) -> int:
    """The prefix ``_hidden_states`` shares for ``count`` items starting with ``prefix`` (0 for one
    item or a short prefix)."""
    n = len(prefix) if count > 1 else 0
    return n if n >= MIN_SHARED_PREFIX else 0


def _cost(count: int, longest: int, prefix: int) -> int:
    return prefix + count * (longest - prefix)


def collate(items: Sequence[SAWItem], pad_id: int, device: torch.device | str = "cpu") -> MicroBatch:
    """Right-pad items into tensors and lay out their trained (action) tokens."""
    B = len(items)
    T = max(it.num_tokens for it in items)
    input_ids = torch.full((B, T), pad_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    rows, cols, targets, seg, old, tadv, vers = [], [], [], [], [], [], []
    has_versions = any(it.policy_versions is not None for it in items)
    has_old = all(it.logprobs is not None for it in items)
    if not has_old and any(it.logprobs is not None for it in items):
        raise ValueError("a micro-batch mixes items with and without sampler log-probs")
    per_token = any(it.token_weights is not None for it in items)
    for b, it in enumerate(items):
        seq = list(it.prompt_ids) + list(it.completion_ids)
        input_ids[b, : len(seq)] = torch.tensor(seq, dtype=torch.long)
        attn[b, : len(seq)] = 1
        P, C = len(it.prompt_ids), len(it.completion_ids)
        if P == 0 and C > 0:
            raise ValueError(
                f"item {b} of the micro-batch has no prompt tokens, so its first completion token has no "
                f"context to be scored from; give it at least one prompt token (e.g. BOS) (meta={it.meta})"
            )
        keep = range(C) if it.action_mask is None else [j for j in range(C) if it.action_mask[j]]
        rows.extend([b] * len(keep))
        cols.extend(P - 1 + j for j in keep)
        targets.extend(it.completion_ids[j] for j in keep)
        seg.extend([b] * len(keep))
        if has_old:
            old.extend(it.logprobs[j] for j in keep)  # type: ignore[index]
        if per_token:
            tadv.extend(it.weight if it.token_weights is None else it.token_weights[j] for j in keep)
        if has_versions:
            vers.extend(-1 if it.policy_versions is None else it.policy_versions[j] for j in keep)
    as_long = lambda x: torch.tensor(x, dtype=torch.long, device=device)  # noqa: E731
    as_float = lambda x: torch.tensor(x, dtype=torch.float32, device=device)  # noqa: E731
    shares = [it.episode_share for it in items]
    temps = [it.temperature for it in items]
    return MicroBatch(
        input_ids=input_ids.to(device), attention_mask=attn.to(device),
        rows=as_long(rows), cols=as_long(cols), targets=as_long(targets), seg=as_long(seg),
        old_logp=as_float(old) if has_old else None,
        adv=as_float([it.weight for it in items]), items=list(items),
        token_adv=as_float(tadv) if per_token else None,
        seg_weight=None if all(x == 1.0 for x in shares) else as_float(shares),
        temperature=None if all(t == 1.0 for t in temps) else as_float(temps)[as_long(seg)],
        versions=as_long(vers) if has_versions else None,
    )


def shared_prefix_len(items: Sequence[SAWItem]) -> int:
    """Common prefix of all prompts, capped so every item keeps >= 1 own prompt token."""
    return common_prefix_len([it.prompt_ids for it in items])
