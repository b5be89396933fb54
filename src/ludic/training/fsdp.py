"""FSDP2 (``torch.distributed.fsdp.fully_shard``) for the trainer: shard, gather, publish.

Under ``torchrun`` (gloo on CPU, NCCL on GPUs; ``ludic.distributed.init_distributed``)::

    model, tok = load_policy(name, lora=LoraSettings(rank=16))
    model = shard_model(model)                       # each decoder layer, then the root
    trainer = Trainer(model, algo, source, cfg, publisher=GatheringPublisher(publisher))

The ``Trainer`` needs nothing else: FSDP reduce-scatters the gradients itself
(averaged over ranks; the trainer, whose loss normalisers are whole-batch sums,
multiplies its gradient shards back by the world size, since gloo cannot
reduce with a custom divide factor), gradient
clipping works on the sharded (DTensor) gradients, and a rank with no items
still joins every collective. The loss normalisers are whole-batch sums over
ranks, so the update equals single-process training on the global batch
(``tests/test_fsdp.py`` checks loss and weights on CPU with 2 processes).

Mixed precision: the model's dtype (``--dtype``) is the compute dtype. A bf16 model is sharded as
fp32 parameters under ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``: fp32 masters
and optimizer state, bf16 forward and backward, fp32 gradient reduction (``shard_model``). An fp16 model
likewise computes in fp16 over fp32 shards, and the trainer scales its loss (``precision.needs_loss_scaling``).

Weights leave a sharded model through ``full_state_dict`` (every rank takes
part in the gather; rank 0 gets the full tensors, with LoRA deltas merged when
asked), which ``GatheringPublisher`` pushes to inference servers from rank 0,
and which ``Trainer.save`` writes as an ordinary checkpoint.
"""

from __future__ import annotations

from typing import Any

import torch

from ludic.distributed import is_rank0, is_sharded


def decoder_layers(model: Any) -> list[torch.nn.Module]:
    """The transformer blocks of a Hugging Face causal LM (peft-wrapped or not)."""
    m = model
    for attr in ("base_model", "model"):  # peft: PeftModel.base_model (LoraModel).model
        if hasattr(m, "peft_config") and hasattr(m, attr):
            m = getattr(m, attr)
    inner = getattr(m, "model", m)
    layers = getattr(inner, "layers", None) or getattr(getattr(inner, "decoder", None), "layers", None)
    if layers is None:
        raise ValueError(f"cannot find the decoder layers of {type(model).__name__} to shard")
    return list(layers)


def mixed_precision_policy(kind: str = "auto", compute_dtype: Any = None) -> Any:
    """None (train the parameters in their own dtype) or a ``MixedPrecisionPolicy`` for ``kind``:
    "auto" follows ``compute_dtype`` (the model's dtype, which ``--dtype`` chose: bf16 / fp16 compute
    over fp32 shards, nothing for fp32), "bf16" computes in bf16 whatever the model's dtype, "none"
    shards the parameters as they are. Gradients are reduced in fp32 under every policy."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if kind == "auto":
        kind = {torch.bfloat16: "bf16", torch.float16: "fp16"}.get(compute_dtype, "none")
    if kind == "none":
        return None
    if kind in ("bf16", "fp16"):
        param = torch.bfloat16 if kind == "bf16" else torch.float16
        return MixedPrecisionPolicy(param_dtype=param, reduce_dtype=torch.float32)
    raise ValueError(f"unknown FSDP mixed precision {kind!r}: use auto, bf16, fp16 or none")


def shard_model(model: Any, *, mixed_precision: str = "auto", reshard_after_forward: bool = True) -> Any:
    """``fully_shard`` each decoder layer, then the whole model (in place; returns it).

    Mixed precision as every peer does it: a model loaded in bf16 (``--dtype``) is sharded as fp32
    parameters (the masters: the optimizer and its state are fp32) and computes in bf16, FSDP casting
    each layer's gathered parameters and reducing gradients in fp32 (``MixedPrecisionPolicy``; see
    ``mixed_precision_policy`` for ``mixed_precision``). ``"none"`` shards the parameters as loaded:
    a bf16 model then trains pure bf16, losing every update under half an ulp (``training.precision``).

    Needs an initialised process group. Frozen and trainable parameters (LoRA)
    may share a layer: FSDP2 shards both and reduces only the gradients that exist.
    """
    from torch.distributed.fsdp import fully_shard

    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        raise RuntimeError("shard_model needs torch.distributed (launch with torchrun; see init_distributed)")
    dtypes = {p.dtype for p in model.parameters() if p.is_floating_point()}
    compute = next(iter(dtypes)) if len(dtypes) == 1 else None
    mp = mixed_precision_policy(mixed_precision, compute)
    if mp is not None:
        for p in model.parameters():  # fp32 shards: the masters FSDP casts from at every gather
            if p.is_floating_point() and p.dtype != torch.float32:
                p.data = p.data.float()
    kw: dict[str, Any] = {"reshard_after_forward": reshard_after_forward}
    if mp is not None:
        kw["mp_policy"] = mp
    for layer in decoder_layers(model):
        fully_shard(layer, **kw)
    fully_shard(model, **kw)
    return model


def full_state_dict(model: Any, *, merge_lora: bool = False) -> dict[str, torch.Tensor]:
    """The full (unsharded) state dict on rank 0, ``{}`` on the other ranks. Collective: call on every rank.
    A head tied to the embeddings is left out, as ``save_pretrained`` and inference servers expect.

    ``merge_lora`` folds each LoRA pair into its base weight (``W + scale * B @ A``) and drops
    the adapter tensors, giving the plain base-model weights an inference server loads.
    """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if not is_rank0():
        return {}
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):  # the embeddings are the head
        sd = {k: v for k, v in sd.items() if not k.endswith("lm_head.weight")}
    if not merge_lora:
        return sd
    scales = {name: module.scaling for name, module in model.named_modules() if hasattr(module, "lora_A")}
    out = {k: v for k, v in sd.items() if "lora_" not in k}
    for prefix, scaling in scales.items():
        for adapter, scale in scaling.items():
            a, b = sd.get(f"{prefix}.lora_A.{adapter}.weight"), sd.get(f"{prefix}.lora_B.{adapter}.weight")
            key = f"{prefix}.base_layer.weight"
            if a is not None and b is not None and key in out:
                out[key] = (out[key].float() + scale * (b.float() @ a.float())).to(out[key].dtype)
    return out


class GatheringPublisher:
    """Publishes a sharded model: every rank joins the gather, rank 0 pushes the merged full weights.

    ``inner`` is any full-weight publisher (``VLLMFullWeightsPublisher``, ``InProcessPublisher`` of
    a separate engine): it receives a name -> tensor mapping, as for any gathered state dict.
    """

    def __init__(self, inner: Any) -> None:
        self.inner = inner

    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        """Collective. Every rank returns rank 0's result, and only once the push is done: a rank that
        samples its next rollouts from the server must not get there before the new weights do."""
        from ludic.distributed import broadcast_object

        sd = full_state_dict(model, merge_lora=True) if is_sharded(model) else model
        result = None
        if is_rank0():
            result = self.inner.publish(sd, version, force=force) or {}
        return broadcast_object(result)

    def server_version(self) -> int | None:
        return self.inner.server_version() if hasattr(self.inner, "server_version") else None
