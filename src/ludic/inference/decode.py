"""A static-cache decode step for Llama-family models: the engine's one-token-at-a-time loop.

``TransformersEngine`` prefills a batch with the model's own forward, then hands the key/value
cache to a ``StaticDecoder``, which runs every following one-token step itself:

- keys and values live in one preallocated fp32 buffer per layer (``[B * kv_heads, L_max, D]``),
  written in place at the step's slot; transformers' dynamic cache ``torch.cat``-s every layer's
  keys and values at every step (O(L) copies per step), and for a bf16 model on CPU the decode
  attention then cast the whole cache to fp32 again in every layer and step;
- attention is one grouped matmul per layer in fp32 (no repeat of the key/value heads) over the
  filled slots, with an additive padding mask built once per batch;
- rotary angles are computed once per step for all layers (the model's own rotary module, so every
  rope type transformers supports works), and the causal mask is not rebuilt per step;
- the projections, norms and MLP are the model's own modules, called on 2-D ``[B, H]`` rows: plain
  ``nn.Linear``, peft LoRA linears and the engine's fused decode view all work unchanged.

Numerics follow the model's forward: projections and rotary in the model dtype, keys and values
rounded to it before they are stored (the fp32 buffer holds exactly the values a bf16 cache would),
attention in fp32, its output cast back. For a bf16 model on CPU that is what
``models.cpu_bf16_attention`` computes; the tests check greedy tokens and log-probs against the
model's own forward in fp32 and bf16.

Supported: the model types in ``SUPPORTED`` without a sliding window in effect (everything else,
including models with logit post-processing or multipliers such as Gemma or Granite, decodes with
the model's forward; ``StaticDecoder.build`` returns None).
"""

from __future__ import annotations

import sys
from typing import Any

import torch

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
"""``config.model_type`` values whose decoder layer is pre-norm attention + MLP with rotary q/k
(Qwen3 adds per-head q/k norms), a plain LM head, and no embedding, residual or logit multipliers."""


class StaticDecoder:
    """One-token decode steps over a preallocated fp32 key/value cache (see the module docstring).

    ``build(model)`` checks the architecture once; ``start`` copies a prefilled transformers cache in
    for a batch; ``step`` feeds one token per row and returns that position's logits."""

    def __init__(self, model: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = base.config
        self.body = base.get_decoder()
        self.head = base.get_output_embeddings()
        self.layers = list(self.body.layers[: self.config.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = self.config.num_attention_heads
        self.kv_heads = self.config.num_key_value_heads
        self.scaling = float(attn.scaling)
        self.qk_norm = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
        self.rope = sys.modules[type(attn).__module__].apply_rotary_pos_emb
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.mask: torch.Tensor | None = None
        self.slot = 0

    @classmethod
    def build(cls, model: Any) -> "StaticDecoder | None":
        """A decoder for ``model``, or None when its architecture is not one this step reproduces."""
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        cfg = getattr(base, "config", None)
        if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
            return None
        if getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True):
            return None
        if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in ("logits_scaling", "logit_scale")):
            return None
        try:
            body = base.get_decoder()
            layer = body.layers[0]
            attn = layer.self_attn
            parts = (body.embed_tokens, body.norm, body.rotary_emb, layer.input_layernorm,
                     layer.post_attention_layernorm, layer.mlp, attn.q_proj, attn.k_proj, attn.v_proj,
                     attn.o_proj, attn.head_dim, attn.scaling, base.get_output_embeddings())
        except (AttributeError, IndexError, TypeError, NotImplementedError):
            return None
        if any(p is None for p in parts) or not hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb"):
            return None
        return cls(model)

    def start(self, past: Any, attention_mask: torch.Tensor, max_new: int, rows: torch.Tensor | None = None) -> None:
        """Take a prefilled transformers cache (``past``: every layer's keys and values, [P, kv, L, D])
        and its 0/1 ``attention_mask`` [P, L] for a batch that decodes at most ``max_new`` tokens;
        ``rows`` [B] picks each decoded row's prefilled row (default: row i is prefilled row i)."""
        P, L = attention_mask.shape
        rows = torch.arange(P, device=attention_mask.device) if rows is None else rows
        B, total, D = rows.shape[0], L + max_new, self.head_dim
        self.keys, self.values = [], []
        for i in range(len(self.layers)):
            k, v = _layer_kv(past, i)
            if k.shape[0] != P or k.shape[-2] != L:
                raise ValueError(f"prefilled cache layer {i} is {tuple(k.shape)}, the batch is {P} rows of {L}")
            kb = torch.empty(B, self.kv_heads, total, D, dtype=torch.float32, device=k.device)
            vb = torch.empty_like(kb)
            kb[:, :, :L].copy_(k[rows])
            vb[:, :, :L].copy_(v[rows])
            self.keys.append(kb.view(B * self.kv_heads, total, D))
            self.values.append(vb.view(B * self.kv_heads, total, D))
        mask = torch.zeros(B, total, dtype=torch.float32, device=attention_mask.device)
        mask[:, :L].masked_fill_(attention_mask[rows] == 0, float("-inf"))
        # [B * kv, 1, total]: one row of key-slot biases per (row, kv head), shared by its query heads
        self.mask = mask.repeat_interleave(self.kv_heads, dim=0)[:, None, :]
        self.slot = L

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed ``input_ids`` [B] at ``positions`` [B]; the logits [B, V] (fp32) of the next token."""
        B, D, g = input_ids.shape[0], self.head_dim, self.heads // self.kv_heads
        t = self.slot
        if self.mask is None or t >= self.keys[0].shape[1]:
            raise RuntimeError("StaticDecoder.step: no room left in the cache (start() sized it)")
        x = self.body.embed_tokens(input_ids)  # [B, H]
        cos, sin = self.body.rotary_emb(x, positions[:, None])  # [B, 1, D] in the model dtype
        mask = self.mask[:, :, : t + 1]
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            h = layer.input_layernorm(x)
            q = attn.q_proj(h).view(B, self.heads, 1, D)
            k = attn.k_proj(h).view(B, self.kv_heads, 1, D)
            v = attn.v_proj(h).view(B, self.kv_heads, D)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = self.rope(q, k, cos, sin)  # [B, heads, 1, D], [B, kv, 1, D]
            kc, vc = self.keys[i], self.values[i]
            kc[:, t].copy_(k.reshape(B * self.kv_heads, D))
            vc[:, t].copy_(v.reshape(B * self.kv_heads, D))
            qf = q.reshape(B * self.kv_heads, g, D).float()  # query head j reads kv head j // g
            scores = torch.baddbmm(mask, qf, kc[:, : t + 1].transpose(1, 2), alpha=self.scaling)
            o = torch.bmm(torch.softmax(scores, -1), vc[:, : t + 1])  # [B * kv, g, D]
            x = x + attn.o_proj(o.reshape(B, self.heads * D).to(x.dtype))
            x = x + layer.mlp(layer.post_attention_layernorm(x))
        self.slot = t + 1
        return self.head(self.body.norm(x)).float()


def _layer_kv(past: Any, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s keys and values of a transformers cache (5.x ``layers``, or legacy tuples)."""
    layers = getattr(past, "layers", None)
    if layers is not None:
        return layers[i].keys, layers[i].values
    return past[i][0], past[i][1]
