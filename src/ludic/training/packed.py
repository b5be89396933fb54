"""The trainer's scoring pass over a micro-batch's real tokens only, laid out flat.

``batching.score_hidden`` needs the final hidden state at every position that predicts an action
token. Through the model's own forward a micro-batch is a padded ``[B, T]`` block (a shared prompt
prefix computed once, then ``B`` rows padded to the longest rest), and every projection and MLP
multiplies the padding too: in the GRPO benchmark (completions of 3 to 32 tokens) a fifth of the
rows the linears multiplied were padding. For the model families of ``architectures.SUPPORTED``
``packed_states`` runs the decoder layer by layer over one flat sequence instead::

    [ shared prefix (L tokens, once) | item 0's rest | item 1's rest | ... ]     S = L + sum(rest)

- embeddings, norms, projections (LoRA included) and MLPs see ``[S, H]``: no padding, no prefix
  repeated;
- the prefix attends to itself causally; each item's rest, padded to the longest rest (attention
  only), attends to the whole prefix and causally to its own tokens (``_attention``);
- rotary positions restart after the prefix for every item, as in its own row.

It calls the model's own modules and reproduces only the wiring between them (``architectures``).
Numerics follow ``inference.models.cpu_bf16_attention``, the attention the model's forward uses for
a bf16 model on CPU: projections and rotary in the model dtype, attention in fp32, its output
rounded back once. The tests check hidden states and LoRA gradients against the padded forward.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from ludic.architectures import llama_like, rotary


def packable(model: Any) -> bool:
    """Whether ``packed_states`` reproduces ``model``'s forward: a supported family on CPU, not
    sharded (FSDP2's hooks need the model's own forward), with no attention dropout in effect (the
    flat layout has none)."""
    from ludic.training.fsdp import is_sharded

    if not llama_like(model) or is_sharded(model):
        return False
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if is_sharded(base) or next(base.parameters()).device.type != "cpu":
        return False
    return not (base.training and float(getattr(base.config, "attention_dropout", 0.0) or 0.0) > 0)


def packed_states(decoder: Any, input_ids: Tensor, attention_mask: Tensor, rows: Tensor, cols: Tensor,
                  prefix: int, embeds: Tensor | None = None, start: int = 0) -> Tensor:
    """Final hidden states [N, H] at positions ``(rows, cols)`` of the right-padded micro-batch
    ``input_ids`` / ``attention_mask`` [B, T], whose rows all start with the same ``prefix`` tokens
    (0: none shared). Every row must keep at least one token after the prefix, and every position
    asked for must lie after it (``batching.shared_prefix_len`` guarantees both for action tokens).

    ``embeds`` [B, T, H], when given, are the hidden states entering layer ``start`` (a frozen
    bottom's cached output, ``batching.FrozenBottomCache``): the pass then runs the layers from
    ``start`` on."""
    B, T = input_ids.shape
    L, Tr = prefix, T - prefix
    valid = attention_mask[:, L:].bool()
    rest = valid.sum(1)
    if bool((rest == 0).any()) or (L and bool((cols < L).any())):
        raise ValueError("packed_states: every row needs a token after the shared prefix, and every "
                         "scored position must lie after it")
    b_idx, t_idx = valid.nonzero(as_tuple=True)  # row by row: each item's rest is contiguous
    ids = torch.cat([input_ids[0, :L], input_ids[:, L:][valid]])
    pos = torch.cat([torch.arange(L, device=ids.device), t_idx + L])
    layout = _Layout(L, B, Tr, b_idx, t_idx)
    cfg = decoder.config
    layers = list(decoder.layers[start : cfg.num_hidden_layers])
    if embeds is None:
        x = decoder.embed_tokens(ids)  # [S, H]
    else:
        x = torch.cat([embeds[0, :L], embeds[:, L:][valid]])
    cos, sin = decoder.rotary_emb(x[None], pos[None])
    cos, sin = cos[0], sin[0]  # [S, D]
    checkpoint = bool(getattr(decoder, "gradient_checkpointing", False)) and torch.is_grad_enabled()
    for layer in layers:
        if checkpoint:
            x = torch.utils.checkpoint.checkpoint(_layer, layer, x, cos, sin, layout, use_reentrant=False)
        else:
            x = _layer(layer, x, cos, sin, layout)
    first = torch.cumsum(rest, 0) - rest  # where each item's rest starts in the flat tail
    return decoder.norm(x[first[rows] + cols])


class _Layout:
    """Where the flat tail's tokens sit in the padded ``[B, Tr]`` block of the rests (``b_idx``,
    ``t_idx``), after ``L`` prefix tokens; and which keys a rest's query reads there: the whole
    prefix and its own keys up to itself (``mask`` [Tr, L + Tr]; a real query never reaches the
    right padding)."""

    def __init__(self, L: int, B: int, Tr: int, b_idx: Tensor, t_idx: Tensor) -> None:
        self.L, self.B, self.Tr, self.b_idx, self.t_idx = L, B, Tr, b_idx, t_idx
        self.mask = torch.ones(Tr, L + Tr, dtype=torch.bool, device=b_idx.device).tril_(L)

    def padded(self, flat: Tensor) -> Tensor:
        """[n, ...] tail rows -> [B, Tr, ...] with zeros at padding."""
        out = flat.new_zeros(self.B, self.Tr, *flat.shape[1:])
        return out.index_put((self.b_idx, self.t_idx), flat)


def _layer(layer: Any, x: Tensor, cos: Tensor, sin: Tensor, layout: _Layout) -> Tensor:
    """One decoder layer (pre-norm attention + MLP, as the supported families wire it) on [S, H]."""
    attn = layer.self_attn
    S, D = x.shape[0], attn.head_dim
    h = layer.input_layernorm(x)
    q = attn.q_proj(h).view(S, -1, D)
    k = attn.k_proj(h).view(S, -1, D)
    v = attn.v_proj(h).view(S, -1, D)
    if hasattr(attn, "q_norm") and hasattr(attn, "k_norm"):
        q, k = attn.q_norm(q), attn.k_norm(k)
    q, k = rotary(attn)(q, k, cos, sin, unsqueeze_dim=1)  # cos [S, D] -> [S, 1, D] over the heads
    o = _attention(q, k, v, float(attn.scaling), layout)
    x = x + attn.o_proj(o.to(x.dtype))
    return x + layer.mlp(layer.post_attention_layernorm(x))


def _attention(q: Tensor, k: Tensor, v: Tensor, scaling: float, lay: _Layout) -> Tensor:
    """Causal attention of the flat layout in fp32: q [S, heads, D], k / v [S, kv, D] -> [S, heads * D].

    Two calls of torch's fused attention (grouped key/value heads read in place): the prefix over
    itself, causally; the rests, padded per item, over the prefix's keys (a broadcast view per item,
    one copy in the concatenation) and their own. On the GRPO benchmark's shapes (143-token prefix, 8
    rests of up to 33) forward and backward took 6.1-6.3 ms per layer, against 7.2-7.7 ms for the
    same in grouped matmuls with one joint softmax."""
    S, heads, D = q.shape
    L, B, Tr = lay.L, lay.B, lay.Tr
    sdpa = torch.nn.functional.scaled_dot_product_attention
    gqa = heads != k.shape[1]
    q, k, v = q.float(), k.float(), v.float()
    qt = lay.padded(q[L:]).transpose(1, 2)  # [B, heads, Tr, D]
    kt = lay.padded(k[L:]).transpose(1, 2)  # [B, kv, Tr, D]
    vt = lay.padded(v[L:]).transpose(1, 2)
    if not L:  # right padding: causal attention within each row is exact for its real queries
        o = sdpa(qt, kt, vt, is_causal=True, scale=scaling, enable_gqa=gqa)
        return o.transpose(1, 2).reshape(B, Tr, heads * D)[lay.b_idx, lay.t_idx]
    kp, vp = k[:L].transpose(0, 1)[None], v[:L].transpose(0, 1)[None]  # [1, kv, L, D]
    pre = sdpa(q[:L].transpose(0, 1)[None], kp, vp, is_causal=True, scale=scaling, enable_gqa=gqa)
    kt = torch.cat([kp.expand(B, -1, -1, -1), kt], 2)  # [B, kv, L + Tr, D]
    vt = torch.cat([vp.expand(B, -1, -1, -1), vt], 2)
    o = sdpa(qt, kt, vt, attn_mask=lay.mask, scale=scaling, enable_gqa=gqa)  # [B, heads, Tr, D]
    rests = o.transpose(1, 2).reshape(B, Tr, heads * D)[lay.b_idx, lay.t_idx]
    return torch.cat([pre[0].transpose(0, 1).reshape(L, heads * D), rests])
