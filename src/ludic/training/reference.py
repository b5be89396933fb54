"""The reference policy of a KL penalty (and of DPO): the policy the run's optimisation starts from.

``ReferencePolicy`` fixes it at the first optimizer step of a fresh run (``anchor``), so a cold start that
trains the run's own weights before RL (``--tool-demos``, ``--format-demos``) is part of the reference, as
"KL to the starting policy" means. Three forms, by what was trained before that step:

- ``"base"``: a LoRA adapter still at its initialisation (every ``lora_B`` zero) is the base model, so the
  reference is the model with its adapters switched off: no copy. ``--adapter <sft>`` lands here too (the
  SFT adapter is merged into the base and a fresh one trains on top).
- ``"snapshot"``: a trained adapter (or other trainable weights on a frozen base): a copy of the trainable
  weights as they were, swapped in to score the reference and swapped back. Saved with checkpoints
  (``reference.safetensors``), so a resumed run keeps the reference of the run it resumes.
- ``"copy"``: full fine-tuning: a frozen copy of the whole model, made when the trainer is built and
  refreshed at the first step of a fresh run. A resumed run rebuilds it from the weights the model had
  before the checkpoint was loaded (the ``--model`` it starts from).
- ``"given"``: a frozen ``ref_model`` the caller passed (``ludic dpo --reference copy``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import torch

from ludic.training.scoring import adapters_disabled, score_actions

REFERENCE_FILE = "reference.safetensors"
"""The ``"snapshot"`` reference's weights inside a checkpoint folder."""


def needs_reference(algorithm: Any) -> bool:
    """True when ``algorithm``'s loss reads reference log-probs (a KL penalty, DPO)."""
    loss = getattr(algorithm, "loss", None)
    return bool(loss is not None and loss.needs_ref_logp)


def frozen_copy(model: Any, share_frozen: bool = False) -> Any:
    """A frozen, eval-mode copy of ``model``: the reference policy of a full fine-tuning run, the fixed
    opponent of ``ludic train env`` on a multi-player env.

    ``share_frozen``: the parameters that do not train (``requires_grad`` off: a LoRA model's
    base) are shared with ``model``, not copied; only the trainable ones (the adapters) are. The trainer
    never changes the others, so the copy still plays the starting policy, and an engine over it shares
    the policy engine's packed decode weights (``inference.packing``). For SmolLM2-135M with LoRA that
    saves a copy of the model (540 MB in fp32). Anything that loads new base weights into ``model`` in
    place would move the copy too: full fine-tuning shares nothing (every parameter trains)."""
    import copy

    memo = {id(p): p for p in model.parameters() if not p.requires_grad} if share_frozen else {}
    ref = copy.deepcopy(model, memo)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def _trainable(model: Any) -> dict[str, torch.Tensor]:
    return {n: p for n, p in model.named_parameters() if p.requires_grad}


def _adapter_at_init(model: Any) -> bool:
    """Whether ``model``'s trainable weights are a LoRA adapter that is still the identity (every B zero)."""
    params = _trainable(model)
    return bool(params) and all("lora_" in n for n in params) and all(
        float(p.detach().abs().max()) == 0.0 for n, p in params.items() if "lora_B" in n)


class ReferencePolicy:
    """Log-probs of the reference policy for a trainer's ``model`` (module docstring: the four forms).

    Build it with the trainer, call ``anchor(model)`` at the first optimizer step of a fresh run, then
    ``logp(model, mb)`` per micro-batch, before the policy's own forward (a snapshot swaps weights in
    place, which must not happen between a forward and its backward)."""

    def __init__(self, model: Any, algorithm: Any, ref_model: Any | None = None) -> None:
        self.active = ref_model is not None or needs_reference(algorithm)
        self.ref_model = ref_model
        self.snapshot: dict[str, torch.Tensor] | None = None
        if ref_model is not None:
            self.mode = "given"
        elif not self.active:
            self.mode = "none"
        elif hasattr(model, "disable_adapter"):
            self.mode = "base"
        else:
            self.mode = "copy"
            self.ref_model = frozen_copy(model)
        self.anchored = not self.active or self.mode == "given"

    @torch.no_grad()
    def anchor(self, model: Any) -> None:
        """Take the current weights as the reference (once; a no-op after that or when nothing needs it)."""
        if self.anchored:
            return
        self.anchored = True
        if self.mode == "copy":
            self.ref_model.load_state_dict(model.state_dict())
        elif not _adapter_at_init(model):
            self.mode = "snapshot"
            self.snapshot = {n: p.detach().clone() for n, p in _trainable(model).items()}

    @contextlib.contextmanager
    def _swapped_in(self, model: Any):
        """The model with the snapshot's weights in place of its trainable ones (eval mode: no dropout)."""
        assert self.snapshot is not None
        params = _trainable(model)
        current = {n: p.detach().clone() for n, p in params.items()}
        was_training = model.training
        with torch.no_grad():
            for n, p in params.items():
                p.copy_(self.snapshot[n])
        model.eval()
        try:
            yield model
        finally:
            model.train(was_training)
            with torch.no_grad():
                for n, p in params.items():
                    p.copy_(current[n])

    def logp(self, model: Any, mb: Any) -> torch.Tensor:
        """Reference log-probs of ``mb``'s action tokens."""
        with torch.no_grad():
            if self.ref_model is not None:
                return score_actions(self.ref_model, mb)[0]
            if self.mode == "snapshot":
                with self._swapped_in(model):
                    return score_actions(model, mb)[0]
            with adapters_disabled(model):
                return score_actions(model, mb)[0]

    # -- checkpoints (the trainer writes ``full_snapshot()`` as REFERENCE_FILE) ----------
    def state(self) -> dict[str, Any]:
        """What ``trainer_state.json`` records: the form, and whether the reference was fixed yet."""
        return {"mode": self.mode, "anchored": self.anchored}

    def full_snapshot(self) -> dict[str, torch.Tensor] | None:
        """The snapshot as full CPU tensors (gathered from a sharded model's DTensors: every rank calls it)."""
        if self.snapshot is None:
            return None
        return {n: (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().contiguous().cpu()
                for n, t in self.snapshot.items()}

    def load(self, folder: str | Path, state: dict[str, Any] | None, model: Any) -> None:
        """Restore the reference a checkpoint recorded. A checkpoint from before references were saved
        (no ``state``) keeps the old rule: the base model for an adapter, the starting copy otherwise."""
        if not self.active or self.mode == "given":
            return
        self.anchored = True  # a resumed run's reference is the original run's, never its resumed weights
        if state and state.get("mode") == "snapshot":
            from safetensors.torch import load_file

            path = Path(folder) / REFERENCE_FILE
            if not path.exists():
                raise FileNotFoundError(f"{folder}: the checkpoint's KL reference is a snapshot, but {REFERENCE_FILE} is missing")
            params = _trainable(model)
            self.snapshot = {n: _like(t, params[n]) for n, t in load_file(str(path)).items()}
            self.mode = "snapshot"
        elif state and not state.get("anchored", True):
            self.anchored = False  # saved before the first step: fix it at the resumed run's first step


def adapt_kl(algorithm: Any, cfg: Any, metrics: dict[str, Any], n_items: int) -> Any:
    """The adaptive KL controller (``TrainerConfig.kl_target``): ``algorithm`` with its loss's ``kl_coef`` moved
    toward the coefficient that holds the measured KL at the target (``metrics["kl_coef"]`` logs it); unchanged
    without a target, a measured KL or a KL term."""
    import dataclasses

    loss = algorithm.loss
    if cfg.kl_target is None or "kl" not in metrics or loss.kl_coef <= 0:
        return algorithm
    error = max(-0.2, min(0.2, float(metrics["kl"]) / cfg.kl_target - 1.0))
    coef = loss.kl_coef * (1.0 + error * n_items / cfg.kl_horizon)
    metrics["kl_coef"] = coef
    return dataclasses.replace(algorithm, loss=dataclasses.replace(loss, kl_coef=coef))


def _like(full: torch.Tensor, param: torch.Tensor) -> torch.Tensor:
    """``full`` on ``param``'s device and dtype, sharded as ``param`` is when it is a DTensor (FSDP2)."""
    if hasattr(param, "device_mesh"):
        from torch.distributed.tensor import distribute_tensor

        return distribute_tensor(full.to(param.dtype), param.device_mesh, param.placements)
    return full.to(device=param.device, dtype=param.dtype)
