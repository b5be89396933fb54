"""Training: losses, algorithm presets (credit + loss), the Trainer, checkpoints, LoRA, mixed precision."""

from ludic._lazy import lazy_exports

_EXPORTS = {
    "Trainer": "ludic.training.trainer", "TrainerConfig": "ludic.training.config",
    "Algorithm": "ludic.training.algorithms", "make_algorithm": "ludic.training.algorithms",
    "LossConfig": "ludic.training.losses", "compute_loss": "ludic.training.losses",
    "LoraSettings": "ludic.training.lora", "load_policy": "ludic.training.lora",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
