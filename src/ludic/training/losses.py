r"""Policy-gradient losses over flattened action tokens.

A micro-batch holds N action tokens in S segments (one segment = one trained
completion). For token t of segment i = seg[t]:

    A_t = adv[i]                                  advantage of the segment
    r_t = exp(logp_t - old_logp_t)                token importance ratio
    sg(x)                                         stop-gradient (x.detach())
    clip(x) = min(max(x, 1 - clip_low), 1 + clip_high)

Per-token objective o_t for each ``LossConfig.kind``:

    sft                 o_t = -A_t * logp_t
    reinforce           o_t = -w_t * A_t * logp_t,
                        w_t = sg(min(r_t, is_cap)) if is_cap and old_logp given, else 1
    reinforce_baseline  as reinforce with A_t -> (A_t - adv_mean) [/ (adv_std + 1e-8)]
    ppo                 o_t = -min(r_t * A_t, clip(r_t) * A_t)          (GRPO / DAPO / Dr.GRPO)
    gspo                o_t = -min(s_t * A_t, clip(s_t) * A_t),
                        s_t = sg(s_i) * exp(logp_t - sg(logp_t)),
                        s_i = exp(mean_{u in i} (logp_u - old_logp_u))  (GSPO-token form)
    cispo               o_t = -sg(clip(r_t)) * A_t * logp_t              (MiniMax-M1)

The GSPO-token form has the value of the sequence ratio s_i on every token and
d s_t / d logp_t = s_i, so with "sequence" aggregation its gradient equals
GSPO's  d/d logp_t [ -min(s_i A_i, clip(s_i) A_i) ] = -A_i s_i / |y_i|  (when
unclipped). CISPO keeps a gradient on every token: only the weight is clipped.

A segment may carry per-token advantages (``token_adv``: a merged multi-turn
episode, where each turn's tokens carry that turn's credit); then A_t =
token_adv[t]. Each segment has a weight c_i (``seg_weight``, default 1): its
share of its episode, so that an episode split into n per-turn segments
(c_i = 1/n) counts once, like a merged or single-turn episode. Weights that
are already balanced per turn (MMD's per-state targets) set
``LossConfig.episode_weighted=False``, and c_i is not applied.

Aggregation of a per-token quantity x_t (all normalisers are for the WHOLE
optimizer batch: T = total_tokens, G = total_segments = sum_i c_i (episodes),
L = max_tokens):

    token     sum_t x_t / T                              (DAPO, "bnpo")
    sequence  sum_i c_i (mean_{t in i} x_t) / G          (original GRPO)
    constant  sum_i c_i (sum_{t in i} x_t) / (G * L)     (Dr.GRPO)
    sum       sum_i c_i (sum_{t in i} x_t) / G           (REINFORCE on sequence log-prob)

Total loss:

    loss = agg(o) + kl_coef * agg(kl) - entropy_coef * agg(entropy)
    kl_t = logp_t - ref_logp_t                           (k1)
    kl_t = exp(ref_logp_t - logp_t) - (ref_logp_t - logp_t) - 1   (k3, >= 0)

Because the normalisers are global, every aggregation is a sum over segments,
so the losses (and gradients) of the micro-batches of one optimizer batch SUM
to the full-batch loss -- call ``backward()`` on each and do not rescale. A
segment must not be split across micro-batches ("sequence" and "gspo" need all
its tokens).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Sequence

import torch
from torch import Tensor

LOSS_KINDS = ("reinforce", "reinforce_baseline", "ppo", "gspo", "cispo", "sft")
AGGREGATIONS = ("token", "sequence", "constant", "sum")
KL_ESTIMATORS = ("k1", "k3")
BEHAVIOR_IS_MODES = ("token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
_NEEDS_OLD_LOGP = ("ppo", "gspo", "cispo")
_STD_EPS = 1e-8


@dataclass
class LossInputs:
    """Flattened action tokens of one micro-batch: N tokens in S segments (one segment = one trained completion)."""

    logp: Tensor
    """[N] float, current policy log-prob of each action token (carries grad)."""
    adv: Tensor
    """[S] float, advantage / weight of each segment."""
    seg: Tensor
    """[N] long, segment index in [0, S) of each token."""
    total_tokens: float
    """Action tokens in the WHOLE optimizer batch (all micro-batches)."""
    total_segments: float
    """Sum of segment weights in the whole optimizer batch (segments, or episodes with ``seg_weight``)."""
    old_logp: Tensor | None = None
    """[N] sampler (behaviour policy) log-probs; None for offline data."""
    ref_logp: Tensor | None = None
    """[N] reference-policy log-probs, for the KL penalty."""
    entropy: Tensor | None = None
    """[N] entropy of the current policy at each action token (carries grad)."""
    max_tokens: float | None = None
    """Dr.GRPO constant normaliser L (max completion tokens)."""
    adv_mean: float = 0.0
    """Mean of adv over the whole batch (REINFORCE baseline)."""
    adv_std: float = 1.0
    """Std of adv over the whole batch."""
    token_adv: Tensor | None = None
    """[N] per-token advantages; when given they replace ``adv[seg]`` (merged multi-turn episodes)."""
    seg_weight: Tensor | None = None
    """[S] weight c_i of each segment in the per-segment aggregations (None: all 1)."""
    prox_logp: Tensor | None = None
    """[N] the learner's log-probs at the start of this batch (no grad), for the off-policy
    correction (``behavior_is``); None: ``logp.detach()`` (exact on the first pass over a batch)."""
    same_version: Tensor | None = None
    """[N] bool: tokens sampled by the weights the learner has now (the sampler-learner mismatch
    is measured on these only: elsewhere staleness would mix in)."""
    values: Tensor | None = None
    """[S] the value head's V(s) of each segment's state (carries grad), for ``vf_coef``."""
    value_old: Tensor | None = None
    """[S] V(s) when the batch was collected (the value clip's centre)."""
    value_target: Tensor | None = None
    """[S] the return the value head regresses to (GAE: advantage + old value)."""

    def __post_init__(self) -> None:
        if self.logp.dim() != 1:
            raise ValueError(f"LossInputs.logp must be 1-D [N], got shape {tuple(self.logp.shape)}")
        if self.adv.dim() != 1:
            raise ValueError(f"LossInputs.adv must be 1-D [S], got shape {tuple(self.adv.shape)}")
        if self.seg.shape != self.logp.shape:
            raise ValueError(
                f"LossInputs.seg shape {tuple(self.seg.shape)} != logp shape {tuple(self.logp.shape)}"
            )
        if self.seg.dtype not in (torch.int64, torch.int32):
            raise ValueError(f"LossInputs.seg must be an integer (long) tensor, got {self.seg.dtype}")
        if self.seg_weight is not None and self.seg_weight.shape != self.adv.shape:
            raise ValueError(
                f"LossInputs.seg_weight shape {tuple(self.seg_weight.shape)} != adv shape {tuple(self.adv.shape)}"
            )
        for name in ("values", "value_old", "value_target"):
            t = getattr(self, name)
            if t is not None and t.shape != self.adv.shape:
                raise ValueError(f"LossInputs.{name} shape {tuple(t.shape)} != adv shape {tuple(self.adv.shape)}")
        for name in ("old_logp", "ref_logp", "entropy", "token_adv", "prox_logp", "same_version"):
            t = getattr(self, name)
            if t is not None and t.shape != self.logp.shape:
                raise ValueError(
                    f"LossInputs.{name} shape {tuple(t.shape)} != logp shape {tuple(self.logp.shape)}"
                )
        if not self.total_tokens > 0:
            raise ValueError(f"LossInputs.total_tokens must be > 0, got {self.total_tokens}")
        if not self.total_segments > 0:
            raise ValueError(f"LossInputs.total_segments must be > 0, got {self.total_segments}")
        if self.max_tokens is not None and not self.max_tokens > 0:
            raise ValueError(f"LossInputs.max_tokens must be > 0 or None, got {self.max_tokens}")

    @property
    def num_segments(self) -> int:
        """S, the number of segments in this micro-batch."""
        return self.adv.numel()


@dataclass(frozen=True)
class LossConfig:
    """Which policy-gradient objective to use, and how to normalise it."""

    kind: str = "ppo"
    """"reinforce" | "reinforce_baseline" | "ppo" | "gspo" | "cispo" | "sft"."""
    aggregation: str = "token"
    """"token" (DAPO) | "sequence" (GRPO) | "constant" (Dr.GRPO) | "sum" (REINFORCE)."""
    clip_low: float = 0.2
    """Epsilon low: ratio clipped to [1 - clip_low, 1 + clip_high] (>= 1 means no lower bound)."""
    clip_high: float = 0.2
    """Epsilon high (clip-higher: DAPO uses 0.28)."""
    is_cap: float | None = None
    """REINFORCE: truncated IS weight sg(min(ratio, is_cap)) when old_logp is given; None = no IS."""
    normalize_std: bool = False
    """reinforce_baseline: divide (adv - adv_mean) by (adv_std + 1e-8)."""
    kl_coef: float = 0.0
    """Weight of the KL penalty to the reference policy (needs ref_logp when > 0)."""
    kl_estimator: str = "k3"
    """"k1": logp - ref_logp ; "k3": exp(ref - logp) - (ref - logp) - 1."""
    entropy_coef: float = 0.0
    """Entropy bonus: loss -= entropy_coef * aggregate(entropy) (needs entropy when != 0)."""
    behavior_is: str | None = None
    """Off-policy correction between the learner (pi_prox: its log-probs at the start of the batch)
    and the sampler (old_logp: vLLM, a stale actor), w = pi_prox / pi_sampler:
    "token_truncate" / "sequence_truncate" weigh each token's objective by sg(min(w, behavior_is_cap))
    (token ratio, or the product over the sequence); "token_mask" / "sequence_mask" keep w but drop
    tokens / sequences whose w is outside [behavior_is_low, behavior_is_cap]. The objective's own
    ratio is then pi / pi_prox (decoupled PPO). None: old_logp is both the behaviour and the
    proximal policy."""
    behavior_is_cap: float = 2.0
    """Upper bound of w (truncation cap, or top of the kept band)."""
    behavior_is_low: float = 0.0
    """Lower bound of the kept band (mask modes)."""
    vf_coef: float = 0.0
    """PPO value loss weight: loss += vf_coef * 0.5 * mean over segments of the clipped squared
    error of the value head (needs a value head on the model and value targets in the items)."""
    value_clip: float | None = 0.2
    """Value clip: V is also scored as value_old + clamp(V - value_old, -c, c), and the larger
    error counts (PPO's clipped value loss); None: plain squared error."""
    episode_weighted: bool = True
    """Weigh each segment by its share of its episode (``seg_weight``, c_i = 1/n for the n per-turn
    items of an episode), so an episode counts once however it is split. False: every segment counts
    fully, for per-turn weights that are already balanced (MMD's per-state targets q(a|s)); the
    normaliser G stays the number of episodes."""

    def __post_init__(self) -> None:
        if self.kind not in LOSS_KINDS:
            raise ValueError(f"LossConfig.kind={self.kind!r} is not one of {LOSS_KINDS}")
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(
                f"LossConfig.aggregation={self.aggregation!r} is not one of {AGGREGATIONS}"
            )
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(
                f"LossConfig.kl_estimator={self.kl_estimator!r} is not one of {KL_ESTIMATORS}"
            )
        for name in ("clip_low", "clip_high", "kl_coef", "vf_coef"):
            v = getattr(self, name)
            if not (math.isfinite(v) and v >= 0):
                raise ValueError(f"LossConfig.{name}={v!r} must be a finite number >= 0")
        if not math.isfinite(self.entropy_coef):
            raise ValueError(f"LossConfig.entropy_coef={self.entropy_coef!r} must be finite")
        if self.is_cap is not None and not self.is_cap > 0:
            raise ValueError(f"LossConfig.is_cap={self.is_cap!r} must be > 0 or None")
        if self.behavior_is is not None and self.behavior_is not in BEHAVIOR_IS_MODES:
            raise ValueError(f"LossConfig.behavior_is={self.behavior_is!r} is not one of {BEHAVIOR_IS_MODES} or None")
        if not (0 <= self.behavior_is_low < self.behavior_is_cap and math.isfinite(self.behavior_is_cap)):
            raise ValueError(f"LossConfig: need 0 <= behavior_is_low ({self.behavior_is_low}) < "
                             f"behavior_is_cap ({self.behavior_is_cap}) < inf")

    @property
    def needs_old_logp(self) -> bool:
        """True when the objective uses sampler log-probs (ppo, gspo, cispo)."""
        return self.kind in _NEEDS_OLD_LOGP

    @property
    def uses_importance_ratio(self) -> bool:
        """True when the objective divides by sampler probabilities (ppo, gspo, cispo, capped IS)."""
        return self.needs_old_logp or (self.kind.startswith("reinforce") and self.is_cap is not None)

    @property
    def needs_ref_logp(self) -> bool:
        """True when a KL penalty is active (a reference model must be run)."""
        return self.kl_coef > 0

    @property
    def needs_values(self) -> bool:
        """True when the value loss is active (the value head must be run)."""
        return self.vf_coef > 0

    @property
    def needs_entropy(self) -> bool:
        """True when the entropy bonus is active (per-token entropy must be computed)."""
        return self.entropy_coef != 0


LOSS_PRESETS: dict[str, LossConfig] = {
    "grpo": LossConfig(kind="ppo", aggregation="sequence"),
    "dr_grpo": LossConfig(kind="ppo", aggregation="constant"),
    "dapo": LossConfig(kind="ppo", aggregation="token", clip_high=0.28),
    "gspo": LossConfig(kind="gspo", aggregation="sequence", clip_low=3e-4, clip_high=4e-4),
    "cispo": LossConfig(kind="cispo", aggregation="token", clip_low=1e6, clip_high=0.2),
    "reinforce": LossConfig(kind="reinforce", aggregation="sum"),
    "reinforce_baseline": LossConfig(kind="reinforce_baseline", aggregation="sum"),
    "sft": LossConfig(kind="sft", aggregation="token"),
}
"""Named configs; names follow TRL's ``loss_type`` where one exists."""


def loss_preset(name: str, **overrides: object) -> LossConfig:
    """The preset ``name`` from LOSS_PRESETS with some fields replaced (e.g. kl_coef=0.04)."""
    if name not in LOSS_PRESETS:
        raise ValueError(f"unknown loss preset {name!r}; known: {sorted(LOSS_PRESETS)}")
    return replace(LOSS_PRESETS[name], **overrides)


def segment_mean(values: Tensor, seg: Tensor, num_segments: int) -> Tensor:
    """Mean of ``values`` [N] within each segment -> [S]; empty segments give 0. Differentiable."""
    sums = values.new_zeros(num_segments).index_add(0, seg, values)
    counts = values.new_zeros(num_segments).index_add_(0, seg, torch.ones_like(values.detach()))
    return sums / counts.clamp(min=1)


def aggregate(per_token: Tensor, inp: LossInputs, mode: str, episode_weighted: bool = True) -> Tensor:
    """Reduce a per-token quantity [N] to this micro-batch's scalar share of the batch value.

    See the module docstring for the four modes; all divide by whole-batch
    counts taken from ``inp``, so the shares of all micro-batches sum to the
    full-batch aggregate. ``episode_weighted=False`` drops the c_i factor
    (``LossConfig.episode_weighted``).
    """
    if mode == "token":
        return per_token.sum() / inp.total_tokens
    c = inp.seg_weight if episode_weighted else None
    if mode == "sequence":
        per_seg = segment_mean(per_token, inp.seg, inp.num_segments)
        return (per_seg if c is None else per_seg * c.to(per_seg.dtype)).sum() / inp.total_segments
    if mode in ("constant", "sum"):
        if mode == "constant" and inp.max_tokens is None:
            raise ValueError('aggregation "constant" (Dr.GRPO) needs LossInputs.max_tokens')
        total = per_token if c is None else per_token * c.to(per_token.dtype)[inp.seg]
        norm = inp.total_segments * (inp.max_tokens if mode == "constant" else 1.0)  # type: ignore[operator]
        return total.sum() / norm
    raise ValueError(f"aggregation={mode!r} is not one of {AGGREGATIONS}")


def kl_estimate(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate [N] of KL(pi || pi_ref) from sampled-token log-probs (grad flows via logp)."""
    if estimator == "k1":
        return logp - ref_logp
    if estimator == "k3":
        d = ref_logp - logp
        return torch.exp(d) - d - 1
    raise ValueError(f"kl_estimator={estimator!r} is not one of {KL_ESTIMATORS}")


def _mean(x: Tensor) -> Tensor:
    """Detached mean (bool counts as 0/1) that is 0, not NaN, for an empty tensor."""
    x = x.detach()
    if not x.is_floating_point():
        x = x.float()
    return x.mean() if x.numel() else x.new_zeros(())


def _max(x: Tensor) -> Tensor:
    """Detached max that is 0 for an empty tensor."""
    x = x.detach()
    return x.max() if x.numel() else x.new_zeros(())


def behavior_weights(log_w: Tensor, seg: Tensor, num_segments: int, cfg: LossConfig) -> tuple[Tensor, Tensor]:
    """([N] IS weights, [N] bool: clipped (truncate) or dropped (mask)) for ``cfg.behavior_is``,
    from log w = log pi_prox - log pi_sampler of each token (no grad)."""
    log_w = log_w.detach()
    if cfg.behavior_is.startswith("sequence"):
        seq = torch.zeros(num_segments, dtype=log_w.dtype, device=log_w.device).index_add_(0, seg, log_w)
        log_w = seq[seg]  # the product of the sequence's token ratios, on each of its tokens
    w = torch.exp(log_w.clamp(max=80.0))
    if cfg.behavior_is.endswith("truncate"):
        return w.clamp(max=cfg.behavior_is_cap), w > cfg.behavior_is_cap
    out = (w < cfg.behavior_is_low) | (w > cfg.behavior_is_cap)
    return torch.where(out, torch.zeros_like(w), w), out


def _check_inputs(inp: LossInputs, cfg: LossConfig) -> None:
    """Raise ValueError when ``inp`` lacks something ``cfg`` needs."""
    if cfg.needs_old_logp and inp.old_logp is None:
        raise ValueError(f'loss kind "{cfg.kind}" needs LossInputs.old_logp (sampler log-probs)')
    if cfg.aggregation == "constant" and inp.max_tokens is None:
        raise ValueError('aggregation "constant" (Dr.GRPO) needs LossInputs.max_tokens')
    if cfg.needs_ref_logp and inp.ref_logp is None:
        raise ValueError(f"kl_coef={cfg.kl_coef} needs LossInputs.ref_logp")
    if cfg.needs_entropy and inp.entropy is None:
        raise ValueError(f"entropy_coef={cfg.entropy_coef} needs LossInputs.entropy")
    if cfg.behavior_is is not None and inp.old_logp is None:
        raise ValueError(f"behavior_is={cfg.behavior_is!r} needs LossInputs.old_logp (sampler log-probs)")
    if cfg.needs_values and (inp.values is None or inp.value_target is None
                             or (cfg.value_clip is not None and inp.value_old is None)):
        raise ValueError(f"vf_coef={cfg.vf_coef} needs LossInputs.values and value_target (and value_old to clip): "
                         "a value head on the model and a credit assigner that gives targets (GAE)")


def compute_loss(inp: LossInputs, cfg: LossConfig) -> tuple[Tensor, dict[str, Tensor]]:
    """Loss of one micro-batch (0-d, carries grad) and detached 0-d diagnostics.

    The loss is this micro-batch's share: summing it over the micro-batches of
    an optimizer batch gives the full-batch loss. In the diagnostics, "loss",
    "policy_loss", "kl_loss" and "entropy_loss" are such shares; the others are
    plain means over this micro-batch's tokens ("adv_mean": over its segments):
    "logp_mean", "num_tokens", and when applicable "ratio_mean", "ratio_max"
    (the ratio the objective uses: s_i for gspo), "clip_frac" (fraction of
    tokens whose ratio / IS weight was clipped in the objective), "kl",
    "entropy".
    """
    _check_inputs(inp, cfg)
    dtype = torch.promote_types(inp.logp.dtype, torch.float32)
    logp = inp.logp.to(dtype)
    seg = inp.seg
    A = inp.token_adv.to(dtype) if inp.token_adv is not None else inp.adv.to(dtype)[seg]  # [N]
    lo, hi = 1.0 - cfg.clip_low, 1.0 + cfg.clip_high

    log_ratio = ratio = None
    w_is: Tensor | None = None  # [N] behaviour IS weight (no grad), when behavior_is is on
    stats_is: dict[str, Tensor] = {}
    if inp.old_logp is not None:
        old_logp = inp.old_logp.to(dtype)
        prox = (inp.prox_logp.to(dtype) if inp.prox_logp is not None else logp.detach())
        log_w = prox - old_logp  # log pi_learner / pi_sampler of each sampled token
        same = inp.same_version if inp.same_version is not None else torch.ones_like(log_w, dtype=torch.bool)
        # KL(sampler || learner) from the sampler's tokens (k3), where both had the same weights
        lw = log_w.detach().double()  # float64: k3 ~ x^2/2 vanishes in float32 for |x| < ~1e-4
        stats_is["sampler_kl"] = _mean((torch.expm1(lw) - lw)[same]).to(dtype)
        stats_is["sampler_tokens"] = same.float().sum()
        if cfg.behavior_is is not None:
            w_is, dropped = behavior_weights(log_w, seg, inp.num_segments, cfg)
            stats_is["is_weight_mean"] = _mean(w_is)
            stats_is["is_drop_frac" if cfg.behavior_is.endswith("mask") else "is_clip_frac"] = _mean(dropped)
            old_logp = prox  # the clipped objective's ratio is pi / pi_prox
        log_ratio = logp - old_logp  # [N], grad via logp
        ratio = torch.exp(log_ratio)
    ratio_stat = ratio  # the ratio reported in the diagnostics
    clipped: Tensor | None = None  # [N] bool, tokens clipped in the objective

    kind = cfg.kind
    if kind == "sft":
        obj = -A * logp
    elif kind in ("reinforce", "reinforce_baseline"):
        if kind == "reinforce_baseline":
            A = A - inp.adv_mean
            if cfg.normalize_std:
                A = A / (inp.adv_std + _STD_EPS)
        if cfg.is_cap is not None and ratio is not None:
            r = ratio.detach()
            clipped = r > cfg.is_cap
            obj = -r.clamp(max=cfg.is_cap) * A * logp
        else:
            obj = -A * logp
    elif kind == "ppo":
        assert ratio is not None
        obj = -torch.minimum(ratio * A, ratio.clamp(lo, hi) * A)
        clipped = ((A > 0) & (ratio > hi)) | ((A < 0) & (ratio < lo))
    elif kind == "gspo":
        assert log_ratio is not None
        seq_log_ratio = segment_mean(log_ratio.detach(), seg, inp.num_segments)  # [S]
        s = torch.exp(seq_log_ratio[seg] + logp - logp.detach())  # [N], value s_i, ds/dlogp = s_i
        obj = -torch.minimum(s * A, s.clamp(lo, hi) * A)
        clipped = ((A > 0) & (s > hi)) | ((A < 0) & (s < lo))
        ratio_stat = s
    elif kind == "cispo":
        assert ratio is not None
        r = ratio.detach()
        clipped = (r < lo) | (r > hi)
        obj = -r.clamp(lo, hi) * A * logp
    else:  # pragma: no cover - LossConfig validates kind
        raise ValueError(f"LossConfig.kind={kind!r} is not one of {LOSS_KINDS}")

    if w_is is not None:
        obj = w_is * obj
    policy_loss = aggregate(obj, inp, cfg.aggregation, cfg.episode_weighted)
    loss = policy_loss
    stats: dict[str, Tensor] = {
        "policy_loss": policy_loss.detach(),
        "logp_mean": _mean(logp),
        "adv_mean": _mean(inp.adv),
        "num_tokens": torch.tensor(float(logp.numel()), device=logp.device),
    }
    stats.update(stats_is)
    if ratio_stat is not None:
        stats["ratio_mean"] = _mean(ratio_stat)
        stats["ratio_max"] = _max(ratio_stat)
    if clipped is not None:
        stats["clip_frac"] = _mean(clipped)

    if inp.ref_logp is not None:
        kl = kl_estimate(logp, inp.ref_logp.to(dtype), cfg.kl_estimator)
        stats["kl"] = _mean(kl)
        if cfg.kl_coef > 0:
            kl_loss = cfg.kl_coef * aggregate(kl, inp, cfg.aggregation, cfg.episode_weighted)
            loss = loss + kl_loss
            stats["kl_loss"] = kl_loss.detach()
    if inp.entropy is not None:
        ent = inp.entropy.to(dtype)
        stats["entropy"] = _mean(ent)
        if cfg.entropy_coef != 0:
            ent_loss = -cfg.entropy_coef * aggregate(ent, inp, cfg.aggregation, cfg.episode_weighted)
            loss = loss + ent_loss
            stats["entropy_loss"] = ent_loss.detach()

    if cfg.needs_values:
        assert inp.values is not None and inp.value_target is not None
        v, target = inp.values.to(dtype), inp.value_target.to(dtype)
        err = (v - target) ** 2
        if cfg.value_clip is not None:
            assert inp.value_old is not None
            old_v = inp.value_old.to(dtype)
            v_clipped = old_v + (v - old_v).clamp(-cfg.value_clip, cfg.value_clip)
            err_clipped = (v_clipped - target) ** 2
            stats["value_clip_frac"] = _mean(err_clipped > err)
            err = torch.maximum(err, err_clipped)
        weight = inp.seg_weight.to(dtype) if inp.seg_weight is not None else torch.ones_like(err)
        value_loss = cfg.vf_coef * 0.5 * (weight * err).sum() / inp.total_segments
        loss = loss + value_loss
        stats["value_loss"] = value_loss.detach()
        stats["value_mean"] = _mean(v)
        stats["value_error"] = _mean((v - target).abs())

    stats["loss"] = loss.detach()
    return loss, stats


def refuse_truncated_sampling(items: Sequence[Any], loss_name: str) -> None:
    """Raise for an item sampled with top-p / top-k whose sampler log-probs an importance-ratio loss
    (``loss_name``) would divide by: those are log-probs of a truncated, renormalised distribution,
    so the ratio would be wrong. Every learner calls it (``Trainer``, ``TinkerLearner``)."""
    for it in items:
        if it.logprobs is not None and (it.top_p < 1 or it.top_k > 0):
            raise ValueError(
                f"an item was sampled with top_p={it.top_p}, top_k={it.top_k}: its sampler log-probs are "
                f"those of a truncated, renormalised distribution, so the importance ratio of the "
                f"{loss_name!r} loss would be wrong. Sample with top_p=1 and top_k=0 for RL, or use a "
                "loss without importance ratios (reinforce with is_cap=None). Item meta: "
                f"{ {k: it.meta.get(k) for k in ('rollout_id', 'step_index')} }"
            )
