"""Keys and values of prompts the engine prefilled before: the next turn of a dialog prefills only its new tokens.

A multi-turn episode's prompt at turn t is its prompt at turn t-1, the reply, and the env's next observation.
Without this cache ``TransformersEngine`` prefilled the whole dialog again at every turn: a GEM guess-the-number
evaluation (64 episodes, 6.2 turns each) prefilled 105,477 prompt tokens to sample 3,081, and took 5.8 minutes of
a 30-minute budget on a 2-core CPU. With it, each turn prefills the reply and the new observation after the
longest earlier prompt that begins the new one.

``PrefixCache`` holds, per prompt (its token ids), every layer's keys and values at that prompt's positions
0..n-1, least recently used first out once ``max_bytes`` is passed. Entries are valid for one set of weights:
``sync(key)`` with the engine's weights key (policy version, trainer steps, full loads) empties it when the
weights moved, so no token is ever sampled from keys computed by other weights.

``BottomCache`` holds less for longer: per prompt, the keys and values of a frozen bottom's layers (the decoder
layers below the lowest one that trains, ``architectures.frozen_bottom_layers``: below a LoRA on the top layers
only) and the hidden states leaving it. A trainer's step leaves them valid, so a prompt met again after any
number of steps (a fixed set of positions revisited by RL, the same questions evaluated each round) prefills the
trained layers only (``prefill_over_bottom``), and the trainer reads the same from its own copy
(``training.frozen_cache``).

``assemble`` lays out a batch whose rows resume from cached prefixes of different lengths the way the engine
already lays out a shared prefix: each row's cached part left-padded to the longest, then its tail left-padded,
with a 0/1 attention mask over both (positions come from the mask, so each token keeps the position it was
cached at). ``extract`` takes each row's keys and values back out of the prefilled batch for ``put``.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import Any

import torch

from ludic.architectures import decoder_body, layer_range

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""One prompt's cache: per layer (keys, values), each [kv heads, n, head dim]."""

Bottom = tuple[torch.Tensor, torch.Tensor]
"""One prompt's frozen bottom: its layers' keys and values, [layers, 2 (keys, values), kv heads, n, head dim], and
the hidden states leaving it, [n, hidden]."""


class PrefixCache:
    """Least-recently-used store of prompt caches (see the module docstring).

    Args:
        max_bytes: most bytes of keys and values held (0: off; ``longest`` then never finds anything).
    """

    def __init__(self, max_bytes: int = 2 << 30) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], tuple[KV, int]] = OrderedDict()
        self.lengths: dict[int, int] = {}  # prompt length -> entries of that length (lookups try each, longest first)
        self.bytes = 0
        self.key: Any = None
        self.stats = {"hits": 0, "misses": 0, "reused_tokens": 0, "evicted": 0}

    def sync(self, key: Any) -> None:
        """The weights the next batch runs with: a different key empties the cache."""
        if key != self.key:
            self.clear()
            self.key = key

    def clear(self) -> None:
        self.entries.clear()
        self.lengths.clear()
        self.bytes = 0

    def longest(self, prompt: list[int]) -> tuple[int, KV | None]:
        """The longest cached prompt that is a proper prefix of ``prompt`` (at least one token is left to
        prefill, whose logits start the reply): its length and cache, or ``(0, None)``."""
        if self.max_bytes > 0:
            for n in sorted((n for n in self.lengths if n < len(prompt)), reverse=True):
                key = tuple(prompt[:n])
                hit = self.entries.get(key)
                if hit is not None:
                    self.entries.move_to_end(key)
                    self.stats["hits"] += 1
                    self.stats["reused_tokens"] += n
                    return n, hit[0]
        self.stats["misses"] += 1
        return 0, None

    def put(self, prompt: list[int], kv: KV) -> None:
        """Hold ``prompt``'s cache (every layer's [kv heads, len(prompt), head dim] keys and values)."""
        if self.max_bytes <= 0:
            return
        key = tuple(prompt)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in kv)
        if key in self.entries or size > self.max_bytes:
            return
        self.entries[key] = (kv, size)
        self.lengths[len(key)] = self.lengths.get(len(key), 0) + 1
        self.bytes += size
        while self.bytes > self.max_bytes:
            old, (_, old_size) = self.entries.popitem(last=False)
            self.bytes -= old_size
            self.lengths[len(old)] -= 1
            if not self.lengths[len(old)]:
                del self.lengths[len(old)]
            self.stats["evicted"] += 1


def assemble(cached: list[tuple[int, KV | None]], tails: list[list[int]], pad_id: int, device: Any
             ) -> tuple[Any, torch.Tensor, torch.Tensor, int]:
    """A batch's prefill inputs when its rows resume from cached prefixes: (a transformers ``DynamicCache`` of
    the cached parts, [U, kv, C, D] per layer with C the longest; the tails' ``input_ids`` [U, T]; the attention
    mask [U, C + T]; C). Row u's cached part is right-aligned in its C columns and its tail in its T columns;
    a row without a cached prefix has all of its prompt in the tail."""
    from transformers import DynamicCache

    U = len(tails)
    C = max(n for n, _ in cached)
    T = max(len(t) for t in tails)
    ref = next(kv for n, kv in cached if kv is not None)
    input_ids = torch.full((U, T), pad_id, dtype=torch.long, device=device)
    attn = torch.zeros((U, C + T), dtype=torch.long, device=device)
    for u, ((n, _), tail) in enumerate(zip(cached, tails)):
        attn[u, C - n:C] = 1
        input_ids[u, T - len(tail):] = torch.tensor(tail, dtype=torch.long)
        attn[u, C + T - len(tail):] = 1
    past = DynamicCache()
    for layer, (k0, v0) in enumerate(ref):
        H, _, D = k0.shape
        keys = torch.zeros((U, H, C, D), dtype=k0.dtype, device=device)
        values = torch.zeros_like(keys)
        for u, (n, kv) in enumerate(cached):
            if n:
                keys[u, :, C - n:] = kv[layer][0]
                values[u, :, C - n:] = kv[layer][1]
        past.update(keys, values, layer)
    return past, input_ids, attn, C


def extract(past: Any, attn: torch.Tensor) -> list[KV]:
    """Each row's cache out of a prefilled batch: the keys and values of the columns its mask keeps, in order
    (its whole prompt, cached part and tail), copied so the batch's tensors can be freed."""
    from ludic.inference.decode import layer_kv

    layers = len(getattr(past, "layers", past))
    keep = [attn[u].nonzero().squeeze(-1) for u in range(attn.shape[0])]
    rows: list[KV] = [[] for _ in keep]
    for layer in range(layers):
        k, v = layer_kv(past, layer)
        for u, idx in enumerate(keep):
            rows[u].append((k[u].index_select(1, idx), v[u].index_select(1, idx)))
    return rows


class BottomCache:
    """Least-recently-used store of prompts' frozen bottoms (``Bottom``; see the module docstring).

    Valid while the bottom's weights stay as they are: ``sync(layers, model)`` empties it when the count of frozen
    layers or the model changes, and its owner calls ``clear()`` when weights are loaded
    (``TransformersEngine.weights_changed``).

    Args:
        max_bytes: most bytes held (0: off).
    """

    def __init__(self, max_bytes: int = 1 << 30) -> None:
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], tuple[Bottom, int]] = OrderedDict()
        self.bytes = 0
        self.layers = 0
        self._model: Any = None  # a weak reference to the model the entries came from
        self.stats = {"hits": 0, "misses": 0, "evicted": 0}

    def sync(self, layers: int, model: Any = None) -> None:
        """The frozen layers (and the model) the next lookups use: another count, or another model, empties it."""
        if layers != self.layers or (self._model() if self._model is not None else None) is not model:
            self.clear()
            self.layers, self._model = layers, (weakref.ref(model) if model is not None else None)

    def clear(self) -> None:
        self.entries.clear()
        self.bytes = 0

    def lookup(self, decoder: Any, prompts: list[list[int]], device: Any) -> list[Bottom]:
        """Each prompt's bottom (``decoder``: the model's body, ``architectures.decoder_body``): held ones
        from the cache, the others computed in one ``bottom_pass`` and held from now on. A prompt listed more
        than once (the items of a GRPO group) is looked up, counted and computed once."""
        found: dict[tuple[int, ...], Bottom | None] = {}
        for p in map(tuple, prompts):
            if p not in found:
                hit = self.entries.get(p)
                if hit is not None:
                    self.entries.move_to_end(p)
                found[p] = hit[0] if hit is not None else None
        missing = [p for p, b in found.items() if b is None]
        self.stats["hits"] += len(found) - len(missing)
        self.stats["misses"] += len(missing)
        if missing:
            for p, bottom in zip(missing, bottom_pass(decoder, self.layers, [list(p) for p in missing], device)):
                found[p] = bottom
                self._put(list(p), bottom)
        return [found[tuple(p)] for p in prompts]  # type: ignore[misc]

    def _put(self, prompt: list[int], bottom: Bottom) -> None:
        size = sum(t.numel() * t.element_size() for t in bottom)
        if size > self.max_bytes or tuple(prompt) in self.entries:
            return
        self.entries[tuple(prompt)] = (bottom, size)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, old) = self.entries.popitem(last=False)
            self.bytes -= old
            self.stats["evicted"] += 1


def last_index(n: int, device: Any = None) -> torch.Tensor:
    """``logits_to_keep`` for the last of ``n`` positions, as an index: transformers then gathers a
    contiguous [B, 1, H] hidden state. With ``logits_to_keep=1`` it slices a strided view, and on a
    peft-wrapped bf16 model torch's linear on that view expanded the LM head's weight once per row
    into a batched matmul: 553 ms instead of 2.6 ms for 16 rows of SmolLM2's 49152 x 576 head, at
    every prefill."""
    return torch.tensor([n - 1], device=device)


def bottom_pass(decoder: Any, layers: int, prompts: list[list[int]], device: Any) -> list[Bottom]:
    """The bottom ``layers`` of ``decoder`` over ``prompts`` in one left-padded batch (positions from the mask,
    as the engine lays prompts out): each prompt's ``Bottom``, copied out of the batch."""
    from transformers import DynamicCache

    from ludic.inference.decode import layer_kv

    T = max(len(p) for p in prompts)
    ids = torch.zeros((len(prompts), T), dtype=torch.long, device=device)
    attn = torch.zeros((len(prompts), T), dtype=torch.long, device=device)
    for u, p in enumerate(prompts):
        ids[u, T - len(p):] = torch.tensor(p, dtype=torch.long)
        attn[u, T - len(p):] = 1
    with torch.no_grad(), layer_range(decoder, 0, layers, final_norm=False):
        out = decoder(input_ids=ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0),
                      past_key_values=DynamicCache(), use_cache=True)
    kv = torch.stack([torch.stack(layer_kv(out.past_key_values, i)) for i in range(layers)])  # [L, 2, U, kv, T, D]
    return [(kv[:, :, u, :, T - len(p):].clone(), out.last_hidden_state[u, T - len(p):].clone())
            for u, p in enumerate(prompts)]


def prefill_over_bottom(model: Any, layers: int, bottoms: list[Bottom], prompts: list[list[int]], common: int
                        ) -> tuple[Any, Any, torch.Tensor]:
    """The engine's prefill of ``prompts`` whose frozen bottoms (``layers`` deep) are known: only the layers
    above run, from the hidden states leaving the bottom; the first ``common`` tokens (shared by every prompt)
    once, then each prompt's rest, left-padded, as ``TransformersEngine`` lays a batch out. Returns the top
    pass's output (its ``logits`` at the rests' positions), a transformers cache of every layer (the bottom's
    keys and values laid out the same way below the top's) and the attention mask [U, common + T]."""
    from transformers import DynamicCache

    from ludic.inference.decode import layer_kv

    decoder = decoder_body(model)
    U, dev = len(prompts), bottoms[0][1].device
    rests = [len(p) - common for p in prompts]
    T = max(rests)
    attn = torch.zeros((U, common + T), dtype=torch.long, device=dev)
    attn[:, :common] = 1
    x = bottoms[0][1].new_zeros(U, T, bottoms[0][1].shape[-1])
    for u, ((_, hidden), n) in enumerate(zip(bottoms, rests)):
        attn[u, common + T - n:] = 1
        x[u, T - n:] = hidden[common:]
    kv0 = bottoms[0][0]
    kv = kv0.new_zeros(layers, 2, U, kv0.shape[2], common + T, kv0.shape[4])
    for u, ((entry, _), n) in enumerate(zip(bottoms, rests)):
        kv[:, :, u, :, :common] = entry[..., :common, :]
        kv[:, :, u, :, common + T - n:] = entry[..., common:, :]
    past = DynamicCache()
    for i in range(layers):
        past.update(kv[i, 0], kv[i, 1], i)
    top = DynamicCache()
    with layer_range(decoder, layers, len(decoder.layers)):
        if common:
            model(inputs_embeds=bottoms[0][1][None, :common], past_key_values=top, use_cache=True,
                  logits_to_keep=last_index(common, dev))
            top.batch_repeat_interleave(U)
        out = model(inputs_embeds=x, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)[:, common:],
                    past_key_values=top, use_cache=True, logits_to_keep=last_index(T, dev))
    for j in range(len(top.layers)):
        past.update(*layer_kv(top, j), layers + j)
    return out, past, attn
