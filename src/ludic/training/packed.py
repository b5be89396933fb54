"""The trainer's scoring pass over a micro-batch's real tokens only, each shared prompt once.

``scoring.score_hidden`` needs the final hidden state at every position that predicts an action
token. Through the model's own forward a micro-batch is a padded ``[B, T]`` block (a prefix shared
by every row computed once, then ``B`` rows padded to the longest rest), and every projection and
MLP multiplies the padding, and each GRPO group's prompt once per micro-batch: in the GRPO benchmark
(completions of 3 to 32 tokens) a fifth of the rows the linears multiplied were padding, and its two
groups, whose prompts share a 130-token system part, went to two micro-batches. For the model
families of ``architectures.SUPPORTED`` ``packed_states`` runs the decoder layer by layer over one
flat sequence instead, a two-level prefix tree::

    [ common (C: what every prompt starts with) | group 0's rest of its prompt | group 1's ... |
      item 0's completion | item 1's completion | ... ]

A group is the items with one prompt (a GRPO group; an item with a prompt of its own is a group of
one). Then:

- embeddings, norms, projections (LoRA included) and MLPs see each token once, no padding;
- attention (``_attention``): the common part over itself, causally; each group's part over the
  common part and itself; each item's completion over the common part, its group's part and
  itself (groups and items padded per row for attention only);
- rotary positions are each token's position in its own sequence.

It calls the model's own modules and reproduces only the wiring between them (``architectures``).
Numerics follow ``inference.models.cpu_bf16_attention``, the attention the model's forward uses for
a bf16 model on CPU: projections and rotary in the model dtype, attention in fp32, its output
rounded back once. The tests check log-probs and LoRA gradients against the padded forward.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Sequence

import torch
from torch import Tensor

from ludic.architectures import llama_like, rotary
from ludic.types import SAWItem

if TYPE_CHECKING:
    from ludic.inference.prefix_cache import Bottom

def packable(model: Any) -> bool:
    """Whether ``packed_states`` reproduces ``model``'s forward: a supported family on CPU, not
    sharded (FSDP2's hooks need the model's own forward), with no attention dropout in effect (the
    flat layout has none), and the fast path on (``ludic.fastpath``)."""
    from ludic import fastpath
    from ludic.distributed import is_sharded

    if not fastpath.enabled() or not llama_like(model) or is_sharded(model):
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if is_sharded(base) or next(base.parameters()).device.type != "cpu":
        return False
    return not (base.training and float(getattr(base.config, "attention_dropout", 0.0) or 0.0) > 0)


def tree_cost(items: Sequence[SAWItem]) -> int:
    """Token positions ``packed_states`` computes for ``items``: the common prefix once, each
    distinct prompt's rest once, every completion."""
    return TreeCost().add(items).tokens


class TreeCost:
    """``tree_cost`` kept up to date as items join a micro-batch (``add`` returns a new one; each
    item costs the length of its prompt, if new, and of its completion), with the sizes of ``_Tree``'s
    padded blocks (``training.memory`` reads them)."""

    def __init__(self) -> None:
        self.prompts: dict[tuple[int, ...], None] = {}
        self.common = 0
        self.prompt_tokens = 0
        self.completion_tokens = 0
        self.count = 0
        self.longest_prompt = 0
        self.longest_completion = 0

    @property
    def tokens(self) -> int:
        return self.common + self.prompt_tokens - len(self.prompts) * self.common + self.completion_tokens

    @property
    def rest(self) -> int:
        """The longest prompt rest after the common part (``_Tree.Tg``)."""
        return self.longest_prompt - self.common

    def add(self, items: Sequence[SAWItem]) -> "TreeCost":
        out = TreeCost()
        out.prompts, out.common = dict(self.prompts), self.common
        out.prompt_tokens, out.completion_tokens = self.prompt_tokens, self.completion_tokens
        out.count = self.count + len(items)
        out.longest_prompt = max([self.longest_prompt] + [len(it.prompt_ids) for it in items])
        out.longest_completion = max([self.longest_completion] + [len(it.completion_ids) for it in items])
        for it in items:
            p = tuple(it.prompt_ids)
            out.completion_tokens += len(it.completion_ids)
            if p in out.prompts:
                continue
            if out.prompts:
                out.common = _common([next(iter(out.prompts))[: out.common], p])
            else:
                out.common = len(p)
            out.prompts[p] = None
            out.prompt_tokens += len(p)
        return out


def _common(prompts: Sequence[Sequence[int]]) -> int:
    """Length of the prefix all ``prompts`` share (all of it for one prompt)."""
    first, n = prompts[0], min(len(p) for p in prompts)
    for i in range(n):
        if any(p[i] != first[i] for p in prompts):
            return i
    return n


def packed_states(decoder: Any, items: Sequence[SAWItem], rows: Tensor, cols: Tensor, *,
                  embeds: Tensor | None = None, start: int = 0, bottoms: Sequence[Bottom] | None = None) -> Tensor:
    """Final hidden states [N, H] at positions ``(rows, cols)`` of ``items`` (row ``b`` is item
    ``b``'s prompt + completion, as ``microbatch.collate`` lays them out).

    ``embeds`` [B, T, H], when given, are the hidden states entering layer ``start`` in that padded
    layout (a frozen bottom's cached output, ``frozen_cache.FrozenBottomCache``): the pass then runs the
    layers from ``start`` on. ``bottoms`` instead gives each item's prompt's frozen bottom (``start`` layers
    deep; ``inference.prefix_cache.Bottom``): the prompts enter layer ``start`` from it, and the completions run
    the bottom layers first, over their prompt's cached keys and values (``_replies_through_bottom``)."""
    device = rows.device
    tree = _Tree(items, device)
    cfg = decoder.config
    layers = list(decoder.layers[start : cfg.num_hidden_layers])
    if bottoms is not None:
        x = _replies_through_bottom(decoder, tree, items, bottoms, start)
    elif embeds is None:
        ids = torch.tensor(tree.ids, dtype=torch.long, device=device)
        x = decoder.embed_tokens(ids)  # [S, H]
    else:
        x = embeds[tree.src_row, tree.src_pos]
    cos, sin = decoder.rotary_emb(x[None], tree.src_pos[None])
    cos, sin = cos[0], sin[0]  # [S, D]
    checkpoint = bool(getattr(decoder, "gradient_checkpointing", False)) and torch.is_grad_enabled()
    for layer in layers:
        if checkpoint:
            x = torch.utils.checkpoint.checkpoint(_layer, layer, x, cos, sin, tree, use_reentrant=False)
        else:
            x = _layer(layer, x, cos, sin, tree)
    return decoder.norm(x.index_select(0, tree.flat_index(rows, cols)))


class _Tree:
    """The flat layout of a micro-batch: ``C`` common tokens, then the groups' prompt rests (group
    ``j``: ``g[j]`` tokens, padded to ``Tg`` for attention), then the items' completions (item
    ``b``: ``r[b]`` tokens, padded to ``Tr``). ``src_row`` / ``src_pos`` [S] give each flat token's
    row and position in the padded micro-batch; ``g_lin`` / ``r_lin`` where the flat tokens of each
    level sit in their padded block (row * width + position); ``group_mask`` / ``item_mask`` which
    keys a padded query reads."""

    def __init__(self, items: Sequence[SAWItem], device: Any) -> None:
        prompts: dict[tuple[int, ...], int] = {}
        group = [prompts.setdefault(tuple(it.prompt_ids), len(prompts)) for it in items]
        first = {j: b for b, j in reversed(list(enumerate(group)))}  # a row that holds group j's prompt
        plist = list(prompts)
        C = _common(plist)
        g = [len(p) - C for p in plist]
        r = [len(it.completion_ids) for it in items]
        self.C, self.J, self.B = C, len(plist), len(items)
        self.Tg, self.Tr = max(g), max(r + [1])
        src_row = [0] * C + [first[j] for j in range(self.J) for _ in range(g[j])]
        src_row += [b for b in range(self.B) for _ in range(r[b])]
        src_pos = list(range(C)) + [C + t for j in range(self.J) for t in range(g[j])]
        src_pos += [len(items[b].prompt_ids) + t for b in range(self.B) for t in range(r[b])]
        self.ids = list(plist[0][:C]) + [t for p in plist for t in p[C:]]
        self.ids += [t for it in items for t in it.completion_ids]
        as_long = lambda v: torch.tensor(v, dtype=torch.long, device=device)  # noqa: E731
        self.src_row, self.src_pos = as_long(src_row), as_long(src_pos)
        self.g_lin = as_long([j * self.Tg + t for j in range(self.J) for t in range(g[j])])
        self.r_lin = as_long([b * self.Tr + t for b in range(self.B) for t in range(r[b])])
        self.group = as_long(group)
        goff = [sum(g[:j]) for j in range(self.J)]
        roff = [sum(r[:b]) for b in range(self.B)]
        self.plen = as_long([len(p) for p in plist])[self.group]  # [B] each item's prompt length
        self.goff = C + as_long(goff)[self.group]  # [B] where the item's group rest starts, flat
        self.roff = C + sum(g) + as_long(roff)  # [B] where the item's completion starts, flat
        # a padded query always sees its own slot, so no softmax row is empty
        self.group_mask = torch.ones(self.Tg, C + self.Tg, dtype=torch.bool, device=device).tril_(C)
        seen_group = torch.arange(self.Tg, device=device)[None, :] < as_long(g)[self.group][:, None]  # [B, Tg]
        own = torch.ones(self.Tr, self.Tr, dtype=torch.bool, device=device).tril_()
        self.item_mask = torch.cat([torch.ones(self.B, self.Tr, C, dtype=torch.bool, device=device),
                                    seen_group[:, None, :].expand(-1, self.Tr, -1),
                                    own[None].expand(self.B, -1, -1)], -1)[:, None]  # [B, 1, Tr, C + Tg + Tr]

    def flat_index(self, rows: Tensor, cols: Tensor) -> Tensor:
        """Flat position of position ``cols`` of item ``rows``."""
        plen = self.plen[rows]
        return torch.where(cols < self.C, cols,
                           torch.where(cols < plen, self.goff[rows] + cols - self.C, self.roff[rows] + cols - plen))

    @staticmethod
    def padded(flat: Tensor, lin: Tensor, n: int, t: int) -> Tensor:
        """[m, ...] flat tokens of one level -> [n, t, ...] with zeros at padding. Through
        ``index_copy`` (its backward an ``index_select``): a (row, position) ``index_put`` and the
        accumulating ``index_put`` of an advanced-indexing gather's backward took about ten times
        as long on these shapes (0.47 ms against 0.05 ms for 300 rows of 576), 0.1 s of the GRPO
        benchmark's training step."""
        return flat.new_zeros(n * t, *flat.shape[1:]).index_copy(0, lin, flat).view(n, t, *flat.shape[1:])

    @staticmethod
    def unpadded(block: Tensor, lin: Tensor) -> Tensor:
        """[n, t, ...] -> the [m, ...] flat tokens at ``lin`` (``padded``'s inverse)."""
        return block.reshape(-1, *block.shape[2:]).index_select(0, lin)


@torch.no_grad()
def _replies_through_bottom(decoder: Any, tree: _Tree, items: Sequence[SAWItem], bottoms: Sequence[Bottom],
                            start: int) -> Tensor:
    """The tree layout's hidden states entering layer ``start`` [S, H]: the prompts' tokens read from their cached
    bottoms, the completions' computed through layers ``[0, start)`` over flat tokens. Each prompt is one row of
    the attention: its cached keys (left-aligned, [J, kv, P, D]) then its items' completions side by side, each
    completion token seeing the prompt and its own item's earlier tokens."""
    J, dev = tree.J, tree.src_row.device
    first = [0] * J
    for b in reversed(range(tree.B)):
        first[int(tree.group[b])] = b
    heads = [bottoms[b] for b in first]  # one bottom per group, in the tree's group order
    P = max(h.shape[0] for _, h in heads)
    hidden = heads[0][1].new_zeros(J, P, heads[0][1].shape[-1])
    kv0 = heads[0][0]
    kv = kv0.new_zeros(start, 2, J, kv0.shape[2], P, kv0.shape[4])
    for j, (entry, h) in enumerate(heads):
        hidden[j, : h.shape[0]] = h
        kv[:, :, j, :, : h.shape[0]] = entry
    n_prompt = tree.src_row.shape[0] - tree.r_lin.shape[0]
    x_prompt = hidden[tree.group[tree.src_row[:n_prompt]], tree.src_pos[:n_prompt]]
    r = [len(it.completion_ids) for it in items]
    if not sum(r):
        return x_prompt
    # each completion's tokens in its group's row, after the earlier items' of that group
    offset, at = [0] * J, []
    for b in range(tree.B):
        j = int(tree.group[b])
        at.append(offset[j])
        offset[j] += r[b]
    M = max(offset)
    lin = torch.tensor([int(tree.group[b]) * M + at[b] + t for b in range(tree.B) for t in range(r[b])],
                       dtype=torch.long, device=dev)
    item = torch.full((J, M), -1, dtype=torch.long, device=dev)
    item.view(-1)[lin] = torch.tensor([b for b in range(tree.B) for _ in range(r[b])], dtype=torch.long, device=dev)
    slot = torch.arange(M, device=dev)
    own = (item[:, :, None] == item[:, None, :]) & (slot[None, :, None] >= slot[None, None, :])
    own |= torch.eye(M, dtype=torch.bool, device=dev)[None]  # a padded query sees its own slot
    plen = torch.tensor([h.shape[0] for _, h in heads], device=dev)
    seen = (torch.arange(P, device=dev)[None, :] < plen[:, None])[:, None, :].expand(-1, M, -1)
    mask = torch.cat([seen, own], -1)[:, None]  # [J, 1, M, P + M]
    ids = torch.tensor([t for it in items for t in it.completion_ids], dtype=torch.long, device=dev)
    x = decoder.embed_tokens(ids)  # [R, H]
    cos, sin = decoder.rotary_emb(x[None], tree.src_pos[n_prompt:][None])
    for i, layer in enumerate(decoder.layers[:start]):
        x = _layer(layer, x, cos[0], sin[0], (J, M, lin, mask),
                   attend=functools.partial(_reply_attention, keys=kv[i, 0], values=kv[i, 1]))
    return torch.cat([x_prompt, x])


def _reply_attention(q: Tensor, k: Tensor, v: Tensor, scaling: float, rows: tuple[int, int, Tensor, Tensor], *,
                     keys: Tensor, values: Tensor) -> Tensor:
    """``_replies_through_bottom``'s attention in fp32: each prompt's row holds its replies' tokens (``rows``: J
    rows of M slots, the flat tokens' slots ``lin``, the mask [J, 1, M, P + M]) after its cached ``keys`` /
    ``values`` [J, kv, P, D]; q [R, heads, D], k / v [R, kv, D] -> [R, heads * D]."""
    J, M, lin, mask = rows
    qp, kp, vp = (_Tree.padded(t.float(), lin, J, M).transpose(1, 2) for t in (q, k, v))  # [J, h, M, D]
    o = torch.nn.functional.scaled_dot_product_attention(
        qp, torch.cat([keys.float(), kp], 2), torch.cat([values.float(), vp], 2), attn_mask=mask, scale=scaling,
        enable_gqa=qp.shape[1] != kp.shape[1])
    return _Tree.unpadded(o.transpose(1, 2).reshape(J, M, -1), lin)


def _layer(layer: Any, x: Tensor, cos: Tensor, sin: Tensor, tree: Any, attend: Any = None) -> Tensor:
    """One decoder layer (pre-norm attention + MLP, as the supported families wire it) on [S, H]; the attention
    is ``attend(q, k, v, scaling, tree)`` (default ``_attention`` over the tree layout)."""
    attn = layer.self_attn
    S, D = x.shape[0], attn.head_dim
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(S, -1, D)
    k = attn.k_proj(h).view(S, -1, D)
    v = attn.v_proj(h).view(S, -1, D)
    if hasattr(attn, "q_norm") and hasattr(attn, "k_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rotary(attn)(q, k, cos, sin, unsqueeze_dim=1)  # cos [S, D] -> [S, 1, D] over the heads
    o = (attend or _attention)(q, k, v, float(attn.scaling), tree)
    x = x + attn.o_proj(o.to(x.dtype))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _attention(q: Tensor, k: Tensor, v: Tensor, scaling: float, tree: _Tree) -> Tensor:
    """Causal attention of the tree layout in fp32: q [S, heads, D], k / v [S, kv, D] -> [S, heads * D].

    Up to three calls of torch's fused attention (grouped key/value heads read in place): the common
    part over itself, causally; the groups' parts (padded per group) over the common keys (a
    broadcast view, one copy in the concatenation) and their own; the completions (padded per item)
    over the common keys, their group's keys and their own. On the GRPO benchmark's shapes (143-token
    prefix, 8 rests of up to 33) the last kind took 6.1-6.3 ms per layer forward + backward, against
    7.2-7.7 ms for the same in grouped matmuls with one joint softmax."""
    S, heads, D = q.shape
    C, J, B, Tg, Tr = tree.C, tree.J, tree.B, tree.Tg, tree.Tr
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = heads != k.shape[1]
    q, k, v = q.float(), k.float(), v.float()
    ng = S - C - tree.r_lin.shape[0]  # tokens of the groups' parts
    heads_first = lambda t: t.transpose(1, 2)  # noqa: E731  [n, T, h, D] -> [n, h, T, D]
    out = []
    keys, values = [], []
    if C:
        kc, vc = k[:C].transpose(0, 1)[None], v[:C].transpose(0, 1)[None]  # [1, kv, C, D]
        o = sdpa(q[:C].transpose(0, 1)[None], kc, vc, is_causal=True, scale=scaling, enable_gqa=gqa)
        out.append(o[0].transpose(0, 1).reshape(C, heads * D))
    if Tg:
        sl = slice(C, C + ng)
        qg, kg, vg = (heads_first(tree.padded(t[sl], tree.g_lin, J, Tg)) for t in (q, k, v))
        kgc = torch.cat([kc.expand(J, -1, -1, -1), kg], 2) if C else kg
        vgc = torch.cat([vc.expand(J, -1, -1, -1), vg], 2) if C else vg
        o = sdpa(qg, kgc, vgc, attn_mask=tree.group_mask, scale=scaling, enable_gqa=gqa)
        out.append(tree.unpadded(o.transpose(1, 2).reshape(J, Tg, heads * D), tree.g_lin))
        keys.append(kg.index_select(0, tree.group))  # [B, kv, Tg, D]: each item's group
        values.append(vg.index_select(0, tree.group))
    sl = slice(C + ng, S)
    qr, kr, vr = (heads_first(tree.padded(t[sl], tree.r_lin, B, Tr)) for t in (q, k, v))
    if C:
        keys.insert(0, kc.expand(B, -1, -1, -1))
        values.insert(0, vc.expand(B, -1, -1, -1))
    kr = torch.cat(keys + [kr], 2) if keys else kr
    vr = torch.cat(values + [vr], 2) if values else vr
    o = sdpa(qr, kr, vr, attn_mask=tree.item_mask, scale=scaling, enable_gqa=gqa)  # [B, heads, Tr, D]
    out.append(tree.unpadded(o.transpose(1, 2).reshape(B, Tr, heads * D), tree.r_lin))
    return torch.cat(out) if len(out) > 1 else out[0]
