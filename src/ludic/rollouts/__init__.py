"""Rollouts: the engine that plays episodes, credit assignment, and SAW batches for the trainer."""

from ludic._lazy import lazy_exports

_EXPORTS = {
    "RolloutEngine": "ludic.rollouts.engine", "GRPORequestStrategy": "ludic.rollouts.engine",
    "RolloutBatchSource": "ludic.rollouts.batch", "build_saw_items": "ludic.rollouts.batch",
    "GroupNormalizedReturn": "ludic.rollouts.credit", "MonteCarloReturn": "ludic.rollouts.credit",
    "GAE": "ludic.rollouts.credit", "MMDTarget": "ludic.rollouts.credit", "ConstantCredit": "ludic.rollouts.credit",
}
__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS)
__all__ = sorted(_EXPORTS)
