"""The forward pass that scores action tokens: ``score_actions`` runs the decoder once over a
micro-batch (``training.microbatch``) and applies the LM head only at positions that predict action
(completion) tokens, in chunks: on a 49k-token vocabulary most of the ``[B, T, V]`` logits a plain forward
would build belong to prompt tokens that are never trained on.

Where the decoder runs: the flat pass over real tokens (``training.packed``, CPU fast path, Llama-family
models), else the model's own decoder on the padded block with the shared prompt prefix computed once.
A frozen bottom's cached activations (``training.frozen_cache``) replace the lowest layers when given.
The log-probs: ``training.token_logp`` on the fast path, autograd's ``log_softmax`` otherwise.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from ludic import fastpath
from ludic.distributed import is_sharded
from ludic.tokenization import MIN_SHARED_PREFIX
from ludic.training.microbatch import MicroBatch, shared_prefix_len
from ludic.training.packed import packable, packed_states
from ludic.training.token_logp import _TokenLogp

if TYPE_CHECKING:
    from ludic.training.frozen_cache import FrozenBottomCache


def _decoder_and_head(model: Any) -> tuple[Any, Any] | None:
    """The transformer body and the LM head of an HF causal LM (peft-wrapped or not), where the
    head includes the model's own logit post-processing (``logits_fn``)."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    if not hasattr(base, "get_decoder") or not hasattr(base, "get_output_embeddings"):
        return None
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
