"""Policy model set-up: load, optionally wrap with LoRA (peft), optionally checkpoint activations."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from ludic.inference.models import load_model, load_tokenizer


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter settings (peft)."""

    rank: int = 8
    alpha: float = 16.0
    dropout: float = 0.0
    target_modules: str = "all-linear"
    """Comma-separated module names, or "all-linear"."""


def apply_lora(model: Any, lora: LoraSettings) -> Any:
    from peft import LoraConfig, get_peft_model

    targets: Any = lora.target_modules
    if targets != "all-linear":
        targets = [t.strip() for t in targets.split(",") if t.strip()]
    cfg = LoraConfig(
        r=lora.rank, lora_alpha=lora.alpha, lora_dropout=lora.dropout,
        target_modules=targets, task_type="CAUSAL_LM",
    )
    return get_peft_model(model, cfg)


def load_policy(
    name: str | None,
    *,
    lora: LoraSettings | None = None,
    adapter: str | None = None,
    dtype: str = "auto",
    device: str = "cpu",
    seed: int = 0,
) -> tuple[Any, Any]:
    """(model, tokenizer) ready to train: LoRA-wrapped when ``lora`` is given.

    ``adapter`` is an existing LoRA adapter folder (e.g. an SFT cold start). It is
    merged into the base weights, so the starting policy is base + adapter; with
    ``lora`` a fresh LoRA then trains on top, and "adapters disabled" -- the KL
    reference -- is that starting policy, not the raw base model. (A vLLM server
    must then serve the merged weights: see ``save_merged_base``.)
    """
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
