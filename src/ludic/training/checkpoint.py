"""Checkpoints that resume a run exactly where it stopped, and survive a crash at any point.

Layout of ``<root>/step_000010/``:

    model/            HF folder: the LoRA adapter (peft) or the full model, + tokenizer
    master_weights.safetensors  fp32 masters of low-precision trained parameters (mixed precision)
    optimizer.pt      optimizer state        scheduler.pt   LR scheduler state
    rng.json          torch (CPU, CUDA) / python / numpy RNG states (JSON, no pickle)
    trainer_state.json {"step", "policy_version", "algorithm", "source_state", ...}  (written last)

``<root>/latest.json`` points at the newest complete checkpoint. Every change
is a rename, so a crash (even ``kill -9``) at any point leaves a loadable
latest checkpoint:

1. the step is written into ``.tmp_step_N``, every file and folder of it fsynced, and renamed to
   ``step_N`` when complete (a step saved again is first moved aside to ``.old_step_N``);
2. the pointer is written to ``latest.json.tmp`` and renamed over ``latest.json``;
3. old steps are renamed to ``.del_step_N`` before they are deleted, so a half-deleted
   folder never looks like a checkpoint.

``latest_checkpoint`` follows the pointer when it names a complete step, and otherwise
(torn or stale pointer) takes the newest complete ``step_*`` folder. The environment
variable ``LUDIC_FAULT_AT=<point>`` (optionally with ``LUDIC_FAULT_STEP=<N>``) kills the
process at one of ``FAULT_POINTS``: the crash tests use it.
"""

from __future__ import annotations

import json
import os
import random
import shutil
from pathlib import Path
from typing import Any

import torch

from ludic.inference.models import is_peft

FAULT_POINTS = ("tmp_written", "old_moved", "renamed", "pointer_tmp", "pointed", "pruning")
"""Points of ``save_checkpoint`` where the fault hook can kill the process."""
FAULT_EXIT_CODE = 86


def _fault(point: str, step: int) -> None:
    """Die here (exit code 86, no clean-up) if ``LUDIC_FAULT_AT`` names this point (test hook)."""
    if os.environ.get("LUDIC_FAULT_AT") == point and os.environ.get("LUDIC_FAULT_STEP", str(step)) == str(step):
        os._exit(FAULT_EXIT_CODE)


def kill_point(step: int) -> None:
    """Test hook: ``kill -9`` this process (no clean-up at all) once step ``$LUDIC_KILL_AFTER_STEP`` is logged."""
    if os.environ.get("LUDIC_KILL_AFTER_STEP") == str(step):
        import signal

        os.kill(os.getpid(), signal.SIGKILL)


def write_json_atomic(path: Path, obj: Any, step: int = -1) -> None:
    """Write JSON to ``path`` so readers see the old file or the new one, never a torn one."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(json.dumps(obj))
        f.flush()
        os.fsync(f.fileno())
    _fault("pointer_tmp", step)
    os.replace(tmp, path)
    fsync_dir(path.parent)


def fsync_dir(path: Path) -> None:
    """fsync a folder: its entries (new names, renames) reach the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_tree(root: Path) -> None:
    """fsync every file under ``root``, then every folder, deepest first, ``root`` last."""
    for p in sorted(root.rglob("*"), key=lambda q: len(q.parts), reverse=True):
        if p.is_file():
            with open(p, "rb") as f:
                os.fsync(f.fileno())
    for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda q: len(q.parts), reverse=True):
        fsync_dir(d)
    fsync_dir(root)


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
    model_state: dict[str, Any] | None = None,
    optimizer_state: dict[str, Any] | None = None,
    master_weights: dict[str, torch.Tensor] | None = None,
    tensor_files: dict[str, dict[str, torch.Tensor]] | None = None,
) -> Path:
    """Write a complete checkpoint for ``step`` and point ``latest.json`` at it (crash-safe, see above).

    ``model_state`` / ``optimizer_state``: full state dicts gathered from a sharded (FSDP2) model,
    written instead of the model's and optimizer's own (which hold only this rank's shards).
    ``master_weights``: fp32 masters of a bf16 / fp16 model's trained parameters (``training.precision``):
    the model folder holds their rounding, a resume needs them exactly.
    ``tensor_files``: more safetensors files for the folder, ``{file name: tensors}`` (the KL reference)."""
    root = Path(root)
    final = root / f"step_{step:06d}"
    tmp = root / f".tmp_step_{step:06d}"
    old = root / f".old_step_{step:06d}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp / "model", **({"state_dict": model_state} if model_state is not None else {}))
    if tokenizer is not None:
        tokenizer.save_pretrained(tmp / "model")
    _save_value_head(model, tmp)
    for name, tensors in {MASTER_WEIGHTS_FILE: master_weights, **(tensor_files or {})}.items():
        if tensors:
            from safetensors.torch import save_file

            save_file({k: v.detach().contiguous().cpu() for k, v in tensors.items()}, str(tmp / name))
    if optimizer is not None:
        torch.save(optimizer_state if optimizer_state is not None else optimizer.state_dict(), tmp / "optimizer.pt")
    if scheduler is not None:
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
    (tmp / "rng.json").write_text(json.dumps(_rng_state()))
    meta = {"step": step, "peft": is_peft(model), **(state or {})}
    (tmp / "trainer_state.json").write_text(json.dumps(meta, indent=2))  # last: marks the folder complete
    fsync_tree(tmp)  # on disk before it counts: the pipeline acknowledges entries (XACK) right after
    _fault("tmp_written", step)
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        final.rename(old)
        _fault("old_moved", step)
    tmp.rename(final)
    fsync_dir(root)
    _fault("renamed", step)
    write_json_atomic(root / "latest.json", {"last_checkpoint": final.name, "step": step}, step)
    _fault("pointed", step)
    shutil.rmtree(old, ignore_errors=True)
    if max_to_keep:
        prune_checkpoints(root, max_to_keep, step)
    return final


def _is_complete(path: Path) -> bool:
    return path.is_dir() and (path / "trainer_state.json").exists()


def _step_of(path: Path) -> int:
    try:
        return int(path.name.split("_")[-1])
    except ValueError:
        return -1


def latest_checkpoint(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root`` (None if there is none)."""
    root = Path(root)
    try:
        name = json.loads((root / "latest.json").read_text())["last_checkpoint"]
        if isinstance(name, str) and _is_complete(root / name):
            return root / name
    except (OSError, ValueError, KeyError, TypeError):
        pass  # no pointer, or torn / stale: scan the folders
    steps = sorted((p for p in root.glob("step_*") if _is_complete(p)), key=_step_of)
    return steps[-1] if steps else None


def checkpoint_steps(root: str | Path) -> list[int]:
    """The steps of the complete checkpoints under ``root``."""
    return sorted(_step_of(p) for p in Path(root).glob("step_*") if _is_complete(p))


def prune_checkpoints(root: Path, max_to_keep: int, step: int = -1) -> None:
    """Delete all but the newest ``max_to_keep`` steps (renamed away first, then removed)."""
    for stale in root.glob(".del_step_*"):  # left by an earlier crash
        shutil.rmtree(stale, ignore_errors=True)
    steps = sorted((p for p in root.glob("step_*") if p.is_dir()), key=_step_of)
    for done in steps[:-max_to_keep]:
        gone = root / f".del_{done.name}"
        done.rename(gone)
        _fault("pruning", step)
        shutil.rmtree(gone, ignore_errors=True)


def load_checkpoint(
    path: str | Path,
    *,
    model: Any,
    optimizer: Any | None = None,
    scheduler: Any | None = None,
    restore_rng: bool = True,
) -> dict[str, Any]:
    """Restore weights (adapter or full), optimizer, scheduler and RNG; return trainer state."""
    path = Path(path)
    if not (path / "trainer_state.json").exists():
        raise FileNotFoundError(f"{path} is not a Ludic checkpoint (no trainer_state.json)")
    state = json.loads((path / "trainer_state.json").read_text())
    from ludic.distributed import is_sharded

    if is_sharded(model):  # FSDP2: every rank loads the full tensors and keeps its shards
        load_full_state(model, path, optimizer)
    else:
        load_model_weights(model, path / "model")
        if optimizer is not None and (path / "optimizer.pt").exists():
            optimizer.load_state_dict(torch.load(path / "optimizer.pt", weights_only=True))
    _load_value_head(model, path)
    if scheduler is not None and (path / "scheduler.pt").exists():
        scheduler.load_state_dict(torch.load(path / "scheduler.pt", weights_only=True))
    if restore_rng and (path / "rng.json").exists():
        _set_rng_state(json.loads((path / "rng.json").read_text()))
    return state


MASTER_WEIGHTS_FILE = "master_weights.safetensors"
"""fp32 master weights of a mixed-precision run, beside ``model/`` (which holds them rounded)."""


def load_master_weights(path: str | Path) -> dict[str, torch.Tensor] | None:
    """The fp32 masters a checkpoint saved, or None (an fp32 or pure low-precision run)."""
    f = Path(path) / MASTER_WEIGHTS_FILE
    if not f.exists():
        return None
    from safetensors.torch import load_file

    return load_file(str(f))


VALUE_HEAD_FILE = "value_head.safetensors"
"""A PPO value head's weights, beside ``model/`` (an adapter folder would not hold them)."""


def _save_value_head(model: Any, folder: Path) -> None:
    from ludic.training.value import value_head

    head = value_head(model)
    if head is not None:
        from safetensors.torch import save_file

        save_file({k: v.detach().contiguous() for k, v in head.state_dict().items()}, str(folder / VALUE_HEAD_FILE))


def _load_value_head(model: Any, folder: Path) -> None:
    from ludic.training.value import value_head

    head, f = value_head(model), folder / VALUE_HEAD_FILE
    if head is None and f.exists():
        raise RuntimeError(f"{folder} holds a value head but the model has none: attach_value_head before resuming")
    if head is not None:
        if not f.exists():
            raise FileNotFoundError(f"{folder}: the model has a value head but the checkpoint has no {VALUE_HEAD_FILE}")
        from safetensors.torch import load_file

        head.load_state_dict(load_file(str(f)))


def read_full_weights(folder: str | Path) -> dict[str, torch.Tensor]:
    """Every tensor of the ``*.safetensors`` files ``save_pretrained`` wrote for a full model."""
    from safetensors.torch import load_file

    files = sorted(Path(folder).glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: no safetensors weights")
    return {k: v for f in files for k, v in load_file(str(f)).items()}


def load_model_weights(model: Any, folder: str | Path) -> None:
    """Load weights saved by ``model.save_pretrained`` into ``model`` in place: the LoRA adapter
    of a peft model (``adapter_model.safetensors``), else the full safetensors weights."""
    from safetensors.torch import load_file

    mdir = Path(folder)
    if is_peft(model):
        from peft import set_peft_model_state_dict

        weights = load_file(str(mdir / "adapter_model.safetensors"))
        result = set_peft_model_state_dict(model, weights)
        unexpected = getattr(result, "unexpected_keys", [])
        if unexpected:
            raise RuntimeError(f"{mdir}: adapter keys not in the model: {unexpected[:5]}")
        return
    missing, unexpected = model.load_state_dict(read_full_weights(mdir), strict=False)
    missing = [k for k in missing if not k.endswith("lm_head.weight")]
    if missing or unexpected:
        raise RuntimeError(f"{mdir}: missing {missing[:5]}, unexpected {unexpected[:5]}")


def _rng_state() -> dict[str, Any]:
    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "torch": torch.get_rng_state().tolist(),
        "python": [version, list(internal), gauss],
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.tolist() for s in torch.cuda.get_rng_state_all()]
    try:
        import numpy as np

        kind, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [kind, keys.tolist(), int(pos), int(has_gauss), float(cached)]
    except ImportError:
        pass
    return state


def _set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(torch.tensor(state["torch"], dtype=torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([torch.tensor(s, dtype=torch.uint8) for s in state["cuda"]])
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    if "numpy" in state:
        import numpy as np

        kind, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, cached))


def load_full_state(model: Any, folder: str | Any, optimizer: Any | None = None) -> None:
    """Load a checkpoint written by ``Trainer.save`` (full tensors: ``model/`` as ``save_pretrained``
    wrote it, ``optimizer.pt`` as ``get_optimizer_state_dict(full_state_dict=True)`` gave it) into a
    sharded model and its optimizer. Collective: every rank reads the files and keeps its own shards.
    The same checkpoint loads into a single process with ``load_checkpoint`` (the formats are equal)."""
    import re

    from safetensors.torch import load_file
    from torch.distributed.checkpoint.state_dict import (StateDictOptions, set_model_state_dict,
                                                         set_optimizer_state_dict)

    folder = Path(folder)
    mdir = folder / "model"
    keys = set(model.state_dict().keys())
    if hasattr(model, "peft_config"):  # the adapter file drops the adapter's name from its keys
        name = getattr(model, "active_adapter", "default")
        raw = load_file(str(mdir / "adapter_model.safetensors"))
        sd = {re.sub(r"\.(lora_[A-Za-z_]+)\.(weight|bias)$", rf".\1.{name}.\2", k): v for k, v in raw.items()}
    else:
        sd = read_full_weights(mdir)
    unknown = sorted(set(sd) - keys)
    if unknown:
        raise RuntimeError(f"{mdir}: weights not in the model: {unknown[:5]}")
    set_model_state_dict(model, sd, options=StateDictOptions(full_state_dict=True, strict=False))
    if optimizer is not None and (folder / "optimizer.pt").exists():
        osd = torch.load(folder / "optimizer.pt", weights_only=True)
        set_optimizer_state_dict(model, optimizer, osd, options=StateDictOptions(full_state_dict=True))
