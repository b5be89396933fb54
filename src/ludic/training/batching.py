"""Micro-batching under a token budget, and the forward pass that scores action tokens.

The trainer splits an optimizer batch into micro-batches whose padded size
(``longest sequence * count``) fits ``micro_token_budget``. For each
micro-batch, ``score_actions`` runs the decoder once and applies the LM head
only at positions that predict action (completion) tokens, in chunks: on a
49k-token vocabulary most of the ``[B, T, V]`` logits a plain forward would
build belong to prompt tokens that are never trained on.
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any, Sequence

import torch
from torch import Tensor

from ludic import fastpath
from ludic.tokenization import MIN_SHARED_PREFIX, common_prefix_len
from ludic.training.packed import TreeCost, packable, packed_states, tree_cost
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
    flat: bool = False,
) -> list[list[SAWItem]]:
    """Pack items into micro-batches with ``max_len * count <= budget`` each.

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
    by_length = _pack(sorted(units.values(), key=lambda u: max(it.num_tokens for it in u)), budget)
    if not share_prefix or len(units) < 2:
        return by_length
    by_prompt = sorted(units.values(), key=lambda u: list(u[0].prompt_ids))
    by_prompt = _pack_flat(by_prompt, budget) if flat else _pack(by_prompt, budget, share_prefix=True)

    def total(packing: list[list[SAWItem]]) -> int:
        return sum(micro_batch_cost(mb, share_prefix, flat) + FORWARD_OVERHEAD_TOKENS for mb in packing)

    return by_prompt if total(by_prompt) < total(by_length) else by_length


def _pack(units: Sequence[list[SAWItem]], budget: int, share_prefix: bool = False) -> list[list[SAWItem]]:
    """Greedy packing in the given order; with ``share_prefix`` a unit also starts a new
    micro-batch when adding it costs more than a micro-batch of its own would."""
    out: list[list[SAWItem]] = []
    cur: list[SAWItem] = []
    prefix: list[int] = []  # the prompt tokens every item of ``cur`` starts with
    cur_longest = 0
    for unit in units:
        longest = max(cur_longest, *(it.num_tokens for it in unit))
        split = bool(cur) and longest * (len(cur) + len(unit)) > budget
        joined = _common(prefix if cur else list(unit[0].prompt_ids), unit)
        if cur and not split and share_prefix:
            before = _cost(len(cur), cur_longest, _capped(prefix, len(cur)))
            after = _cost(len(cur) + len(unit), longest, _capped(joined, len(cur) + len(unit)))
            split = after - before > micro_batch_cost(unit) + FORWARD_OVERHEAD_TOKENS
        if split:
            out.append(cur)
            cur = []
            joined = _common(list(unit[0].prompt_ids), unit)
            longest = max(it.num_tokens for it in unit)
        cur.extend(unit)
        prefix, cur_longest = joined, longest
    if cur:
        out.append(cur)
    return out


def _pack_flat(units: Sequence[list[SAWItem]], budget: int) -> list[list[SAWItem]]:
    """``_pack`` with ``share_prefix`` for the flat pass, whose cost is ``packed.tree_cost``: a unit
    joins unless that costs more than a micro-batch of its own."""
    out: list[list[SAWItem]] = []
    cur: list[SAWItem] = []
    cost, longest = TreeCost(), 0
    for unit in units:
        longest = max(longest, *(it.num_tokens for it in unit))
        split = bool(cur) and longest * (len(cur) + len(unit)) > budget
        joined = cost.add(unit)
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


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The transformer body and the LM head of an HF causal LM (peft-wrapped or not), where the
    head includes the model's own logit post-processing (``logits_fn``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(base, "get_decoder") or not hasattr(base, "get_output_embeddings"):
        return None
    from ludic.training.fsdp import is_sharded

    if is_sharded(model) or is_sharded(base):
        return None  # FSDP2 root hooks must run: use the full forward
    return base.get_decoder(), logits_fn(base.get_output_embeddings(), getattr(base, "config", None))


def logits_fn(head: Any, config: Any) -> Any:
    """``hidden -> logits`` as the model's forward computes them after its LM head.

    Reproduces the post-processing of the model families that have one (each checked against
    ``model(...).logits`` in the tests): Granite divides by ``logits_scaling``, Cohere multiplies by
    ``logit_scale``, Gemma 2/3 soft-cap with ``tanh(logits / c) * c`` (``final_logit_softcapping``).
    """
    cfg = getattr(config, "text_config", None) or config
    scale = 1.0
    scaling = getattr(cfg, "logits_scaling", None)
    if isinstance(scaling, (int, float)) and scaling not in (0, 1):
        scale /= float(scaling)
    mult = getattr(cfg, "logit_scale", None)
    if isinstance(mult, (int, float)) and not isinstance(mult, bool) and mult != 1:
        scale *= float(mult)
    cap = getattr(cfg, "final_logit_softcapping", None)
    if scale == 1.0 and not cap:
        return head

    def post(h: Tensor) -> Tensor:
        logits = head(h)
        if scale != 1.0:
            logits = logits * scale
        if cap:
            logits = torch.tanh(logits / cap) * cap
        return logits

    return post


def shared_prefix_len(items: Sequence[SAWItem]) -> int:
    """Common prefix of all prompts, capped so every item keeps >= 1 own prompt token."""
    return common_prefix_len([it.prompt_ids for it in items])


def _hidden_states(decoder: Any, mb: MicroBatch, prefix: int, embeds: Tensor | None = None) -> Tensor:
    """Decoder hidden states [B, T, H]; a shared prompt prefix is computed once and broadcast.

    With ``prefix`` = L > 0, the prefix runs as a batch of one, its key/value
    cache is repeated over the batch (gradients flow back through the repeat),
    and the rest of every sequence attends to it. The result equals the plain
    forward pass; it saves (B - 1) * L tokens of compute, e.g. the system
    prompt shared by every item of a micro-batch. ``embeds`` [B, T, H] replaces
    the token embeddings as the decoder's input (``FrozenBottomCache``).
    """
    def inputs(rows: slice, cols: slice) -> dict[str, Tensor]:
        if embeds is None:
            return {"input_ids": mb.input_ids[rows, cols]}
        return {"inputs_embeds": embeds[rows, cols]}

    if prefix <= 0:
        return decoder(**inputs(slice(None), slice(None)), attention_mask=mb.attention_mask).last_hidden_state
    B, T = mb.input_ids.shape
    head = decoder(**inputs(slice(0, 1), slice(0, prefix)), use_cache=True)
    cache = head.past_key_values
    cache.batch_repeat_interleave(B)
    positions = torch.arange(prefix, T, device=mb.input_ids.device)
    tail = decoder(
        **inputs(slice(None), slice(prefix, None)), attention_mask=mb.attention_mask, past_key_values=cache,
        position_ids=positions[None].expand(B, -1), cache_position=positions, use_cache=True,
    ).last_hidden_state
    return torch.cat([head.last_hidden_state.expand(B, -1, -1), tail], dim=1)


@contextlib.contextmanager
def _layer_range(decoder: Any, start: int, stop: int, final_norm: bool = True):
    """Run ``decoder`` as if it had only layers ``[start, stop)`` (and, without ``final_norm``,
    no closing norm): its forward then maps the hidden states entering layer ``start`` (given as
    ``inputs_embeds``) to those leaving layer ``stop - 1``. The layers' cache indices are
    renumbered from 0 meanwhile, so a key/value cache stays consistent."""
    layers, norm = decoder.layers, decoder.norm
    kept = list(layers)[start:stop]
    idx = [getattr(block.self_attn, "layer_idx", None) for block in kept]
    try:
        decoder.layers = torch.nn.ModuleList(kept)
        if not final_norm:
            decoder.norm = torch.nn.Identity()
        for i, block in enumerate(kept):
            if idx[i] is not None:
                block.self_attn.layer_idx = i
        yield decoder
    finally:
        decoder.layers, decoder.norm = layers, norm
        for i, block in enumerate(kept):
            if idx[i] is not None:
                block.self_attn.layer_idx = idx[i]


class FrozenBottomCache:
    """The output of a decoder's frozen bottom (the embeddings and the lowest ``layers`` decoder
    layers), computed once per distinct item and reused on every later visit.

    SFT on a fixed set (``freeze_bottom``, many epochs) sees each item again and again, and
    nothing below layer ``layers`` trains, so those activations never change: a step then runs
    only the trainable top, forward and backward. Items are keyed by their token ids. The
    result equals the plain forward up to float rounding; the first micro-batch is checked
    against it (a model whose forward treats ``inputs_embeds`` differently, e.g. one that
    scales them, fails loudly there). Past ``max_bytes`` of stored states the cache stops
    growing (new items are then computed each time).
    """

    def __init__(self, model: Any, layers: int, max_bytes: int = 1 << 30, rtol: float = 1e-3) -> None:
        from ludic.training.lora import decoder_layers

        blocks = decoder_layers(model)
        if not 0 < layers < len(blocks):
            raise ValueError(f"FrozenBottomCache: layers must be in 1..{len(blocks) - 1}, got {layers}")
        trainable = [n for n, p in model.named_parameters() if p.requires_grad and _below(n, layers)]
        if model.get_input_embeddings().weight.requires_grad or trainable:
            raise ValueError(
                f"FrozenBottomCache: the embeddings and the bottom {layers} layers must be frozen, but "
                f"{trainable[:3] or ['the input embeddings']} train (use freeze_bottom first)"
            )
        self.layers, self.max_bytes, self.rtol = layers, max_bytes, rtol
        self.bytes, self.hits, self.misses = 0, 0, 0
        self._states: dict[tuple[int, ...], Tensor] = {}
        self._checked = False

    def fill(self, model: Any, items: Sequence[SAWItem], pad_id: int, rows: int = 64) -> None:
        """Compute the states of ``items`` now, ``rows`` at a time (so later steps all hit the cache
        and time the same: a budget fitted to the first steps then holds)."""
        decoder = _decoder_and_head(model)[0]
        device = next(model.parameters()).device
        for s in range(0, len(items), rows):
            self.inputs(decoder, collate(items[s : s + rows], pad_id, device))

    def inputs(self, decoder: Any, mb: MicroBatch) -> Tensor:
        """[B, T, H] hidden states entering layer ``layers`` (zeros at padding)."""
        keys = [tuple(it.prompt_ids) + tuple(it.completion_ids) for it in mb.items]
        fresh: dict[int, Tensor] = {}
        missing = [b for b, k in enumerate(keys) if k not in self._states]
        if missing:
            rows = torch.tensor(missing, device=mb.input_ids.device)
            with torch.no_grad(), _layer_range(decoder, 0, self.layers, final_norm=False):
                out = decoder(input_ids=mb.input_ids[rows], attention_mask=mb.attention_mask[rows]).last_hidden_state
            for j, b in enumerate(missing):
                state = out[j, : len(keys[b])].clone()
                fresh[b] = state
                if self.bytes + state.numel() * state.element_size() <= self.max_bytes:
                    self._states[keys[b]] = state
                    self.bytes += state.numel() * state.element_size()
        self.misses += len(missing)
        self.hits += len(keys) - len(missing)
        B, T = mb.input_ids.shape
        first = fresh.get(0, self._states.get(keys[0]))
        x = first.new_zeros(B, T, first.shape[-1])
        for b, k in enumerate(keys):
            state = fresh.get(b, self._states.get(k))
            x[b, : state.shape[0]] = state
        return x

    def hidden_states(self, decoder: Any, mb: MicroBatch, prefix: int) -> Tensor:
        """What ``_hidden_states(decoder, mb, prefix)`` returns, with the bottom read from the cache."""
        x = self.inputs(decoder, mb)
        with _layer_range(decoder, self.layers, len(decoder.layers)):
            hidden = _hidden_states(decoder, mb, prefix, embeds=x)
        mask = mb.attention_mask.bool()
        self._check(decoder, mb, lambda plain: (hidden.detach()[mask], plain[mask]))
        return hidden

    def packed_states(self, decoder: Any, mb: MicroBatch) -> Tensor:
        """What ``packed.packed_states`` returns for ``mb`` ([N, H] at the action positions), with the
        bottom read from the cache."""
        x = self.inputs(decoder, mb)
        h = packed_states(decoder, mb.items, mb.rows, mb.cols, embeds=x, start=self.layers)
        self._check(decoder, mb, lambda plain: (h.detach(), plain[mb.rows, mb.cols]))
        return h

    def _check(self, decoder: Any, mb: MicroBatch, pairs: Any) -> None:
        """On first use: ``pairs(plain hidden states [B, T, H])`` -> (got, want) must agree."""
        if self._checked:
            return
        self._checked = True
        with torch.no_grad():
            got, want = pairs(_hidden_states(decoder, mb, 0))
        rtol = self.rtol if want.dtype == torch.float32 else max(self.rtol, 0.05)  # bf16: 8-bit mantissa
        got, want = got.float(), want.float()
        err = float((got - want).abs().max() / want.abs().max().clamp_min(1e-6)) if want.numel() else 0.0
        if not err <= rtol:
            raise RuntimeError(
                f"FrozenBottomCache: hidden states from the cached bottom differ from the plain forward by "
                f"{err:.3g} of their largest value (> {rtol}); {type(decoder).__name__} does not take cached "
                f"layer inputs as inputs_embeds unchanged. Train without the cache."
            )


def _below(name: str, layers: int) -> bool:
    """Whether parameter ``name`` belongs to decoder layer < ``layers`` (``...layers.<i>....``)."""
    parts = name.split(".")
    for i, part in enumerate(parts[:-1]):
        if part == "layers" and parts[i + 1].isdigit():
            return int(parts[i + 1]) < layers
    return False


def score_actions(
    model: Any, mb: MicroBatch, *, need_entropy: bool = False, chunk: int = 1024, share_prefix: bool = True,
    bottom: FrozenBottomCache | None = None, packed: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """Log-prob (and optionally entropy) of every action token under ``model``, at the temperature
    each token was sampled with (``mb.temperature``: logits / T, as the sampler drew them).

    Returns:
        logp: [N] float32, carries grad when grad is enabled.
        entropy: [N] float32 or None.
    """
    parts = _decoder_and_head(model)
    if parts is None:
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits
        sel = logits[mb.rows, mb.cols]
        return _logp_entropy(sel, mb.targets, need_entropy, mb.temperature)
    logp, ent, _ = score_hidden(model, mb, need_entropy=need_entropy, chunk=chunk, share_prefix=share_prefix,
                                bottom=bottom, parts=parts, packed=packed)
    return logp, ent


def score_hidden(
    model: Any, mb: MicroBatch, *, need_entropy: bool = False, chunk: int = 1024, share_prefix: bool = True,
    bottom: FrozenBottomCache | None = None, parts: tuple[Any, Any] | None = None, packed: bool = True,
) -> tuple[Tensor, Tensor | None, Tensor]:
    """``score_actions`` plus the final hidden states it read the logits from: [N, H], one per
    action token (a value head reads V(s) at each segment's first one).

    With ``packed`` (default) a model ``packed.packable`` accepts runs over the micro-batch's real
    tokens laid out flat (``packed.packed_states``: no padding, each shared prompt part once, whatever
    ``share_prefix`` says); others, and ``packed=False``, run the model's decoder on the padded block
    (``_hidden_states``, the prefix all rows share once with ``share_prefix``)."""
    parts = parts or _decoder_and_head(model)
    if parts is None:
        raise ValueError(f"score_hidden: cannot split {type(model).__name__} into decoder and LM head "
                         "(FSDP-wrapped or not a Hugging Face causal LM)")
    decoder, head = parts
    if packed and packable(model):  # [N, H]
        h = packed_states(decoder, mb.items, mb.rows, mb.cols) if bottom is None else bottom.packed_states(decoder, mb)
    else:
        checkpointed = getattr(decoder, "gradient_checkpointing", False)  # no cache under checkpointing
        prefix = shared_prefix_len(mb.items) if share_prefix and not checkpointed else 0
        prefix = prefix if prefix >= MIN_SHARED_PREFIX else 0
        hidden = _hidden_states(decoder, mb, prefix) if bottom is None else bottom.hidden_states(decoder, mb, prefix)
        h = hidden[mb.rows, mb.cols]  # [N, H]
    logps, ents = [], []
    temp = mb.temperature
    for s in range(0, h.shape[0], chunk):
        t = None if temp is None else temp[s : s + chunk]
        lp, ent = _logp_entropy(head(h[s : s + chunk]), mb.targets[s : s + chunk], need_entropy, t)
        logps.append(lp)
        if ent is not None:
            ents.append(ent)
    if not logps:
        empty = h.new_zeros(0, dtype=torch.float32)
        return empty, (empty if need_entropy else None), h
    return torch.cat(logps), (torch.cat(ents) if need_entropy else None), h


class _TokenLogp(torch.autograd.Function):
    """log softmax(logits / T)[target] per row, in fp32, with a hand-written backward:
    d logp / d logits = (onehot(target) - softmax(logits / T)) / T.

    The autograd path (``logits.float()``, ``log_softmax``, ``gather``) keeps an fp32 copy and the
    fp32 log-softmax of the [N, V] logits, and its backward allocates and fills a zero [N, V]
    gradient for the gather, another for the log-softmax and a third for the cast: five fresh
    [N, V] fp32 tensors per micro-batch (SmolLM2: 49152 columns, 200 rows, 39 MB each). This one
    keeps the logits as they came and one fp32 number per row, and computes the gradient in a
    single fp32 buffer, in place."""

    ROWS = 16
    """Rows per pass of the elementwise work: 16 x 49152 fp32 (3 MB) stays in cache, where one pass
    over the whole [N, V] streams memory: the forward's log-sum-exp over 190 x 49152 bf16 logits took
    34.6 ms in one pass and 6.6 ms in 16-row passes, the backward 22.2 ms against 7.9 ms."""

    @staticmethod
    def forward(ctx: Any, logits: Tensor, targets: Tensor, temperature: Tensor | None) -> Tensor:
        lse = torch.empty(logits.shape[0], dtype=torch.float32, device=logits.device)
        for s in range(0, logits.shape[0], _TokenLogp.ROWS):
            z = logits[s : s + _TokenLogp.ROWS].to(torch.float32, copy=True)
            if temperature is not None:
                z.div_(temperature[s : s + _TokenLogp.ROWS, None])
            lse[s : s + _TokenLogp.ROWS] = torch.logsumexp(z, dim=-1)
        picked = logits.gather(-1, targets[:, None])[:, 0].float()
        if temperature is not None:
            picked = picked / temperature
        ctx.save_for_backward(logits, targets, lse, temperature)
        return picked - lse

    @staticmethod
    def backward(ctx: Any, g: Tensor) -> tuple[Tensor, None, None]:
        logits, targets, lse, temperature = ctx.saved_tensors
        out = torch.empty_like(logits)
        for s in range(0, logits.shape[0], _TokenLogp.ROWS):
            e = s + _TokenLogp.ROWS
            gs = g[s:e, None] if temperature is None else g[s:e, None] / temperature[s:e, None]
            grad = logits[s:e].to(torch.float32, copy=True)
            if temperature is not None:
                grad.div_(temperature[s:e, None])
            grad.sub_(lse[s:e, None]).exp_().mul_(-gs)  # -g * softmax(z) / T
            grad.scatter_add_(-1, targets[s:e, None], gs)  # + g / T at the target
            out[s:e] = grad
        return out, None, None


def _logp_entropy(
    logits: Tensor, targets: Tensor, need_entropy: bool, temperature: Tensor | None = None
) -> tuple[Tensor, Tensor | None]:
    """Log-probs (and entropies) of ``targets`` under ``logits / T``: ``_TokenLogp`` on the fast path,
    else autograd's ``log_softmax`` and ``gather`` (the stock path, and always with entropies)."""
    if not need_entropy and fastpath.enabled(logits.device):
        return _TokenLogp.apply(logits, targets, temperature), None
    logits = logits.float()
    if temperature is not None:
        logits = logits / temperature[:, None]
    logsm = torch.log_softmax(logits, dim=-1)
    logp = logsm.gather(-1, targets[:, None])[:, 0]
    ent = -(logsm.exp() * logsm).sum(-1) if need_entropy else None
    return logp, ent


@contextlib.contextmanager
def adapters_disabled(model: Any):
    """Run the base model of a peft model (the natural LoRA reference policy)."""
    if hasattr(model, "disable_adapter"):
        with model.disable_adapter():
            yield model
    else:
        yield model
