"""oneDNN-prepacked weights for the engine's decode matmuls (``pack``, ``linear``), and one packed copy per
set of weights however many decode views read them (``shared_weights``).

A decode step multiplies a few rows by every weight matrix. Unpacked, oneDNN reorders the weight on every
call: 16 rows x SmolLM2's linears streamed weights at 7-9 GB/s on a 2-core machine, 15-20 GB/s prepacked
(bf16 bit for bit; fp32 to rounding). A packed tensor is a copy, so it is made once per set of weights:
the decode view of the policy and the one of a frozen opponent that shares the policy's frozen base
(``training.reference.frozen_copy(share_frozen=True)``) read the same packed tensors.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from ludic import fastpath

PACK_ROWS = 16
"""The batch size oneDNN's weight layout is chosen for (``pack``); any row count works."""

_PACKING: dict[Any, bool] = {}  # dtype -> whether packed matmuls work (and match) on this machine


def pack(weight: torch.Tensor) -> torch.Tensor | None:
    """``weight`` [out, in] reordered into oneDNN's blocked layout, or None where that is not
    available (not CPU, not bf16 / fp32, a torch without oneDNN, or a probe that fails or differs).
    The packed tensor is a snapshot: repack after the weight changes."""
    if not fastpath.enabled(weight.device) or weight.dtype not in (torch.bfloat16, torch.float32):
        return None
    if weight.dtype not in _PACKING:
        _PACKING[weight.dtype] = _probe(weight.dtype)
    if not _PACKING[weight.dtype]:
        return None
    return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), PACK_ROWS)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, packed: torch.Tensor | None) -> torch.Tensor:
    """``F.linear(x, weight, bias)`` for 2-D ``x``, through ``packed`` (``pack(weight)``) when given."""
    if packed is None:
        return torch.nn.functional.linear(x, weight, bias)
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def _probe(dtype: Any) -> bool:
    try:
        if not torch.backends.mkldnn.is_available():
            return False
        g = torch.Generator().manual_seed(0)
        w, x = torch.randn(40, 24, generator=g).to(dtype), torch.randn(5, 24, generator=g).to(dtype)
        got = torch.ops.mkldnn._linear_pointwise(x, torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS),
                                                 None, "none", [None], "")
        want = torch.nn.functional.linear(x.float(), w.float())
        return got.dtype == dtype and bool(((got.float() - want).abs() <= 0.02 * want.abs().max()).all())
    except (RuntimeError, AttributeError):
        return False


class SharedWeights:
    """The weights of linears that read one input, stacked (``[W_1; ..; W_k]``, biases likewise) in ``dtype``
    and packed (``pack``) for ``linear``: ``packed``, or where packing is not available ``weight`` (the stacked
    copy, or the source itself when it is one tensor already in ``dtype``). The sources are held, not copied;
    ``refresh`` stacks and packs them again after their values changed (a full-weight load)."""

    def __init__(self, weights: list[torch.Tensor], biases: list[torch.Tensor | None], dtype: Any) -> None:
        self.weights, self.biases, self.dtype = list(weights), list(biases), dtype
        self.state: tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None] = (None, None, None)
        """(packed, weight, bias): replaced whole by ``refresh``, read once per call."""
        self.refresh()

    @property
    def packed(self) -> torch.Tensor | None:
        return self.state[0]

    @torch.no_grad()
    def refresh(self) -> None:
        """Stack and pack the sources' current values (swapped in whole: a reader sees the old or the new)."""
        parts = [w.detach().to(self.dtype) for w in self.weights]
        stacked = parts[0] if len(parts) == 1 else torch.cat(parts)
        packed = pack(stacked)
        bias = None if all(b is None for b in self.biases) else torch.cat(
            [b.detach().to(self.dtype) if b is not None else torch.zeros(w.shape[0], dtype=self.dtype, device=w.device)
             for w, b in zip(self.weights, self.biases)])
        self.state = (packed, stacked if packed is None else None, bias)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """``x`` [M, in] times the stacked weights, plus the stacked bias: [M, sum of outs]."""
        packed, weight, bias = self.state
        return linear(x, weight, bias, packed)  # type: ignore[arg-type]


_SHARED: "weakref.WeakValueDictionary[Any, SharedWeights]" = weakref.WeakValueDictionary()


def shared_weights(weights: list[torch.Tensor], biases: list[torch.Tensor | None], dtype: Any) -> SharedWeights:
    """The ``SharedWeights`` of these tensors in ``dtype``: made on first use and shared while anything holds it
    (keyed by the tensors' identities, which stay theirs while it holds them)."""
    key = (tuple(id(w) for w in weights), tuple(id(b) for b in biases), dtype)
    found = _SHARED.get(key)
    if found is None:
        found = SharedWeights(weights, biases, dtype)
        _SHARED[key] = found
    return found
