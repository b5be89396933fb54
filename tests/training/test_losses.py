"""Tests for ludic.training.losses.

Every expected number below was worked out by hand from the shared fixture:

    seg     = [0, 0, 1, 2, 2]            3 segments with 2, 1, 2 tokens
    adv     = [1, -2, -0.5]              per-token A = [1, 1, -2, -0.5, -0.5]
    p       = [0.6, 0.2, 0.5, 0.3, 0.4]  logp = log p
    p_old   = [0.4, 0.4, 1.0, 0.2, 0.4]  ratio r = p / p_old = [1.5, 0.5, 0.5, 1.5, 1.0]
    T = total_tokens = 5, G = total_segments = 3, L = max_tokens = 4

    log 0.6 = -0.5108256   log 0.2 = -1.6094379   log 0.5 = -0.6931472
    log 0.3 = -1.2039728   log 0.4 = -0.9162907   sum = -4.9336742

With clip 0.2/0.2 the ratio range is [0.8, 1.2], and the tokens cover the four
PPO cases: (A>0, r>1.2) clipped, (A>0, r<0.8) not, (A<0, r<0.8) clipped,
(A<0, r>1.2) not, plus (A<0, r=1).
"""

from __future__ import annotations

import math

import pytest
import torch

from ludic.training.losses import (
    AGGREGATIONS,
    LOSS_KINDS,
    LOSS_PRESETS,
    LossConfig,
    LossInputs,
    aggregate,
    compute_loss,
    kl_estimate,
    loss_preset,
    segment_mean,
)

P = [0.6, 0.2, 0.5, 0.3, 0.4]
P_OLD = [0.4, 0.4, 1.0, 0.2, 0.4]
SEG = [0, 0, 1, 2, 2]
ADV = [1.0, -2.0, -0.5]
TOL = dict(rel=1e-6, abs=1e-7)
D = torch.float64


def logs(xs):
    return torch.tensor([math.log(x) for x in xs], dtype=D)


def make(adv=ADV, old=True, **kw) -> LossInputs:
    """The fixture with a fresh leaf ``logp`` (requires grad)."""
    base = dict(
        logp=logs(P).requires_grad_(),
        adv=torch.tensor(adv, dtype=D),
        seg=torch.tensor(SEG),
        total_tokens=5.0,
        total_segments=3.0,
        old_logp=logs(P_OLD) if old else None,
        max_tokens=4.0,
    )
    base.update(kw)
    return LossInputs(**base)


def grad_of(inp: LossInputs, cfg: LossConfig) -> list[float]:
    loss, _ = compute_loss(inp, cfg)
    loss.backward()
    return inp.logp.grad.tolist()


# ---------------------------------------------------------------- helpers


def test_segment_mean_values_grad_and_empty_segment():
    v = torch.tensor([1.0, 3.0, 4.0, 2.0, 6.0], dtype=D, requires_grad=True)
    seg = torch.tensor([0, 0, 1, 3, 3])  # segment 2 is empty
    out = segment_mean(v, seg, 4)
    # (1+3)/2 = 2, 4/1 = 4, empty -> 0, (2+6)/2 = 4
    assert out.tolist() == pytest.approx([2.0, 4.0, 0.0, 4.0], **TOL)
    out.sum().backward()
    # d mean_i / d v_t = 1 / |segment|
    assert v.grad.tolist() == pytest.approx([0.5, 0.5, 1.0, 0.5, 0.5], **TOL)


@pytest.mark.parametrize(
    "mode,expected",
    [
        ("token", 3.2),  # (1+3+4+2+6) / T = 16 / 5
        ("sequence", 10 / 3),  # (2 + 4 + 4) / G = 10 / 3
        ("constant", 16 / 12),  # 16 / (G * L) = 16 / 12
        ("sum", 16 / 3),  # 16 / G
    ],
)
def test_aggregate_modes(mode, expected):
    inp = make()
    x = torch.tensor([1.0, 3.0, 4.0, 2.0, 6.0], dtype=D)
    assert aggregate(x, inp, mode).item() == pytest.approx(expected, **TOL)


@pytest.mark.parametrize(
    "mode,expected",
    [
        # seg_weight c = [1, 0.5, 0.5]: segments 1 and 2 are the two turns of one episode, G = 2 episodes
        ("token", 3.2),  # unchanged: a token mean over the batch
        ("sequence", (2 + 0.5 * 4 + 0.5 * 4) / 2),  # sum_i c_i mean_i / G = 3
        ("constant", (4 + 0.5 * 4 + 0.5 * 8) / (2 * 4)),  # sum_i c_i sum_i / (G L) = 10 / 8
        ("sum", (4 + 0.5 * 4 + 0.5 * 8) / 2),  # 10 / 2
    ],
)
def test_aggregate_with_segment_weights_counts_episodes(mode, expected):
    inp = make(seg_weight=torch.tensor([1.0, 0.5, 0.5], dtype=D), total_segments=2.0)
    x = torch.tensor([1.0, 3.0, 4.0, 2.0, 6.0], dtype=D)
    assert aggregate(x, inp, mode).item() == pytest.approx(expected, **TOL)


def test_token_advantages_replace_segment_advantages():
    # reinforce, sum aggregation: loss = -sum_t A_t logp_t / G, with per-token A = [1, 2, -2, -0.5, 0]
    cfg = LossConfig(kind="reinforce", aggregation="sum")
    A = [1.0, 2.0, -2.0, -0.5, 0.0]
    inp = make(token_adv=torch.tensor(A, dtype=D))
    loss, _ = compute_loss(inp, cfg)
    expect = -sum(a * math.log(p) for a, p in zip(A, P)) / 3
    assert loss.item() == pytest.approx(expect, **TOL)
    loss.backward()
    assert inp.logp.grad.tolist() == pytest.approx([-a / 3 for a in A], **TOL)
    with pytest.raises(ValueError, match="token_adv"):
        make(token_adv=torch.zeros(4, dtype=D))


def test_aggregate_constant_needs_max_tokens_and_unknown_mode():
    inp = make(max_tokens=None)
    x = torch.ones(5, dtype=D)
    with pytest.raises(ValueError, match="max_tokens"):
        aggregate(x, inp, "constant")
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(x, inp, "mean")


def test_kl_estimate_k1_k3():
    logp = logs([0.5, 0.25])
    ref = logs([0.25, 0.5])
    # k1 = logp - ref = [log 2, -log 2]
    assert kl_estimate(logp, ref, "k1").tolist() == pytest.approx([0.6931472, -0.6931472], **TOL)
    # k3, d = ref - logp: d = log 0.5 -> 0.5 + 0.6931472 - 1 = 0.1931472
    #                     d = log 2   -> 2 - 0.6931472 - 1   = 0.3068528
    assert kl_estimate(logp, ref, "k3").tolist() == pytest.approx([0.1931472, 0.3068528], **TOL)
    assert kl_estimate(logp, logp, "k3").tolist() == pytest.approx([0.0, 0.0], abs=1e-12)
    with pytest.raises(ValueError, match="kl_estimator"):
        kl_estimate(logp, ref, "k2")


# ---------------------------------------------------------------- ppo


@pytest.mark.parametrize(
    "agg,expected",
    [
        # o = -min(rA, clip(r)A):
        #   t0 A=1,  r=1.5: min(1.5, 1.2)    -> -1.2  (clipped)
        #   t1 A=1,  r=0.5: min(0.5, 0.8)    -> -0.5
        #   t2 A=-2, r=0.5: min(-1.0, -1.6)  ->  1.6  (clipped)
        #   t3 A=-.5,r=1.5: min(-0.75,-0.6)  ->  0.75
        #   t4 A=-.5,r=1.0:                  ->  0.5
        #   sum = 1.15 ; segment means = -0.85, 1.6, 0.625 (sum 1.375)
        ("token", 0.23),  # 1.15 / 5
        ("sequence", 1.375 / 3),  # 0.4583333
        ("constant", 1.15 / 12),  # 0.0958333
        ("sum", 1.15 / 3),  # 0.3833333
    ],
)
def test_ppo_values_all_aggregations(agg, expected):
    loss, st = compute_loss(make(), LossConfig(kind="ppo", aggregation=agg))
    assert loss.item() == pytest.approx(expected, **TOL)
    assert st["loss"].item() == pytest.approx(expected, **TOL)
    assert st["policy_loss"].item() == pytest.approx(expected, **TOL)
    assert st["ratio_mean"].item() == pytest.approx(1.0, **TOL)  # (1.5+.5+.5+1.5+1)/5
    assert st["ratio_max"].item() == pytest.approx(1.5, **TOL)
    assert st["clip_frac"].item() == pytest.approx(0.4, **TOL)  # t0, t2
    assert st["adv_mean"].item() == pytest.approx(-0.5, **TOL)  # (1-2-0.5)/3
    assert st["logp_mean"].item() == pytest.approx(-4.9336742 / 5, **TOL)


def test_ppo_gradient_token():
    # clipped tokens t0, t2 get 0; others -A r / T:
    #   t1: -1*0.5/5 = -0.1 ; t3: 0.5*1.5/5 = 0.15 ; t4: 0.5*1/5 = 0.1
    g = grad_of(make(), LossConfig(kind="ppo", aggregation="token"))
    assert g == pytest.approx([0.0, -0.1, 0.0, 0.15, 0.1], **TOL)


def test_ppo_gradient_sequence():
    # -A r / (|y_i| G): t1: -0.5/6 ; t3: 0.75/6 ; t4: 0.5/6
    g = grad_of(make(), LossConfig(kind="ppo", aggregation="sequence"))
    assert g == pytest.approx([0.0, -0.5 / 6, 0.0, 0.125, 0.5 / 6], **TOL)


def test_ppo_clip_higher_dapo_preset():
    # clip_high 0.28: t0 -> -min(1.5, 1.28) = -1.28 ; sum = 1.15 - 0.08 = 1.07 ; / 5
    loss, st = compute_loss(make(), LOSS_PRESETS["dapo"])
    assert loss.item() == pytest.approx(0.214, **TOL)
    assert st["clip_frac"].item() == pytest.approx(0.4, **TOL)


def test_on_policy_gradients_agree():
    # With old_logp == logp every ratio is 1 and ppo / gspo / cispo / reinforce
    # all have the plain policy gradient -A_t / T = [-0.2, -0.2, 0.4, 0.1, 0.1].
    expected = [-0.2, -0.2, 0.4, 0.1, 0.1]
    for kind in ("ppo", "gspo", "cispo", "reinforce"):
        inp = make(old_logp=logs(P))
        cfg = LossConfig(kind=kind, aggregation="token", is_cap=1.0)
        assert grad_of(inp, cfg) == pytest.approx(expected, **TOL), kind


# ---------------------------------------------------------------- gspo


def test_gspo_values_and_gradient():
    # sequence ratios s_i = exp(mean log r):
    #   s0 = sqrt(1.5*0.5) = 0.8660254, s1 = 0.5, s2 = sqrt(1.5*1.0) = 1.2247449
    #   seg0 A=1:   min(0.866, 0.866)          -> -0.8660254 (inside [0.8, 1.2])
    #   seg1 A=-2:  min(-1.0, -1.6)            ->  1.6       (clipped)
    #   seg2 A=-.5: min(-0.6123724, -0.6)      ->  0.6123724
    #   sequence: (-0.8660254 + 1.6 + 0.6123724) / 3 = 0.4487823
    inp = make()
    loss, st = compute_loss(inp, LossConfig(kind="gspo", aggregation="sequence"))
    assert loss.item() == pytest.approx(0.4487823, **TOL)
    assert st["clip_frac"].item() == pytest.approx(0.2, **TOL)  # the 1 token of seg1
    # ratio stats use s: (2*0.8660254 + 0.5 + 2*1.2247449) / 5
    assert st["ratio_mean"].item() == pytest.approx(0.9363081, **TOL)
    assert st["ratio_max"].item() == pytest.approx(1.2247449, **TOL)
    loss.backward()
    # dL/dlogp_t = -A_i s_i / (|y_i| G): seg0 -0.8660254/6, seg1 0 (clipped),
    # seg2 0.5*1.2247449/6
    assert inp.logp.grad.tolist() == pytest.approx(
        [-0.1443376, -0.1443376, 0.0, 0.1020621, 0.1020621], **TOL
    )


def test_gspo_preset_tiny_clip():
    # clip [0.9997, 1.0004]: seg0 s=0.866, A>0 -> unclipped -0.8660254
    #   seg1 s=0.5, A=-2 -> -min(-1, -1.9994) = 1.9994 ; seg2 -> 0.6123724
    #   (-0.8660254 + 1.9994 + 0.6123724) / 3 = 0.5819157
    loss, _ = compute_loss(make(), LOSS_PRESETS["gspo"])
    assert loss.item() == pytest.approx(0.5819157, **TOL)


def test_gspo_matches_explicit_sequence_formulation():
    torch.manual_seed(0)
    lens = [3, 1, 4, 2, 5]
    S, N = len(lens), sum(lens)
    seg = torch.repeat_interleave(torch.arange(S), torch.tensor(lens))
    base = -torch.rand(N, dtype=D) * 2
    old = base + 0.3 * torch.randn(N, dtype=D)
    adv = torch.tensor([1.0, -1.0, 0.5, -0.7, 2.0], dtype=D)
    cfg = LossConfig(kind="gspo", aggregation="sequence", clip_low=0.1, clip_high=0.15)

    logp = base.clone().requires_grad_()
    inp = LossInputs(logp=logp, adv=adv, seg=seg, total_tokens=N, total_segments=S, old_logp=old)
    loss, _ = compute_loss(inp, cfg)
    loss.backward()

    # GSPO as written in the paper: one ratio per sequence, one term per sequence.
    ref = base.clone().requires_grad_()
    terms = []
    for i in range(S):
        m = seg == i
        s = torch.exp((ref[m] - old[m]).mean())
        terms.append(-torch.minimum(s * adv[i], s.clamp(0.9, 1.15) * adv[i]))
    ref_loss = torch.stack(terms).sum() / S
    ref_loss.backward()

    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-10)
    torch.testing.assert_close(logp.grad, ref.grad, rtol=1e-10, atol=1e-12)
    assert (ref.grad == 0).any() and (ref.grad != 0).any()  # both regimes exercised


# ---------------------------------------------------------------- cispo


def test_cispo_preset_values_and_gradient():
    # w = sg(clip(r, 1-1e6, 1.2)) = [1.2, 0.5, 0.5, 1.2, 1.0] ; o = -w A logp:
    #   t0 -1.2*1*(-0.5108256)  =  0.6129907
    #   t1 -0.5*1*(-1.6094379)  =  0.8047190
    #   t2 -0.5*(-2)*(-0.6931472) = -0.6931472
    #   t3 -1.2*(-0.5)*(-1.2039728) = -0.7223837
    #   t4 -1.0*(-0.5)*(-0.9162907) = -0.4581454
    #   sum = -0.4559666 ; token: / 5 = -0.0911933
    inp = make()
    loss, st = compute_loss(inp, LOSS_PRESETS["cispo"])
    assert loss.item() == pytest.approx(-0.0911933, **TOL)
    assert st["clip_frac"].item() == pytest.approx(0.4, **TOL)  # t0, t3 above 1.2
    loss.backward()
    # every token keeps a gradient -w A / T, clipped ones with weight 1.2:
    #   [-1.2/5, -0.5/5, 1.0/5, 0.6/5, 0.5/5]
    assert inp.logp.grad.tolist() == pytest.approx([-0.24, -0.1, 0.2, 0.12, 0.1], **TOL)


def test_cispo_symmetric_clip():
    # clip_low 0.2: w = [1.2, 0.8, 0.8, 1.2, 1.0]; o:
    #   0.6129907, 0.8*1.6094379 = 1.2875503, 1.6*(-0.6931472) = -1.1090355,
    #   -0.7223837, -0.4581454 ; sum = -0.3890236 ; / 5
    inp = make()
    loss, st = compute_loss(inp, LossConfig(kind="cispo", aggregation="token"))
    assert loss.item() == pytest.approx(-0.3890236 / 5, **TOL)
    assert st["clip_frac"].item() == pytest.approx(0.8, **TOL)  # all but t4
    loss.backward()
    assert inp.logp.grad.tolist() == pytest.approx([-0.24, -0.16, 0.32, 0.12, 0.1], **TOL)


# ---------------------------------------------------------------- reinforce / sft


def test_sft_uniform_weight_is_mean_nll():
    # adv = 1: -(sum logp) / T = 4.9336742 / 5 ; no old_logp needed
    inp = make(adv=[1.0, 1.0, 1.0], old=False)
    loss, st = compute_loss(inp, LOSS_PRESETS["sft"])
    assert loss.item() == pytest.approx(0.9867348, **TOL)
    assert "ratio_mean" not in st and "clip_frac" not in st
    loss.backward()
    assert inp.logp.grad.tolist() == pytest.approx([-0.2] * 5, **TOL)


def test_sft_weighted_sequence():
    # o = -A logp = [0.5108256, 1.6094379, -1.3862944, -0.6019864, -0.4581454]
    # segment means: 2.1202635/2 = 1.0601318, -1.3862944, -1.0601318/2 = -0.5300659
    # sum -0.8562285 / 3 = -0.2854095
    loss, _ = compute_loss(make(old=False), LossConfig(kind="sft", aggregation="sequence"))
    assert loss.item() == pytest.approx(-0.2854095, **TOL)


@pytest.mark.parametrize(
    "agg,expected",
    [
        # o = -A logp, sum = -0.3261627 (see test_sft_weighted_sequence)
        ("sum", -0.3261627 / 3),  # -0.1087209
        ("constant", -0.3261627 / 12),
    ],
)
def test_reinforce_values(agg, expected):
    inp = make(old=False)
    loss, st = compute_loss(inp, LossConfig(kind="reinforce", aggregation=agg))
    assert loss.item() == pytest.approx(expected, **TOL)
    assert "ratio_mean" not in st


def test_reinforce_is_cap_value_and_gradient():
    # w = sg(min(r, 1.0)) = [1, 0.5, 0.5, 1, 1]
    # o = [0.5108256, 0.8047190, -0.6931472, -0.6019864, -0.4581454], sum -0.4377344
    inp = make()
    cfg = LossConfig(kind="reinforce", aggregation="sum", is_cap=1.0)
    loss, st = compute_loss(inp, cfg)
    assert loss.item() == pytest.approx(-0.4377344 / 3, **TOL)
    assert st["clip_frac"].item() == pytest.approx(0.4, **TOL)  # t0, t3 have r > 1
    assert st["ratio_max"].item() == pytest.approx(1.5, **TOL)
    loss.backward()
    # the weight is stop-gradient: d/dlogp = -w A / G = [-1, -.5, 1, .5, .5] / 3
    assert inp.logp.grad.tolist() == pytest.approx([-1 / 3, -1 / 6, 1 / 3, 1 / 6, 1 / 6], **TOL)


def test_reinforce_is_cap_without_old_logp_is_plain_reinforce():
    loss, st = compute_loss(make(old=False), LossConfig(kind="reinforce", aggregation="sum", is_cap=1.0))
    assert loss.item() == pytest.approx(-0.3261627 / 3, **TOL)
    assert "clip_frac" not in st


def test_reinforce_baseline():
    # adv_mean = -0.5: A - b = [1.5, -1.5, 0] -> per token [1.5, 1.5, -1.5, 0, 0]
    # o = [1.5*0.5108256, 1.5*1.6094379, -1.5*0.6931472, 0, 0]
    #   = [0.7662384, 2.4141569, -1.0397208, 0, 0], sum 2.1406745 ; / 3 = 0.7135582
    cfg = LossConfig(kind="reinforce_baseline", aggregation="sum")
    loss, st = compute_loss(make(old=False, adv_mean=-0.5, adv_std=2.0), cfg)
    assert loss.item() == pytest.approx(0.7135582, **TOL)
    assert st["adv_mean"].item() == pytest.approx(-0.5, **TOL)  # raw advantages
    # normalize_std: divide by adv_std + 1e-8 = 2 -> 0.3567791
    cfg = LossConfig(kind="reinforce_baseline", aggregation="sum", normalize_std=True)
    loss, _ = compute_loss(make(old=False, adv_mean=-0.5, adv_std=2.0), cfg)
    assert loss.item() == pytest.approx(0.3567791, **TOL)


# ---------------------------------------------------------------- kl / entropy


def test_kl_k3_penalty_value_and_gradient():
    # ref = logp + d, d = [log .5, log 2, 0, log .5, log 2]
    # k3 = [0.1931472, 0.3068528, 0, 0.1931472, 0.3068528], sum 1.0, mean 0.2
    # loss = 0.23 (ppo, token) + 0.1 * 1.0 / 5 = 0.25
    ref = logs(P) + logs([0.5, 2.0, 1.0, 0.5, 2.0])
    inp = make(ref_logp=ref)
    loss, st = compute_loss(inp, LossConfig(kind="ppo", kl_coef=0.1, kl_estimator="k3"))
    assert loss.item() == pytest.approx(0.25, **TOL)
    assert st["kl"].item() == pytest.approx(0.2, **TOL)
    assert st["kl_loss"].item() == pytest.approx(0.02, **TOL)
    assert st["policy_loss"].item() == pytest.approx(0.23, **TOL)
    loss.backward()
    # d k3 / d logp = 1 - exp(d); times 0.1/5: [0.01, -0.02, 0, 0.01, -0.02]
    # plus ppo grad [0, -0.1, 0, 0.15, 0.1]
    assert inp.logp.grad.tolist() == pytest.approx([0.01, -0.12, 0.0, 0.16, 0.08], **TOL)


def test_kl_k3_sequence_aggregation():
    # k3 segment means: (0.1931472+0.3068528)/2 = 0.25, 0, 0.25 -> 0.5/3
    # loss = 1.375/3 + 0.1 * 0.5/3 = 0.475
    ref = logs(P) + logs([0.5, 2.0, 1.0, 0.5, 2.0])
    cfg = LossConfig(kind="ppo", aggregation="sequence", kl_coef=0.1)
    loss, _ = compute_loss(make(ref_logp=ref), cfg)
    assert loss.item() == pytest.approx(0.475, **TOL)


def test_kl_k1_penalty():
    # d = [log .5, log .5, 0, log 2, 0] -> k1 = -d = [log2, log2, 0, -log2, 0]
    # sum = log 2 = 0.6931472, mean 0.1386294 ; loss = 0.23 + 0.1*0.6931472/5 = 0.2438629
    ref = logs(P) + logs([0.5, 0.5, 1.0, 2.0, 1.0])
    inp = make(ref_logp=ref)
    loss, st = compute_loss(inp, LossConfig(kind="ppo", kl_coef=0.1, kl_estimator="k1"))
    assert loss.item() == pytest.approx(0.2438629, **TOL)
    assert st["kl"].item() == pytest.approx(0.1386294, **TOL)
    loss.backward()
    # k1 adds 0.1/5 = 0.02 to every token's gradient
    assert inp.logp.grad.tolist() == pytest.approx([0.02, -0.08, 0.02, 0.17, 0.12], **TOL)


def test_kl_reported_but_not_applied_when_coef_zero():
    ref = logs(P) + logs([0.5, 2.0, 1.0, 0.5, 2.0])
    loss, st = compute_loss(make(ref_logp=ref), LossConfig(kind="ppo"))
    assert loss.item() == pytest.approx(0.23, **TOL)
    assert st["kl"].item() == pytest.approx(0.2, **TOL)
    assert "kl_loss" not in st


@pytest.mark.parametrize(
    "agg,expected",
    [
        # entropy = [1, .5, 2, 0, 1.5]: token mean 5/5 = 1 -> 0.23 - 0.01*1
        ("token", 0.22),
        # segment means .75, 2, .75 -> 3.5/3 ; 1.375/3 - 0.01*3.5/3 = 1.34/3
        ("sequence", 1.34 / 3),
    ],
)
def test_entropy_bonus(agg, expected):
    ent = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.5], dtype=D, requires_grad=True)
    inp = make(entropy=ent)
    loss, st = compute_loss(inp, LossConfig(kind="ppo", aggregation=agg, entropy_coef=0.01))
    assert loss.item() == pytest.approx(expected, **TOL)
    assert st["entropy"].item() == pytest.approx(1.0, **TOL)
    loss.backward()
    if agg == "token":
        assert ent.grad.tolist() == pytest.approx([-0.002] * 5, **TOL)  # -0.01 / 5


# ---------------------------------------------------------------- micro-batches


def _split_inputs(leaves):
    """Full batch and its two micro-batches (segments {0,1} | {2}), sharing global counts."""
    logp_full, logp_a, logp_b, ent_full, ent_a, ent_b = leaves
    old, ref = logs(P_OLD), logs(P) + logs([0.5, 2.0, 1.0, 0.5, 2.0])
    common = dict(total_tokens=5.0, total_segments=3.0, max_tokens=4.0, adv_mean=-0.5, adv_std=1.5)
    full = LossInputs(
        logp=logp_full, adv=torch.tensor(ADV, dtype=D), seg=torch.tensor(SEG),
        old_logp=old, ref_logp=ref, entropy=ent_full, **common,
    )
    a = LossInputs(
        logp=logp_a, adv=torch.tensor(ADV[:2], dtype=D), seg=torch.tensor([0, 0, 1]),
        old_logp=old[:3], ref_logp=ref[:3], entropy=ent_a, **common,
    )
    b = LossInputs(
        logp=logp_b, adv=torch.tensor(ADV[2:], dtype=D), seg=torch.tensor([0, 0]),
        old_logp=old[3:], ref_logp=ref[3:], entropy=ent_b, **common,
    )
    return full, a, b


@pytest.mark.parametrize("agg", AGGREGATIONS)
@pytest.mark.parametrize("kind", LOSS_KINDS)
def test_micro_batch_losses_and_grads_sum_to_full_batch(kind, agg):
    cfg = LossConfig(
        kind=kind, aggregation=agg, is_cap=1.0, normalize_std=True,
        kl_coef=0.1, entropy_coef=0.01, clip_low=0.2, clip_high=0.28,
    )
    lp = logs(P)
    ent = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.5], dtype=D)
    leaves = [
        lp.clone().requires_grad_(), lp[:3].clone().requires_grad_(), lp[3:].clone().requires_grad_(),
        ent.clone().requires_grad_(), ent[:3].clone().requires_grad_(), ent[3:].clone().requires_grad_(),
    ]
    full, a, b = _split_inputs(leaves)
    loss_full, _ = compute_loss(full, cfg)
    loss_a, _ = compute_loss(a, cfg)
    loss_b, _ = compute_loss(b, cfg)
    loss_full.backward()
    loss_a.backward()
    loss_b.backward()
    assert (loss_a + loss_b).item() == pytest.approx(loss_full.item(), rel=1e-12, abs=1e-12)
    torch.testing.assert_close(torch.cat([leaves[1].grad, leaves[2].grad]), leaves[0].grad)
    torch.testing.assert_close(torch.cat([leaves[4].grad, leaves[5].grad]), leaves[3].grad)


# ---------------------------------------------------------------- diagnostics, presets, errors


def test_diagnostics_are_detached_scalars():
    ent = torch.tensor([1.0, 0.5, 2.0, 0.0, 1.5], dtype=D, requires_grad=True)
    ref = logs(P)
    _, st = compute_loss(make(ref_logp=ref, entropy=ent), LossConfig(kind="ppo", kl_coef=0.1))
    for key in ("loss", "policy_loss", "logp_mean", "adv_mean", "ratio_mean", "ratio_max",
                "clip_frac", "kl", "kl_loss", "entropy", "num_tokens"):
        assert key in st, key
        assert st[key].dim() == 0 and not st[key].requires_grad, key
    assert st["num_tokens"].item() == 5


def test_empty_micro_batch_is_zero_not_nan():
    inp = LossInputs(
        logp=torch.zeros(0, dtype=D, requires_grad=True), adv=torch.zeros(0, dtype=D),
        seg=torch.zeros(0, dtype=torch.long), total_tokens=5.0, total_segments=3.0,
        old_logp=torch.zeros(0, dtype=D),
    )
    for agg in ("token", "sequence", "sum"):
        loss, st = compute_loss(inp, LossConfig(kind="ppo", aggregation=agg))
        loss.backward()
        assert loss.item() == 0.0
        assert all(not torch.isnan(v) for v in st.values())


def test_presets_match_trl_names():
    assert set(LOSS_PRESETS) == {
        "grpo", "dr_grpo", "dapo", "gspo", "cispo", "reinforce", "reinforce_baseline", "sft",
    }
    assert LOSS_PRESETS["grpo"] == LossConfig(kind="ppo", aggregation="sequence")
    assert LOSS_PRESETS["dr_grpo"] == LossConfig(kind="ppo", aggregation="constant")
    assert LOSS_PRESETS["dapo"].clip_high == 0.28
    cfg = loss_preset("grpo", kl_coef=0.04)
    assert cfg.kind == "ppo" and cfg.aggregation == "sequence" and cfg.kl_coef == 0.04
    with pytest.raises(ValueError, match="nope"):
        loss_preset("nope")
    # grpo / dr_grpo presets on the fixture (see test_ppo_values_all_aggregations)
    assert compute_loss(make(), LOSS_PRESETS["grpo"])[0].item() == pytest.approx(1.375 / 3, **TOL)
    assert compute_loss(make(), LOSS_PRESETS["dr_grpo"])[0].item() == pytest.approx(1.15 / 12, **TOL)


def test_config_needs_properties():
    assert LossConfig(kind="ppo").needs_old_logp
    assert not LossConfig(kind="reinforce", is_cap=2.0).needs_old_logp
    assert LossConfig(kl_coef=0.1).needs_ref_logp and not LossConfig().needs_ref_logp
    assert LossConfig(entropy_coef=0.01).needs_entropy and not LossConfig().needs_entropy


@pytest.mark.parametrize(
    "kw,field",
    [
        ({"kind": "dpo"}, "kind"),
        ({"aggregation": "mean"}, "aggregation"),
        ({"kl_estimator": "k2"}, "kl_estimator"),
        ({"clip_low": -0.1}, "clip_low"),
        ({"clip_high": float("nan")}, "clip_high"),
        ({"kl_coef": -1.0}, "kl_coef"),
        ({"is_cap": 0.0}, "is_cap"),
        ({"entropy_coef": float("inf")}, "entropy_coef"),
    ],
)
def test_config_validation(kw, field):
    with pytest.raises(ValueError, match=field):
        LossConfig(**kw)


def test_cispo_allows_huge_clip_low():
    assert LossConfig(kind="cispo", clip_low=1e6).clip_low == 1e6


@pytest.mark.parametrize("kind", ["ppo", "gspo", "cispo"])
def test_missing_old_logp_raises(kind):
    with pytest.raises(ValueError, match="old_logp"):
        compute_loss(make(old=False), LossConfig(kind=kind))


def test_missing_inputs_raise():
    with pytest.raises(ValueError, match="max_tokens"):
        compute_loss(make(max_tokens=None), LossConfig(aggregation="constant"))
    with pytest.raises(ValueError, match="ref_logp"):
        compute_loss(make(), LossConfig(kl_coef=0.1))
    with pytest.raises(ValueError, match="entropy"):
        compute_loss(make(), LossConfig(entropy_coef=0.01))


def test_input_shape_validation():
    with pytest.raises(ValueError, match="seg"):
        make(seg=torch.tensor([0, 0, 1]))
    with pytest.raises(ValueError, match="seg"):
        make(seg=torch.tensor([0.0, 0, 1, 2, 2]))
    with pytest.raises(ValueError, match="old_logp"):
        make(old_logp=torch.zeros(4, dtype=D))
    with pytest.raises(ValueError, match="adv"):
        make(adv=[[1.0, 2.0, 3.0]])
    with pytest.raises(ValueError, match="total_tokens"):
        make(total_tokens=0)


# ---------------------------------------------------------------- off-policy correction (behaviour IS)
#
# With prox = logp (the first pass over a batch) the behaviour ratio is w = p / p_old =
# [1.5, 0.5, 0.5, 1.5, 1.0] and the PPO ratio pi / pi_prox is 1 (no clipping), so for "ppo" with
# token aggregation o_t = -w'_t * A_t * r_t and d loss / d logp_t = -w'_t * A_t / T, A = [1, 1, -2, -.5, -.5].
# Sequence ratios: segment 0: 1.5 * 0.5 = 0.75, segment 1: 0.5, segment 2: 1.5 * 1.0 = 1.5.


@pytest.mark.parametrize("mode,cap,low,weights,flagged", [
    ("token_truncate", 1.2, 0.0, [1.2, 0.5, 0.5, 1.2, 1.0], [1, 0, 0, 1, 0]),
    ("token_mask", 1.2, 0.6, [0.0, 0.0, 0.0, 0.0, 1.0], [1, 1, 1, 1, 0]),
    ("token_mask", 2.0, 0.0, [1.5, 0.5, 0.5, 1.5, 1.0], [0, 0, 0, 0, 0]),
    ("sequence_truncate", 1.2, 0.0, [0.75, 0.75, 0.5, 1.2, 1.2], [0, 0, 0, 1, 1]),
    ("sequence_mask", 1.2, 0.6, [0.75, 0.75, 0.0, 0.0, 0.0], [0, 0, 1, 1, 1]),
])
def test_behavior_is_weights_and_gradient(mode, cap, low, weights, flagged):
    cfg = LossConfig(kind="ppo", aggregation="token", behavior_is=mode, behavior_is_cap=cap, behavior_is_low=low)
    inp = make()
    loss, stats = compute_loss(inp, cfg)
    A = [1.0, 1.0, -2.0, -0.5, -0.5]
    assert loss.item() == pytest.approx(sum(-w * a for w, a in zip(weights, A)) / 5, **TOL)
    loss.backward()
    assert inp.logp.grad.tolist() == pytest.approx([-w * a / 5 for w, a in zip(weights, A)], **TOL)
    key = "is_drop_frac" if mode.endswith("mask") else "is_clip_frac"
    assert stats[key].item() == pytest.approx(sum(flagged) / 5, **TOL)
    assert stats["is_weight_mean"].item() == pytest.approx(sum(weights) / 5, **TOL)
    assert stats["ratio_mean"].item() == pytest.approx(1.0, **TOL)  # pi / pi_prox on the first pass


def test_behavior_is_uses_the_proximal_policy_for_the_clip():
    """Given pi_prox = p_old the weight is 1 and the objective is plain PPO on pi / p_old."""
    plain, _ = compute_loss(make(), LossConfig(kind="ppo"))
    inp = make(prox_logp=logs(P_OLD))
    corrected, stats = compute_loss(inp, LossConfig(kind="ppo", behavior_is="token_truncate"))
    assert corrected.item() == pytest.approx(plain.item(), **TOL) and stats["is_weight_mean"].item() == 1.0


def test_sampler_kl_is_measured_on_same_version_tokens_only():
    """k3 of KL(sampler || learner) from log w = logp - old_logp, over tokens sampled by the
    learner's current weights: w = [1.5, 0.5, 0.5, 1.5, 1.0]."""
    k3 = [w - 1 - math.log(w) for w in (1.5, 0.5, 0.5, 1.5, 1.0)]
    _, stats = compute_loss(make(), LossConfig(kind="ppo"))
    assert stats["sampler_kl"].item() == pytest.approx(sum(k3) / 5, **TOL) and stats["sampler_tokens"].item() == 5
    same = torch.tensor([True, False, False, True, True])
    _, stats = compute_loss(make(same_version=same), LossConfig(kind="ppo"))
    assert stats["sampler_kl"].item() == pytest.approx((k3[0] + k3[3] + k3[4]) / 3, **TOL)
    assert stats["sampler_tokens"].item() == 3
    _, stats = compute_loss(make(old=False), LossConfig(kind="sft"))
    assert "sampler_kl" not in stats


def test_behavior_is_config_errors():
    with pytest.raises(ValueError, match="behavior_is"):
        LossConfig(behavior_is="token")
    with pytest.raises(ValueError, match="behavior_is_low"):
        LossConfig(behavior_is="token_mask", behavior_is_low=3.0, behavior_is_cap=2.0)
    with pytest.raises(ValueError, match="needs LossInputs.old_logp"):
        compute_loss(make(old=False), LossConfig(kind="reinforce", behavior_is="token_truncate"))


def test_trainer_refuses_behavior_is_with_several_passes_per_batch():
    from ludic.training.algorithms import make_algorithm
    from ludic.training.config import TrainerConfig
    from ludic.training.trainer import Trainer

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match="ppo_epochs=2"):
        Trainer(model, make_algorithm("grpo", behavior_is="token_truncate"), None, TrainerConfig(ppo_epochs=2))


def test_sampler_kl_resolves_tiny_mismatches():
    """A sampler 1e-5 nats away from the learner (a kernel difference) gives KL ~ 5e-11, not 0."""
    lp = torch.full((4,), -1.0, dtype=torch.float32, requires_grad=True)
    inp = LossInputs(logp=lp, adv=torch.ones(1), seg=torch.zeros(4, dtype=torch.long), total_tokens=4.0,
                     total_segments=1.0, old_logp=torch.full((4,), -1.0 - 1e-5))
    _, stats = compute_loss(inp, LossConfig(kind="ppo"))
    assert stats["sampler_kl"].item() == pytest.approx(0.5e-10, rel=0.05)
