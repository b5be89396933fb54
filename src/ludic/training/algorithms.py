"""Algorithms as presets: a credit assigner plus a loss config (never a new trainer).

    make_grpo()       group mean/std advantages + token-ratio PPO clip, sequence-mean aggregation
    make_dr_grpo()    group mean advantages (no std) + constant normaliser
    make_dapo()       clip-higher, token-level aggregation, zero-advantage items dropped
    make_gspo()       sequence-level importance ratio
    make_cispo()      clipped stop-gradient IS weight, every token keeps a gradient
    make_rloo()       leave-one-out group baseline + REINFORCE with truncated IS
    make_reinforce()  Monte Carlo return + REINFORCE
    make_reinforce_baseline()  MC return, batch-mean baseline
    make_ppo()        GAE with a value head (learner-side value pass) + clipped policy and value losses + KL
    make_mmd()        per-state magnetic-mirror-descent targets + weighted NLL (small games; no critic)
    make_sft()        constant credit 1 + NLL on action tokens
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from ludic.rollouts.batch import SampleFilter, drop_zero_weight
from ludic.rollouts.credit import (
    GAE,
    ConstantCredit,
    MMDTarget,
    CreditAssigner,
    GroupNormalizedReturn,
    MonteCarloReturn,
)
from ludic.training.losses import LossConfig, loss_preset


@dataclass(frozen=True)
class Algorithm:
    """Credit assignment + loss (+ an optional sample filter)."""

    name: str
    credit: CreditAssigner
    loss: LossConfig
    sample_filter: SampleFilter | None = None

    def describe(self) -> dict[str, Any]:
        return {"name": self.name, "credit": repr(self.credit), "loss": self.loss.__dict__}


def _loss(name: str, overrides: dict[str, Any]) -> LossConfig:
    return loss_preset(name, **overrides) if overrides else loss_preset(name)


def make_grpo(*, mode: str = "mean_std", positive_only: bool = False, **loss: Any) -> Algorithm:
    return Algorithm("grpo", GroupNormalizedReturn(mode, positive_only), _loss("grpo", loss))


def make_dr_grpo(**loss: Any) -> Algorithm:
    return Algorithm("dr_grpo", GroupNormalizedReturn("mean"), _loss("dr_grpo", loss))


def make_dapo(**loss: Any) -> Algorithm:
    return Algorithm("dapo", GroupNormalizedReturn("mean_std"), _loss("dapo", loss), drop_zero_weight)


def make_gspo(**loss: Any) -> Algorithm:
    return Algorithm("gspo", GroupNormalizedReturn("mean_std"), _loss("gspo", loss))


def make_cispo(**loss: Any) -> Algorithm:
    return Algorithm("cispo", GroupNormalizedReturn("mean_std"), _loss("cispo", loss))


def make_rloo(*, is_cap: float | None = 2.0, **loss: Any) -> Algorithm:
    return Algorithm("rloo", GroupNormalizedReturn("loo"), _loss("reinforce", {"is_cap": is_cap, **loss}))


def make_reinforce(gamma: float = 1.0, *, is_cap: float | None = 2.0, **loss: Any) -> Algorithm:
    return Algorithm("reinforce", MonteCarloReturn(gamma), _loss("reinforce", {"is_cap": is_cap, **loss}))


def make_reinforce_baseline(gamma: float = 1.0, *, normalize_std: bool = False, **loss: Any) -> Algorithm:
    cfg = _loss("reinforce_baseline", {"normalize_std": normalize_std, **loss})
    return Algorithm("reinforce_baseline", MonteCarloReturn(gamma), cfg)


def make_ppo(values: Any = None, *, gamma: float = 1.0, lam: float = 0.95, vf_coef: float = 0.1,
             kl_coef: float = 0.2, baseline: str = "value", **loss: Any) -> Algorithm:
    """PPO with a critic: GAE over per-turn rewards (``values``: the learner's value pass,
    ``ValueFunction(model, pad_id)`` on a model with ``attach_value_head``), the token-level
    clipped objective, the clipped value loss and a KL penalty to the reference (adapters off).
    Items must be one per turn (``RolloutBatchSource(merge_turns=False)``). ``baseline="state"``:
    the batch's per-information-state mean return is the baseline where a state recurs (``GAE``)."""
    cfg = LossConfig(kind="ppo", aggregation="token", vf_coef=vf_coef, kl_coef=kl_coef, **loss)
    return Algorithm("ppo", GAE(values, gamma, lam, baseline=baseline), cfg)


def make_mmd(eta: float = 10.0, alpha: float = 0.05, *, gamma: float = 1.0, **loss: Any) -> Algorithm:
    """Magnetic mirror descent on information states (``MMDTarget``): each visited state's turns are
    weighted by the target q(a|s), and the loss is their weighted NLL (the cross-entropy to q, one
    balanced term per state). Needs no critic; zero-weight turns are dropped. Items must be one per
    turn (``merge_turns=False``); each counts with its weight q alone, not scaled by its share of
    its episode (``episode_weighted=False``)."""
    cfg = _loss("sft", {"aggregation": "sum", "episode_weighted": False, **loss})
    return Algorithm("mmd", MMDTarget(eta, alpha, gamma), cfg, drop_zero_weight)


def make_sft(**loss: Any) -> Algorithm:
    return Algorithm("sft", ConstantCredit(1.0), _loss("sft", loss))


ALGORITHMS = {
    "grpo": make_grpo, "dr_grpo": make_dr_grpo, "dapo": make_dapo, "gspo": make_gspo,
    "cispo": make_cispo, "rloo": make_rloo, "reinforce": make_reinforce,
    "reinforce_baseline": make_reinforce_baseline, "sft": make_sft, "ppo": make_ppo, "mmd": make_mmd,
}


def make_algorithm(name: str, **loss_overrides: Any) -> Algorithm:
    """Build a preset by name; keyword arguments override LossConfig fields."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; choose from {sorted(ALGORITHMS)}")
    algo = ALGORITHMS[name]()
    return replace(algo, loss=replace(algo.loss, **loss_overrides)) if loss_overrides else algo


def algorithm_for(cfg: Any) -> Algorithm:
    """``make_algorithm(cfg.algorithm)`` with the loss settings a run config may carry:
    ``kl_coef``, ``entropy_coef`` (a bonus that keeps a policy from collapsing onto one answer), and
    ``behavior_is`` with ``behavior_is_cap`` (off-policy correction)."""
    over: dict[str, Any] = {}
    if getattr(cfg, "kl_coef", 0.0):
        over["kl_coef"] = cfg.kl_coef
    if getattr(cfg, "entropy_coef", 0.0):
        over["entropy_coef"] = cfg.entropy_coef
    if getattr(cfg, "behavior_is", ""):
        over.update(behavior_is=cfg.behavior_is, behavior_is_cap=cfg.behavior_is_cap)
    return make_algorithm(cfg.algorithm, **over)
