"""The frozen-bottom cache: training with the bottom layers frozen (``freeze_bottom``, or a LoRA on the top layers
only) computes those layers' output once and reuses it on every later visit (``FrozenBottomCache``): per distinct
item for SFT on a fixed set (``per="item"``), per distinct prompt for RL that samples new replies to prompts it
met before (``per="prompt"``: a fixed set of positions, questions asked again). ``training.scoring`` reads it
through ``score_actions(..., bottom=cache)``.
"""

from __future__ import annotations

from typing import Any, Sequence

import torch
from torch import Tensor

from ludic.architectures import layer_range
from ludic.inference.prefix_cache import BottomCache, assemble
from ludic.training.microbatch import MicroBatch, collate
from ludic.training.packed import packed_states
from ludic.training.scoring import _decoder_and_head, _hidden_states
from ludic.types import SAWItem


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

    With ``per="prompt"`` the cache holds each distinct prompt's bottom instead (its layers' keys and values and
    the hidden states leaving it: ``inference.prefix_cache.BottomCache``, least recently used out past
    ``max_bytes``), and each step runs the bottom over the completions only, attending to their prompt's cached
    keys: RL's replies are new at every step, its prompts are not. In the rewards-only tic-tac-toe recipe the
    bottom then sees 4 replies of 3 tokens per group instead of those and the group's ~72-token prompt.
    """

    def __init__(self, model: Any, layers: int, max_bytes: int = 1 << 30, rtol: float = 1e-3,
                 per: str = "item") -> None:
        from ludic.architectures import decoder_layers

        blocks = decoder_layers(model)
        if not 0 < layers < len(blocks):
            raise ValueError(f"FrozenBottomCache: layers must be in 1..{len(blocks) - 1}, got {layers}")
        trainable = [n for n, p in model.named_parameters() if p.requires_grad and _below(n, layers)]
        if model.get_input_embeddings().weight.requires_grad or trainable:
            raise ValueError(
                f"FrozenBottomCache: the embeddings and the bottom {layers} layers must be frozen, but "
                f"{trainable[:3] or ['the input embeddings']} train (use freeze_bottom first)"
            )
        if per not in ("item", "prompt"):
            raise ValueError(f"FrozenBottomCache: per must be 'item' or 'prompt', got {per!r}")
        self.layers, self.max_bytes, self.rtol = layers, max_bytes, rtol
        self.bytes, self.hits, self.misses = 0, 0, 0
        self._states: dict[tuple[int, ...], Tensor] = {}
        self.prompts: BottomCache | None = None
        if per == "prompt":
            self.prompts = BottomCache(max_bytes)
            self.prompts.sync(layers, model)
        self._checked = False

    @classmethod
    def of(cls, model: Any, mode: str) -> "FrozenBottomCache | None":
        """The cache ``TrainerConfig.cache_frozen_bottom`` asks for (``off``: None) over ``model``'s frozen
        bottom (``architectures.frozen_bottom_layers``)."""
        from ludic.architectures import frozen_bottom_layers

        return None if mode == "off" else cls(model, frozen_bottom_layers(model), per=mode)

    def stats(self) -> dict[str, float]:
        """Distinct items (or prompts) stored, lookups that found theirs (``hits``) or computed it (``misses``),
        MiB held."""
        if self.prompts is not None:
            st = self.prompts.stats
            return {"items": float(len(self.prompts.entries)), "hits": float(st["hits"]),
                    "misses": float(st["misses"]), "mib": self.prompts.bytes / 2**20}
        return {"items": float(len(self._states)), "hits": float(self.hits), "misses": float(self.misses),
                "mib": self.bytes / 2**20}

    def fill(self, model: Any, items: Sequence[SAWItem], pad_id: int, rows: int = 64) -> None:
        """Compute the states of ``items`` now, ``rows`` at a time (so later steps all hit the cache
        and time the same: a budget fitted to the first steps then holds)."""
        decoder = _decoder_and_head(model)[0]
        device = next(model.parameters()).device
        for s in range(0, len(items), rows):
            self.inputs(decoder, collate(items[s : s + rows], pad_id, device))

    def inputs(self, decoder: Any, mb: MicroBatch) -> Tensor:
        """[B, T, H] hidden states entering layer ``layers`` (zeros at padding)."""
        if self.prompts is not None:
            return self._prompt_inputs(decoder, mb)
        keys = [tuple(it.prompt_ids) + tuple(it.completion_ids) for it in mb.items]
        fresh: dict[int, Tensor] = {}
        missing = [b for b, k in enumerate(keys) if k not in self._states]
        if missing:
            rows = torch.tensor(missing, device=mb.input_ids.device)
            with torch.no_grad(), layer_range(decoder, 0, self.layers, final_norm=False):
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

    def _prompt_inputs(self, decoder: Any, mb: MicroBatch) -> Tensor:
        """``inputs`` from the prompts' cached bottoms: each row's prompt part read, its completion run through
        the bottom layers over the prompt's cached keys and values (one left-padded batch)."""
        prompts = [list(it.prompt_ids) for it in mb.items]
        assert self.prompts is not None
        bottoms = self.prompts.lookup(decoder, prompts, mb.input_ids.device)
        B, T = mb.input_ids.shape
        x = bottoms[0][1].new_zeros(B, T, bottoms[0][1].shape[-1])
        for b, (_, hidden) in enumerate(bottoms):
            x[b, : hidden.shape[0]] = hidden
        tails = [list(it.completion_ids) for it in mb.items]
        if any(tails):
            per_layer = [(len(p), [(kv[i, 0], kv[i, 1]) for i in range(self.layers)]) for p, (kv, _) in zip(prompts, bottoms)]
            past, ids, attn, C = assemble(per_layer, tails, 0, mb.input_ids.device)
            with torch.no_grad(), layer_range(decoder, 0, self.layers, final_norm=False):
                h = decoder(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)[:, C:],
                            past_key_values=past, use_cache=True).last_hidden_state
            R = ids.shape[1]
            for b, (p, t) in enumerate(zip(prompts, tails)):
                x[b, len(p) : len(p) + len(t)] = h[b, R - len(t):]
        return x

    def hidden_states(self, decoder: Any, mb: MicroBatch, prefix: int) -> Tensor:
        """What ``_hidden_states(decoder, mb, prefix)`` returns, with the bottom read from the cache."""
        x = self.inputs(decoder, mb)
        with layer_range(decoder, self.layers, len(decoder.layers)):
            hidden = _hidden_states(decoder, mb, prefix, embeds=x)
        mask = mb.attention_mask.bool()
        self._check(decoder, mb, lambda plain: (hidden.detach()[mask], plain[mask]))
        return hidden

    def packed_states(self, decoder: Any, mb: MicroBatch) -> Tensor:
        """What ``packed.packed_states`` returns for ``mb`` ([N, H] at the action positions), with the
        bottom read from the cache."""
        if self.prompts is not None:  # flat: the replies through the bottom over their prompts' cached keys
            bottoms = self.prompts.lookup(decoder, [list(it.prompt_ids) for it in mb.items], mb.input_ids.device)
            h = packed_states(decoder, mb.items, mb.rows, mb.cols, start=self.layers, bottoms=bottoms)
        else:
            h = packed_states(decoder, mb.items, mb.rows, mb.cols, embeds=self.inputs(decoder, mb), start=self.layers)
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
