"""The reference policy of a KL penalty: the model with its LoRA adapter switched off, or a frozen copy of the
starting weights when there is no adapter to switch off (full fine-tuning); and the log-probs it gives the
action tokens of a micro-batch."""

from __future__ import annotations

from typing import Any

import torch

from ludic.training.scoring import adapters_disabled, score_actions


def needs_ref_copy(model: Any, algorithm: Any) -> bool:
    """True when ``algorithm``'s loss needs reference log-probs and ``model`` has no adapter to switch off."""
    loss = getattr(algorithm, "loss", None)
    return bool(loss is not None and loss.needs_ref_logp and not hasattr(model, "disable_adapter"))


def frozen_copy(model: Any) -> Any:
    """A frozen, eval-mode copy of ``model``: the reference policy of a full fine-tuning run, the fixed
    opponent of ``ludic train env`` on a multi-player env."""
    import copy

    ref = copy.deepcopy(model)
    ref.eval()
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


def reference_logp(model: Any, ref_model: Any, mb: Any) -> torch.Tensor:
    """Reference log-probs of ``mb``'s action tokens: from ``ref_model`` (a frozen copy), else from
    ``model`` with its adapters disabled."""
    with torch.no_grad():
        if ref_model is not None:
            return score_actions(ref_model, mb)[0]
        with adapters_disabled(model):
            return score_actions(model, mb)[0]
