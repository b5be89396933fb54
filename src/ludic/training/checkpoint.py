"""Checkpoints that resume a run exactly where it stopped.

Layout of ``<root>/step_000010/``:

    model/            HF folder: the LoRA adapter (peft) or the full model, + tokenizer
    optimizer.pt      optimizer state        scheduler.pt   LR scheduler state
    rng.json          torch / python / numpy RNG states (JSON, no pickle)
    trainer_state.json {"step", "policy_version", "algorithm", ...}

``<root>/latest.json`` points at the newest complete checkpoint; a step
directory is written under a temporary name and renamed when complete, so a
crash mid-save never leaves a half checkpoint behind as "latest".
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from ludic.inference.models import is_peft


def save_checkpoint(
    root: str | Path,
    step: int,
    *,
    model: Any,
    optimizer: Any | None = None,
    scheduler: Any | None = None,
    tokenizer: Any | None = None,
    state: dict[str, Any] | None = None,
    max_to_keep: int | None = 2,
) -> Path:
    """Write a complete checkpoint for ``step`` and point ``latest.json`` at it."""
    root = Path(root)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model")
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    if optimizer is not None:
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
    if scheduler is not None:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    (tmp / "rng.json").write_text(json.dumps(_rng_state()))
    meta = {"step": step, "peft": is_peft(model), **(state or {})}
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2))
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    (root / "latest.json").write_text(json.dumps({"last_checkpoint": final.name, "step": step}))
    if max_to_keep:
        prune_checkpoints(root, max_to_keep)
    return final


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (None if there is none)."""
    root = Path(root)
    pointer = root / "latest.json"
    if pointer.exists():
        path = root / json.loads(pointer.read_text())["last_checkpoint"]
        if (path / "trainer_state.json").exists():
            return path
    steps = sorted(p for p in root.glob("step_*") if (p / "trainer_state.json").exists())
    return steps[-1] if steps else None


def prune_checkpoints(root: Path, max_to_keep: int) -> None:
    steps = sorted(p for p in root.glob("step_*") if p.is_dir())
    for old in steps[:-max_to_keep]:
        shutil.rmtree(old, ignore_errors=True)


def load_checkpoint(
    path: str | Path,
    *,
    model: Any,
    optimizer: Any | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore weights (adapter or full), optimizer, scheduler and RNG; return trainer state."""
    from safetensors.torch import load_file

    path = Path(path)
    if not (path / "trainer_state.json").exists():
        raise FileNotFoundError(f"{path} is not a Ludic checkpoint (no trainer_state.json)")
    state = json.loads((path / "trainer_state.json").read_text())
    mdir = path / "model"
    if is_peft(model):
        from peft import set_peft_model_state_dict

        weights = load_file(str(mdir / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"{mdir}: adapter keys not in the model: {unexpected[:5]}")
    else:
        files = sorted(mdir.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"{mdir}: no safetensors weights")
        sd: dict[str, torch.Tensor] = {}
        for f in files:
            sd.update(load_file(str(f)))
        missing, unexpected = model.load_state_dict(sd, strict=False)
        missing = [k for k in missing if not k.endswith("lm_head.weight")]
        if missing or unexpected:
            raise RuntimeError(f"{mdir}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if optimizer is not None and (path / "optimizer.pt").exists():
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    if scheduler is not None and (path / "scheduler.pt").exists():
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if restore_rng and (path / "rng.json").exists():
        _set_rng_state(json.loads((path / "rng.json").read_text()))
    return state


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": [version, list(internal), gauss],
    }
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))
