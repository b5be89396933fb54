"""The engine's decode fast path: a static-cache decode step, a fused LoRA decode view, packed weights.

``TransformersEngine`` prefills a batch with the model's own forward, then hands the key/value
cache to a ``StaticDecoder``, which runs every following one-token step itself:

- keys and values live in preallocated fp32 buffers per layer, written in place at the step's slot
  (transformers' dynamic cache ``torch.cat``-s every layer's keys and values at every step, and for a
  bf16 model on CPU the decode attention then cast the whole cache to fp32 again in every layer and
  step). A batch of P prompts x R samples keeps each prompt's keys once and attends them with its R
  rows together (``_grouped_attention``); other batches give each row its own copy;
- attention is grouped matmuls in fp32 (no repeat of the key/value heads), with an additive padding
  mask built once per batch;
- rotary angles are computed once per step for all layers (the model's own rotary module, so every
  rope type transformers supports works) and applied as ``x cos + roll(x) (sign * sin)``, and the
  norms run as ``rms_norm(x) * weight``, each where a probe at build time finds the model's own
  function gives the same bits (fewer operations; the model's own function elsewhere); the causal
  mask is not rebuilt per step;
- the projections and MLP are the model's own modules, called on 2-D ``[B, H]`` rows: plain
  ``nn.Linear``, peft LoRA linears and the fused decode view all work unchanged.

The decode view (``cast_adapter_view``) replaces a LoRA model's linears by ``_FusedLoraGroup``s in
the base dtype; their base weights, and a frozen LM head, are ``pack``-ed for oneDNN
(``inference.packing``: one packed copy per set of weights, however many views read it).

Numerics follow the model's forward: projections and rotary in the model dtype, keys and values
rounded to it before they are stored (the fp32 buffer holds exactly the values a bf16 cache would),
attention in fp32, its output cast back. For a bf16 model on CPU that is what
``models.cpu_bf16_attention`` computes; the tests check greedy tokens and log-probs against the
model's own forward in fp32 and bf16.

Supported: the model types in ``architectures.SUPPORTED`` without a sliding window in effect (everything else,
including models with logit post-processing or multipliers such as Gemma or Granite, decodes with
the model's forward; ``StaticDecoder.build`` returns None).
"""

from __future__ import annotations

from typing import Any

import torch

from ludic import fastpath
from ludic.architectures import llama_like, rotary
from ludic.inference.packing import PACK_ROWS, linear, pack, shared_weights  # noqa: F401 (decode.pack, decode.linear)

class StaticDecoder:
    """One-token decode steps over a preallocated fp32 key/value cache (see the module docstring).

    ``build(model)`` checks the architecture once; ``start`` copies a prefilled transformers cache in
    for a batch; ``step`` feeds one token per row and returns that position's logits."""

    def __init__(self, model: Any) -> None:
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        self.config = base.config
        self.body = base.get_decoder()
        self.head = base.get_output_embeddings()
        # a frozen head (LoRA: peft freezes it) is packed when the decoder is built (the engine rebuilds it after
        # weights_changed / swap_weights), one packed copy for every decoder over the same head (a frozen
        # opponent sharing the policy's); a head that trains is never packed (it changes every step)
        w = self.head.weight
        self.head_packed = None
        if not w.requires_grad and getattr(self.head, "bias", None) is None:
            self.head_packed = shared_weights([w], [None], w.dtype)
            self.head_packed.refresh()
        self.layers = list(self.body.layers[: self.config.num_hidden_layers])
        attn = self.layers[0].self_attn
        self.head_dim = attn.head_dim
        self.heads = self.config.num_attention_heads
        self.kv_heads = self.config.num_key_value_heads
        self.scaling = float(attn.scaling)
        self.qk_norm = hasattr(attn, "q_norm") and hasattr(attn, "k_norm")
        self.rope = rotary(attn)
        dtype = self.head.weight.dtype
        self._rolled = _rolled_rope_matches(self.rope, self.head_dim, dtype)
        self.norms = [(_fast_norm(layer.input_layernorm, dtype), _fast_norm(layer.post_attention_layernorm, dtype))
                      for layer in self.layers]
        self.keys: list[torch.Tensor] = []  # per layer [rows * kv, slots, D] fp32
        self.values: list[torch.Tensor] = []
        self.prompt_keys: list[torch.Tensor] = []  # grouped batches: per layer [prompts * kv, L, D]
        self.prompt_values: list[torch.Tensor] = []
        self.group = 0  # rows per prompt when grouped (see start), else 0
        self.mask: torch.Tensor | None = None
        self._zero: torch.Tensor | None = None  # baddbmm's ignored input (beta=0), made by start on the cache's device
        self.slot = 0

    @classmethod
    def build(cls, model: Any) -> "StaticDecoder | None":
        """A decoder for ``model``, or None when its architecture is not one this step reproduces."""
        return cls(model) if llama_like(model) else None

    def start(self, past: Any, attention_mask: torch.Tensor, max_new: int, rows: torch.Tensor | None = None) -> None:
        """Take a prefilled transformers cache (``past``: every layer's keys and values, [P, kv, L, D])
        and its 0/1 ``attention_mask`` [P, L] for a batch that decodes at most ``max_new`` tokens;
        ``rows`` [B] picks each decoded row's prefilled row (default: row i is prefilled row i).

        When the rows are R copies of each prefilled row in order (``rows`` = 0,0,..,1,1,..: a GRPO
        batch of P prompts x R samples, as the engine arranges it), the prompt's keys and values are
        kept once per prompt and attended by its R rows together (``_grouped_attention``): the
        attention then reads the prompt part of the cache once per prompt instead of once per row.
        Otherwise every row gets its own copy."""
        P, L = attention_mask.shape
        dev, D = attention_mask.device, self.head_dim
        rows = torch.arange(P, device=dev) if rows is None else rows
        B = rows.shape[0]
        R = B // P
        grouped = P < B and R * P == B and torch.equal(rows, torch.arange(P, device=dev).repeat_interleave(R))
        self.group = R if grouped else 0
        self.keys, self.values, self.prompt_keys, self.prompt_values = [], [], [], []
        self._zero = torch.zeros(1, 1, 1, dtype=torch.float32, device=dev)
        mask = torch.zeros(P, L, dtype=torch.float32, device=dev).masked_fill_(attention_mask == 0, float("-inf"))
        for i in range(len(self.layers)):
            k, v = layer_kv(past, i)
            if k.shape[0] != P or k.shape[-2] != L:
                raise ValueError(f"prefilled cache layer {i} is {tuple(k.shape)}, the batch is {P} rows of {L}")
            if grouped:  # the prompt once per prompt, then generated keys in (prompt, kv head, row) order
                self.prompt_keys.append(k.reshape(P * self.kv_heads, L, D).float())
                self.prompt_values.append(v.reshape(P * self.kv_heads, L, D).float())
                kb = torch.empty(B * self.kv_heads, max_new, D, dtype=torch.float32, device=dev)
                self.keys.append(kb)
                self.values.append(torch.empty_like(kb))
                continue
            kb = torch.empty(B, self.kv_heads, L + max_new, D, dtype=torch.float32, device=dev)
            vb = torch.empty_like(kb)
            kb[:, :, :L].copy_(k[rows])
            vb[:, :, :L].copy_(v[rows])
            self.keys.append(kb.view(B * self.kv_heads, L + max_new, D))
            self.values.append(vb.view(B * self.kv_heads, L + max_new, D))
        if grouped:  # [P * kv, 1, L]: the prompt's padding, shared by its rows' query heads
            self.mask = mask.repeat_interleave(self.kv_heads, dim=0)[:, None, :]
            self.slot = 0
        else:  # [B * kv, 1, L + max_new]: one row of key-slot biases per (row, kv head)
            full = torch.zeros(B, L + max_new, dtype=torch.float32, device=dev)
            full[:, :L] = mask[rows]
            self.mask = full.repeat_interleave(self.kv_heads, dim=0)[:, None, :]
            self.slot = L

    def release(self) -> None:
        """Drop the batch's buffers (``start`` sizes them by its rows, prompt and ``max_new``; the engine
        calls this when a batch ends, so they are not held until the next one)."""
        self.keys, self.values, self.prompt_keys, self.prompt_values = [], [], [], []
        self.mask = self._zero = None

    @torch.no_grad()
    def step(self, input_ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """Feed ``input_ids`` [B] at ``positions`` [B]; the logits [B, V] (fp32) of the next token."""
        B, D = input_ids.shape[0], self.head_dim
        t = self.slot
        if self.mask is None or t >= self.keys[0].shape[1]:
            raise RuntimeError("StaticDecoder.step: no room left in the cache (start() sized it)")
        x = self.body.embed_tokens(input_ids)  # [B, H]
        cos, sin = self.body.rotary_emb(x, positions[:, None])  # [B, 1, D] in the model dtype
        rope = self._rope(cos, sin)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            norm1, norm2 = self.norms[i]
            h = norm1(x)
            q = attn.q_proj(h).view(B, self.heads, 1, D)
            k = attn.k_proj(h).view(B, self.kv_heads, 1, D)
            v = attn.v_proj(h).view(B, self.kv_heads, D)
            if self.qk_norm:
                q, k = attn.q_norm(q), attn.k_norm(k)
            q, k = rope(q, k)  # [B, heads, 1, D], [B, kv, 1, D]
            if self.group:
                o = self._grouped_attention(q, k, v, i, t, x.dtype)
            else:
                o = self._row_attention(q, k, v, i, t, x.dtype)
            x = x + attn.o_proj(o)
            x = x + layer.mlp(norm2(x))
        self.slot = t + 1
        x = self.body.norm(x)
        if self.head_packed is None or self.head_packed.packed is None:
            return self.head(x).float()
        return self.head_packed(x).float()

    def _rope(self, cos: torch.Tensor, sin: torch.Tensor) -> Any:
        """The step's rotary embedding as ``f(q, k)``. Where the model's ``apply_rotary_pos_emb`` is
        the usual ``x cos + rotate_half(x) sin`` (checked bit for bit when the decoder is built), it
        runs as ``x cos + roll(x, D/2) (sign * sin)``: rotate_half(x) is roll(x) with its first half
        negated, and a sign flip is exact, so the result is the same bits in 4 operations per tensor
        instead of 7 (2 slices, a negation and a concatenation become one roll)."""
        if not self._rolled:
            return lambda q, k: self.rope(q, k, cos, sin)
        c, s = _rolled_factors(cos, sin)
        half = self.head_dim // 2
        return lambda q, k: (q * c + q.roll(half, -1) * s, k * c + k.roll(half, -1) * s)

    def _row_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int, t: int,
                       dtype: Any) -> torch.Tensor:
        """Every row over its own cache (keys and values [B * kv, slots, D], one row of key-slot biases
        per row and kv head in ``mask``): ``q`` [B, heads, 1, D] -> [B, heads * D] in ``dtype``."""
        B, D, g = q.shape[0], self.head_dim, self.heads // self.kv_heads
        kc, vc = self.keys[i], self.values[i]
        kc[:, t].copy_(k.reshape(B * self.kv_heads, D))
        vc[:, t].copy_(v.reshape(B * self.kv_heads, D))
        qf = q.reshape(B * self.kv_heads, g, D).float()  # query head j reads kv head j // g
        scores = torch.baddbmm(self.mask[:, :, : t + 1], qf, kc[:, : t + 1].transpose(1, 2), alpha=self.scaling)
        o = torch.bmm(torch.softmax(scores, -1), vc[:, : t + 1])  # [B * kv, g, D]
        return o.reshape(B, self.heads * D).to(dtype)

    def _grouped_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, i: int, t: int,
                           dtype: Any) -> torch.Tensor:
        """Rows r of prompt p (at p * R + r) over their prompt's keys (``prompt_keys[i]``:
        [P * kv, L, D], read once per prompt for all R rows, whose query heads are stacked:
        [P * kv, R * g, D]) and their own generated keys (``keys[i]``: [P * kv * R, slots, D], in
        (prompt, kv head, row) order, so the stacked queries need no reordering), one softmax over
        both: ``q`` [B, heads, 1, D] -> [B, heads * D] in ``dtype``. Ten operations a layer: the
        two cache writes, the queries' one reordering copy (cast to fp32 with it), two score
        matmuls (the scale folded in), the concatenation, the softmax, two value matmuls (the
        second accumulating in place), and the output's one reordering copy (cast back)."""
        B, D, kv = q.shape[0], self.head_dim, self.kv_heads
        g, R, n = self.heads // kv, self.group, t + 1
        P, L = B // R, self.prompt_keys[i].shape[1]
        kc, vc = self.keys[i], self.values[i]
        kc[:, t].view(P, kv, R, D).copy_(k.view(P, R, kv, D).transpose(1, 2))
        vc[:, t].view(P, kv, R, D).copy_(v.view(P, R, kv, D).transpose(1, 2))
        qf = torch.empty(P, kv, R, g, D, dtype=torch.float32, device=q.device)
        qf.copy_(q.view(P, R, kv, g, D).transpose(1, 2))
        prompt = torch.baddbmm(self.mask, qf.view(P * kv, R * g, D), self.prompt_keys[i].transpose(1, 2),
                               alpha=self.scaling)  # [P * kv, R * g, L]
        own = torch.baddbmm(self._zero, qf.view(B * kv, g, D), kc[:, :n].transpose(1, 2), beta=0,
                            alpha=self.scaling)  # [B * kv, g, n]
        p = torch.softmax(torch.cat([prompt.view(B * kv, g, L), own], -1), -1)
        o = torch.bmm(p[..., :L].view(P * kv, R * g, L), self.prompt_values[i]).view(B * kv, g, D)
        o.baddbmm_(p[..., L:], vc[:, :n])
        out = torch.empty(P, R, kv, g, D, dtype=dtype, device=q.device)
        out.copy_(o.view(P, kv, R, g, D).transpose(1, 2))
        return out.view(B, self.heads * D)


def _rolled_factors(cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sign * sin) with a heads axis ([B, 1, D] -> [B, 1, 1, D]), sign = -1 on the first half."""
    half = sin.shape[-1] // 2
    signed = torch.cat([-sin[..., :half], sin[..., half:]], -1)
    return cos.unsqueeze(1), signed.unsqueeze(1)


def _rolled_rope_matches(rope: Any, head_dim: int, dtype: Any) -> bool:
    """Whether ``rope`` (a modeling module's ``apply_rotary_pos_emb``) gives, bit for bit, what the
    rolled form in ``StaticDecoder._rope`` computes, on random inputs in ``dtype``."""
    if head_dim % 2:
        return False
    g = torch.Generator().manual_seed(0)
    q, k = (torch.randn(3, h, 1, head_dim, generator=g).to(dtype) for h in (4, 2))
    angles = torch.rand(3, 1, head_dim // 2, generator=g) * 100
    cos, sin = (torch.cat([f(angles)] * 2, -1).to(dtype) for f in (torch.cos, torch.sin))
    try:
        want = rope(q, k, cos, sin)
    except Exception:  # a signature this check does not know: the model's own function
        return False
    c, s = _rolled_factors(cos, sin)
    got = (q * c + q.roll(head_dim // 2, -1) * s, k * c + k.roll(head_dim // 2, -1) * s)
    return all(torch.equal(a, b) for a, b in zip(got, want))


def _fast_norm(module: Any, dtype: Any) -> Any:
    """``module`` (an RMSNorm of a supported family) as ``rms_norm(x) * weight``: torch's fused
    ``rms_norm`` normalises in fp32 and rounds once, which is what the Llama-family modules compute
    in six operations (cast up, square, mean, add eps, rsqrt, multiply, cast down) before the same
    weight multiply. Used where that is the same bits on a random input in ``dtype``; otherwise
    the module itself."""
    weight = getattr(module, "weight", None)
    eps = getattr(module, "variance_epsilon", getattr(module, "eps", None))
    if not isinstance(weight, torch.Tensor) or weight.dim() != 1 or not isinstance(eps, float):
        return module
    shape = (weight.shape[0],)

    def fused(x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.rms_norm(x, shape, None, eps) * weight

    g = torch.Generator().manual_seed(0)
    x = (torch.randn(7, shape[0], generator=g) * 3).to(dtype).to(weight.device)
    try:
        with torch.no_grad():
            same = torch.equal(fused(x), module(x))
    except Exception:
        return module
    return fused if same else module


class _FusedLoraGroup(torch.nn.Module):
    """LoRA linears that read the same input (q, k and v; gate and up; or one alone), for decoding
    only: ``x @ [W_1; ..; W_k]^T`` in one matmul (over ``pack``-ed weights where oneDNN is there),
    ``x @ [A_1; ..; A_k]^T`` in one small one, then ``+ scale * h_A @ B^T`` in one ``addmm`` with the
    block-diagonal B. Three matmuls where peft runs three per linear, plus its casts, dropout call,
    scaling multiply and add. The first member called with an input computes every member's output;
    the others take their columns. ``base`` (``packing.SharedWeights``) holds the stacked base weights,
    packed: one copy for every view over the same base tensors (the policy's and a frozen opponent's that
    shares them), repacked by ``repack`` after a full-weight load. ``lora_a`` and ``lora_b`` hold copies of
    the adapters in the decode dtype, which ``cast_adapter_view`` lists for refreshing (they live apart,
    so a training step repacks nothing)."""

    def __init__(self, bases: list[torch.nn.Linear], a: list[torch.Tensor], b: list[torch.Tensor],
                 scale: float, dtype: Any) -> None:
        super().__init__()
        self.scale = float(scale)
        outs = [m.out_features for m in bases]
        ranks = [t.shape[0] for t in a]
        self.cols = [sum(outs[:i]) for i in range(len(outs) + 1)]  # member i: columns cols[i]:cols[i+1]
        self.ranks = ranks
        with torch.no_grad():
            lora_a = torch.cat([t.to(dtype) for t in a])
            lora_b = torch.zeros(sum(outs), sum(ranks), dtype=dtype)
            r0 = 0
            for i, t in enumerate(b):
                lora_b[self.cols[i]:self.cols[i + 1], r0:r0 + ranks[i]] = t.to(dtype)
                r0 += ranks[i]
        self.base = shared_weights([m.weight for m in bases], [m.bias for m in bases], dtype)
        self.lora_a = torch.nn.Parameter(lora_a, requires_grad=False)
        self.lora_b = torch.nn.Parameter(lora_b, requires_grad=False)
        self._x: torch.Tensor | None = None
        self._y: torch.Tensor | None = None
        self._left = 0

    def copies(self) -> list[torch.Tensor]:
        """Views of the adapter copies, in the order A_1..A_k, B_1..B_k."""
        n = len(self.ranks)
        r = [sum(self.ranks[:i]) for i in range(n + 1)]
        a = [self.lora_a[r[i]:r[i + 1]] for i in range(n)]
        b = [self.lora_b[self.cols[i]:self.cols[i + 1], r[i]:r[i + 1]] for i in range(n)]
        return a + b

    def output(self, x: torch.Tensor, i: int) -> torch.Tensor:
        if x is not self._x:
            # 2-D input: on a strided 3-D input torch's linear expands the weight per row into a bmm
            x2 = x.reshape(-1, x.shape[-1])
            h = self.base(x2)
            y = torch.addmm(h, torch.nn.functional.linear(x2, self.lora_a), self.lora_b.t(), alpha=self.scale)
            self._x, self._y, self._left = x, y, len(self.ranks)
        y = self._y
        self._left -= 1
        if self._left <= 0:  # every member has its columns: hold no activations between calls
            self._x = self._y = None
        return y[:, self.cols[i]:self.cols[i + 1]].reshape(*x.shape[:-1], self.cols[i + 1] - self.cols[i])


class _GroupMember(torch.nn.Module):
    """Stands in for one LoRA linear of a ``_FusedLoraGroup``."""

    def __init__(self, group: _FusedLoraGroup, index: int) -> None:
        super().__init__()
        self.group, self.index = group, index

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.group.output(x, self.index)


_SIBLINGS = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))
"""Linears of one module that read the same input (Llama-style attention and MLP)."""


def plain_lora(module: Any) -> bool:
    """A peft LoRA linear with one plain adapter, active (no DoRA or other variant), unmerged, over
    nn.Linear: what the decode view fuses and ``training.lora._LoraLinear`` trains."""
    names = list(getattr(module, "lora_A", {}) or {})
    return (len(names) == 1 and isinstance(getattr(module, "base_layer", None), torch.nn.Linear)
            and not getattr(module, "merged", False) and not getattr(module, "lora_variant", {})
            and not getattr(module, "disable_adapters", False) and list(module.active_adapters) == names)


def cast_adapter_view(model: Any) -> tuple[Any, list[Any], list[Any]] | None:
    """(view, the tensors it copies from, the view's copies) for ``TransformersEngine(cast_adapters=True)``,
    or None when the model has no LoRA adapters. The view is a copy of the module tree that shares
    every parameter and buffer with ``model`` except at the LoRA linears, which become members of
    ``_FusedLoraGroup`` modules in the base dtype (q, k and v together; gate and up together; the
    others alone; where a linear cannot be fused, its adapters are cast to the base dtype).
    ``TransformersEngine._decode_model`` copies the sources into the view before every batch (see
    there for which)."""
    import copy

    params = list(model.named_parameters())
    lora = [(n, p) for n, p in params if "lora_" in n]
    base = [p for n, p in params if "lora_" not in n and p.is_floating_point()]
    if not lora or not base:
        return None
    dtype = base[0].dtype
    memo: dict[int, Any] = {id(p): p for n, p in params if "lora_" not in n}
    memo.update({id(b): b for b in model.buffers()})
    view = copy.deepcopy(model, memo)
    view.eval()
    src: list[Any] = []
    dst: list[Any] = []
    originals = dict(model.named_modules())
    fusable = {name for name, module in view.named_modules() if plain_lora(module)}
    def scale(name: str) -> float:
        o = originals[name]
        return float(o.scaling[next(iter(o.lora_A))])

    def alike(members: list[str]) -> bool:  # one matmul needs one input size and one LoRA scale
        return (len({originals[m].base_layer.in_features for m in members}) == 1
                and len({scale(m) for m in members}) == 1)

    groups: list[list[str]] = []
    for name in sorted(fusable):
        parent, _, attr = name.rpartition(".")
        sibs = next((g for g in _SIBLINGS if attr in g), ())
        members = [f"{parent}.{a}" if parent else a for a in sibs]
        if sibs and all(m in fusable for m in members) and alike(members):
            if attr == sibs[0]:
                groups.append(members)
        else:
            groups.append([name])
    for members in groups:
        origs = [originals[m] for m in members]
        keys = [next(iter(o.lora_A)) for o in origs]
        a = [o.lora_A[k].weight for o, k in zip(origs, keys)]
        b = [o.lora_B[k].weight for o, k in zip(origs, keys)]
        group = _FusedLoraGroup([o.base_layer for o in origs], a, b, scale(members[0]), dtype)
        for i, m in enumerate(members):
            parent, _, attr = m.rpartition(".")
            setattr(view.get_submodule(parent) if parent else view, attr, _GroupMember(group, i))
        src += a + b
        dst += group.copies()
    mine = dict(view.named_parameters())
    fused_src = {id(t) for t in src}
    for n, p in lora:  # adapters left in peft modules (not fusable): cast copies
        if id(p) in fused_src or n not in mine:
            continue
        q = mine[n]
        q.requires_grad_(False)
        q.data = q.data.to(dtype)
        src.append(p)
        dst.append(q)
    return view, src, dst


def repack(view: Any) -> None:
    """Stack and pack the base weights of every ``_FusedLoraGroup`` in ``view`` again (after the model's base
    weights changed: the packed tensors are snapshots)."""
    for module in view.modules():
        if isinstance(module, _FusedLoraGroup):
            module.base.refresh()


def layer_kv(past: Any, i: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Layer ``i``'s keys and values of a transformers cache (5.x ``layers``, or legacy tuples)."""
    layers = getattr(past, "layers", None)
    if layers is not None:
        return layers[i].keys, layers[i].values
    return past[i][0], past[i][1]
