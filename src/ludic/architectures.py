"""Which Hugging Face model families Ludic's own forward passes reproduce.

Two hot loops run a decoder layer by layer themselves instead of calling the model's forward:
``inference.decode.StaticDecoder`` (one-token decode steps over a static cache) and
``training.packed`` (the trainer's scoring pass over unpadded, prefix-shared tokens). Both call
the model's own modules (norms, projections, rotary embedding, MLP) and reproduce only the wiring
between them, which is the same for every family listed here. ``llama_like`` is the one check both
use; any other model runs its own forward, unchanged.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

SUPPORTED = ("llama", "mistral", "qwen2", "qwen3")
"""``config.model_type`` values whose decoder layer is pre-norm attention + MLP with rotary q/k
(Qwen3 adds per-head q/k norms), a plain LM head, and no embedding, residual or logit multipliers.
A model whose LM head is not a plain ``nn.Linear`` (a LoRA adapter on it, say) runs its own forward."""


def llama_like(model: Any) -> bool:
    """Whether ``model`` (an HF causal LM, peft-wrapped or not) is one of ``SUPPORTED`` with the parts
    a layer-by-layer forward reads, no sliding window in effect and no logit multipliers."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    if cfg is None or getattr(cfg, "model_type", None) not in SUPPORTED:
        return False
    if getattr(cfg, "sliding_window", None) is not None and getattr(cfg, "use_sliding_window", True):
        return False
    if any(getattr(cfg, k, None) not in (None, 1, 1.0) for k in ("logits_scaling", "logit_scale")):
        return False
    try:
        body = base.get_decoder()
        layer = body.layers[0]
        attn = layer.self_attn
        parts = (body.embed_tokens, body.norm, body.rotary_emb, layer.input_layernorm,
                 layer.post_attention_layernorm, layer.mlp, attn.q_proj, attn.k_proj, attn.v_proj,
                 attn.o_proj, attn.head_dim, attn.scaling, base.get_output_embeddings())
    except (AttributeError, IndexError, TypeError, NotImplementedError):
        return False
    import torch

    if type(base.get_output_embeddings()) is not torch.nn.Linear:  # e.g. a peft LoRA linear on the head
        return False
    return all(p is not None for p in parts) and hasattr(sys.modules[type(attn).__module__], "apply_rotary_pos_emb")


def rotary(attn: Any) -> Any:
    """The ``apply_rotary_pos_emb(q, k, cos, sin, unsqueeze_dim=1)`` of ``attn``'s modeling module."""
    return sys.modules[type(attn).__module__].apply_rotary_pos_emb


def decoder_layers(model: Any) -> Any:
    """The ModuleList of transformer blocks of an HF causal LM (peft-wrapped or not)."""
    from ludic.inference.models import is_peft, unwrap

    base = unwrap(model)
    base = base.get_base_model() if is_peft(base) else base
    layers = getattr(decoder_body(base), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(base).__name__}: expected .get_decoder().layers")
    return layers


def decoder_body(model: Any) -> Any:
    """The body of an HF causal LM (peft-wrapped or not): embeddings, layers and final norm, without the LM
    head (``get_decoder()``, else ``.model``); None when it has neither."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    return base.get_decoder() if hasattr(base, "get_decoder") else getattr(base, "model", None)


def frozen_bottom_layers(model: Any) -> int:
    """How many decoder layers from the bottom have no trainable parameter (0 when the input
    embeddings train): the part of the model ``training.lora.freeze_bottom`` froze, or below a LoRA
    on the top layers only. Their output for a given prefix never changes while the model trains."""
    if model.get_input_embeddings().weight.requires_grad:
        return 0
    n = 0
    for block in decoder_layers(model):
        if any(p.requires_grad for p in block.parameters()):
            break
        n += 1
    return n


@contextlib.contextmanager
def layer_range(decoder: Any, start: int, stop: int, final_norm: bool = True):
    """Run ``decoder`` (the model's body: ``get_decoder()``) as if it had only layers ``[start, stop)``
    (and, without ``final_norm``, no closing norm): its forward then maps the hidden states entering
    layer ``start`` (given as ``inputs_embeds``) to those leaving layer ``stop - 1``. The layers' cache
    indices are renumbered from 0 meanwhile, so a key/value cache built in the range holds its layers
    at 0.. (``inference.prefix_cache.BottomCache`` puts a frozen bottom's cache below them)."""
    import torch

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
