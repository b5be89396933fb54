"""Policy model set-up: load, optionally wrap with LoRA (peft), optionally checkpoint activations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ludic import fastpath
from ludic.architectures import decoder_layers, frozen_bottom_layers  # noqa: F401  (also imported from here)
from ludic.inference.decode import plain_lora
from ludic.inference.models import LOAD_LOCK, load_model, load_tokenizer


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings (peft)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str = "all-linear"
    """Comma-separated module names, or "all-linear"."""
    top_layers: int = 0
    """Adapt only the top N decoder layers (0: all). The backward pass then stops at the
    lowest adapted layer: with half the layers, a training step costs about a third less."""


def top_layer_count(share: float, n_layers: int) -> int:
    """How many of ``n_layers`` decoder layers are "the top ``share``" of them: ``round(share * n_layers)``,
    at least 1 and at most all of them (the one rounding every ``--lora-layer-share`` flag uses)."""
    return min(n_layers, max(1, round(share * n_layers)))


def freeze_bottom(model: Any, layers: int) -> int:
    """Freeze the input embeddings (and so a tied LM head) and the bottom ``layers`` decoder
    layers: autograd then never goes below the lowest trainable layer, so a step skips their
    backward pass. Returns the number of parameters left trainable."""
    blocks = decoder_layers(model)
    if not 0 <= layers < len(blocks):
        raise ValueError(f"can freeze 0..{len(blocks) - 1} of the {len(blocks)} decoder layers, got {layers}")
    if layers:
        model.get_input_embeddings().weight.requires_grad_(False)
        for block in blocks[:layers]:
            for p in block.parameters():
                p.requires_grad_(False)
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def apply_lora(model: Any, lora: LoraSettings) -> Any:
    from peft import LoraConfig, get_peft_model

    targets: Any = lora.target_modules
    extra: dict[str, Any] = {}
    if lora.top_layers:
        blocks = decoder_layers(model)
        n = len(blocks)
        if not 0 < lora.top_layers <= n:
            raise ValueError(f"LoRA top_layers must be 1..{n} for this model, got {lora.top_layers}")
        if targets == "all-linear":  # peft takes a layer subset only with explicit module names
            targets = ",".join(sorted({name.rsplit(".", 1)[-1] for name, m in blocks.named_modules()
                                       if isinstance(m, torch.nn.Linear)}))
        extra["layers_to_transform"] = list(range(n - lora.top_layers, n))
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    cfg = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=targets, task_type="CAUSAL_LM", **extra,
    )
    model = get_peft_model(model, cfg)
    fuse_lora_linears(model)
    return model


class _LoraLinear(torch.autograd.Function):
    """``y = x W^T + b + s (x A^T) B^T`` for a frozen base ``W``, computed in ``x``'s dtype, with a
    hand-written backward:

        g_A' = s (dy B)            dx = dy W + g_A' A
        dA   = g_A'^T x            dB = s dy^T (x A^T)

    The adapters (fp32 master weights under a bf16 base) are cast once per call, not the
    activations: peft casts every LoRA linear's input to fp32, runs both adapter matmuls there,
    adds in fp32 and casts the sum back, in the forward and again in the backward. In fp32 the
    two compute the same thing; in bf16 the adapter product is rounded to bf16 like every other
    matmul of the step, and the adapters' gradients are cast back to their fp32 dtype."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float) -> torch.Tensor:
        a, b = lora_a.to(x.dtype), lora_b.to(x.dtype)
        x2 = x.reshape(-1, x.shape[-1])
        xa = torch.nn.functional.linear(x2, a)  # [M, r]
        y = torch.nn.functional.linear(x2, weight, bias).addmm_(xa, b.t(), alpha=scale)
        ctx.save_for_backward(x2, xa, weight, a, b)
        ctx.scale, ctx.shape, ctx.dtypes = scale, x.shape, (lora_a.dtype, lora_b.dtype)
        return y.view(*x.shape[:-1], y.shape[-1])

    @staticmethod
    def backward(ctx: Any, dy: torch.Tensor) -> tuple[Any, ...]:
        x2, xa, weight, a, b = ctx.saved_tensors
        dy2 = dy.reshape(-1, dy.shape[-1])
        g = torch.mm(dy2, b).mul_(ctx.scale)  # [M, r]
        dx = da = db = None
        if ctx.needs_input_grad[0]:
            dx = torch.mm(dy2, weight).addmm_(g, a).view(ctx.shape)
        if ctx.needs_input_grad[3]:
            da = torch.mm(g.t(), x2).to(ctx.dtypes[0])
        if ctx.needs_input_grad[4]:
            db = torch.mm(dy2.t(), xa).mul_(ctx.scale).to(ctx.dtypes[1])
        return dx, None, None, da, db, None


def _lora_forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    """A peft LoRA linear's forward through ``_LoraLinear`` where that computes the same thing: one
    active plain adapter (``decode.plain_lora``), no dropout in training, a frozen base, plain (not
    sharded) tensors, no extra arguments, the fast path on (``ludic.fastpath``). Otherwise peft's own."""
    if not (args or kwargs) and fastpath.enabled(x.device) and _routable(self, x):
        k = self.active_adapters[0]
        base = self.base_layer
        return _LoraLinear.apply(x, base.weight, base.bias, self.lora_A[k].weight, self.lora_B[k].weight,
                                 float(self.scaling[k]))
    return type(self).forward(self, x, *args, **kwargs)


def _routable(module: Any, x: torch.Tensor) -> bool:
    if not plain_lora(module) or not x.is_floating_point():
        return False
    k = module.active_adapters[0]
    tensors = (module.base_layer.weight, module.lora_A[k].weight, module.lora_B[k].weight)
    return (not tensors[0].requires_grad
            and (not module.training or isinstance(module.lora_dropout[k], torch.nn.Identity))
            and all(type(t) is torch.nn.Parameter and type(t.data) is torch.Tensor for t in tensors))


def fuse_lora_linears(model: Any) -> int:
    """Route every peft LoRA linear of ``model`` through ``_LoraLinear`` (``_lora_forward``, which falls
    back to peft's forward wherever the two would differ). Parameters, state dicts and saved adapters
    are unchanged. Returns the number of linears routed. The GRPO benchmark's training step
    (16 items, bf16, LoRA r16 on every linear): about 3.1 s through peft, 2.7 s through this."""
    import types

    from peft.tuners.lora import Linear as LoraLinear

    n = 0
    for module in model.modules():
        if isinstance(module, LoraLinear):
            module.forward = types.MethodType(_lora_forward, module)
            n += 1
    return n


def load_policy(
    name: str | None,
    *,
    lora: LoraSettings | None = None,
    adapter: str | None = None,
    dtype: str = "auto",
    device: str = "auto",
    seed: int = 0,
) -> tuple[Any, Any]:
    """(model, tokenizer) ready to train: LoRA-wrapped when ``lora`` is given.

    ``adapter`` is an existing LoRA adapter folder (e.g. an SFT cold start). It is
    merged into the base weights, so the starting policy is base + adapter; with
    ``lora`` a fresh LoRA then trains on top, and "adapters disabled" -- the KL
    reference -- is that starting policy, not the raw base model. (A vLLM server
    must then serve the merged weights: see ``save_merged_base``.)

    ``device`` "auto" is the GPU when PyTorch sees one, else the CPU (``$LUDIC_DEVICE`` overrides:
    ``inference.models.resolve_device``); engines and the trainer follow the model's device.
    """
    with LOAD_LOCK:  # one load at a time per process (threads: --overlap), the seeded init included
        torch.manual_seed(seed)
        tok = load_tokenizer(name)
        model = load_model(name, dtype=dtype, device=device)
        if adapter is not None:
            from peft import PeftModel

            model = PeftModel.from_pretrained(model, adapter).merge_and_unload()
        if lora is not None:
            torch.manual_seed(seed)
            model = apply_lora(model, lora)
    return model, tok


def save_merged_base(model: Any, tokenizer: Any, out: Path) -> Path:
    """Save the weights under the trainable LoRA (the base with any ``--adapter`` merged in) as an HF
    folder, for an inference server to serve. Call it before training: a fresh LoRA adds nothing yet."""
    from safetensors.torch import save_file

    from ludic.inference.models import is_peft
    from ludic.inference.publish import merged_state_dict

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    base = model.get_base_model() if is_peft(model) else model
    base.config.save_pretrained(out)
    if getattr(base, "generation_config", None) is not None:
        base.generation_config.save_pretrained(out)
    save_file(merged_state_dict(model, dtype=None), str(out / "model.safetensors"), metadata={"format": "pt"})
    tokenizer.save_pretrained(out)
    return out
