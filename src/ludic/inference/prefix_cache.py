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

``assemble`` lays out a batch whose rows resume from cached prefixes of different lengths the way the engine
already lays out a shared prefix: each row's cached part left-padded to the longest, then its tail left-padded,
with a 0/1 attention mask over both (positions come from the mask, so each token keeps the position it was
cached at). ``extract`` takes each row's keys and values back out of the prefilled batch for ``put``.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import torch

KV = list[tuple[torch.Tensor, torch.Tensor]]
"""One prompt's cache: per layer (keys, values), each [kv heads, n, head dim]."""


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
