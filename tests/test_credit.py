import pytest

from ludic.rollouts.batch import RolloutBatchSource, build_saw_items, drop_zero_weight
from ludic.rollouts.credit import (
    ConstantCredit,
    EpisodicReturn,
    GroupNormalizedReturn,
    MonteCarloReturn,
    PerStepReward,
    group_advantages,
    make_credit,
)
from ludic.rollouts.engine import GRPORequestStrategy, IdentityStrategy, RolloutEngine
from ludic.types import EnvSpec, Rollout, RolloutRequest, Step, TokenTrace


def _rollout(rewards, gid=None, agent="a", failed=False):
    steps = [Step(i, "o", "a", "a", None, r, trace=TokenTrace((1,), (2, 3), (-1.0, -2.0), (0, 0)))
             for i, r in enumerate(rewards)]
    return Rollout(steps=steps, meta={"group_id": gid, "agent_id": agent, "failed": failed})


def test_mc_return_by_hand():
    r = _rollout([1.0, 0.0, 2.0])
    w = MonteCarloReturn(gamma=0.5).compute([r])
    # G2 = 2 ; G1 = 0 + 0.5*2 = 1 ; G0 = 1 + 0.5*1 = 1.5
    assert [w[(r.id, i)] for i in range(3)] == [1.5, 1.0, 2.0]


def test_per_step_episodic_constant():
    r = _rollout([1.0, -0.5])
    assert PerStepReward().compute([r]) == {(r.id, 0): 1.0, (r.id, 1): -0.5}
    assert EpisodicReturn().compute([r]) == {(r.id, 0): 0.5, (r.id, 1): 0.5}
    assert ConstantCredit(2.0).compute([r]) == {(r.id, 0): 2.0, (r.id, 1): 2.0}


def test_group_advantages_by_hand():
    # returns 1, 0, 0, 3: mean 1, population std sqrt((0+1+1+4)/4) = sqrt(1.5)
    assert group_advantages([1, 0, 0, 3], "mean") == [0, -1, -1, 2]
    std = 1.5 ** 0.5
    assert group_advantages([1, 0, 0, 3], "mean_std", eps=0) == pytest.approx([0, -1 / std, -1 / std, 2 / std])
    # leave-one-out: 1 - (0+0+3)/3 = 0 ; 0 - 4/3 ; 0 - 4/3 ; 3 - 1/3
    assert group_advantages([1, 0, 0, 3], "loo") == pytest.approx([0, -4 / 3, -4 / 3, 8 / 3])
    assert group_advantages([5.0], "mean_std") == [0.0]
    assert group_advantages([2, 2, 2], "mean_std") == [0, 0, 0]
    with pytest.raises(ValueError, match="'bad'"):
        group_advantages([1, 2], "bad")


def test_group_normalized_return_groups_by_id_and_seat():
    a, b = _rollout([1.0, 0.0], "g1"), _rollout([0.0], "g1")
    c, d = _rollout([1.0], "g1", agent="O"), _rollout([-1.0], "g1", agent="O")
    solo = _rollout([3.0], "g2")  # a group whose other members failed: advantage 0, not an error
    w = GroupNormalizedReturn("mean").compute([a, b, c, d, solo])
    assert w[(a.id, 0)] == w[(a.id, 1)] == 0.5 and w[(b.id, 0)] == -0.5
    assert w[(c.id, 0)] == 1.0 and w[(d.id, 0)] == -1.0
    assert w[(solo.id, 0)] == 0.0
    pos = GroupNormalizedReturn("mean", positive_only=True).compute([a, b])
    assert pos[(b.id, 0)] == 0.0


def test_build_saw_items_skips_failed_and_keeps_tokens():
    ok, failed = _rollout([1.0], "g"), _rollout([0.0], "g", failed=True)
    items = build_saw_items([ok, failed], MonteCarloReturn())
    assert len(items) == 1
    it = items[0]
    assert it.prompt_ids == (1,) and it.completion_ids == (2, 3) and it.logprobs == (-1.0, -2.0)
    assert it.weight == 1.0 and it.meta["rollout_id"] == ok.id
    assert not drop_zero_weight(build_saw_items([_rollout([0.0])], MonteCarloReturn())[0])


def test_build_saw_items_skips_frozen_opponents_before_credit():
    a, b = _rollout([1.0], "g", agent="X"), _rollout([0.0], "g", agent="X")
    frozen = _rollout([5.0], "g", agent="X")  # same group and seat: it would move the baseline
    frozen.meta["trainable"] = False
    items = build_saw_items([a, b, frozen], GroupNormalizedReturn("mean"))
    assert {it.meta["rollout_id"]: it.weight for it in items} == {a.id: 0.5, b.id: -0.5}


def test_grpo_strategy_shares_env_seed_and_varies_sampling_seed():
    req = RolloutRequest(EnvSpec("tictactoe"), max_steps=3)
    out = GRPORequestStrategy(4, seed=0).expand([req, req])
    assert len(out) == 8
    g1, g2 = out[:4], out[4:]
    assert len({r.env_seed for r in g1}) == 1 and len({r.sampling_seed for r in g1}) == 4
    assert len({r.group_id for r in g1}) == 1 and g1[0].group_id != g2[0].group_id
    assert [r.env_seed for r in GRPORequestStrategy(4, seed=0).expand([req])] == [r.env_seed for r in g1]


def test_grpo_strategy_sends_the_last_copies_of_a_group_to_the_exploring_protocol():
    """``explore=k``: the last k copies of every group run the ``explore_protocol`` (a hotter sampler, say), so a
    group whose policy samples all agree still holds alternatives to compare; the rest run the request's own."""
    req = RolloutRequest(EnvSpec("tictactoe"), max_steps=3, meta={"stage": 1})
    out = GRPORequestStrategy(4, seed=0, explore=1).expand([req, req])
    assert [r.protocol for r in out] == ["single_agent"] * 3 + ["explore"] + ["single_agent"] * 3 + ["explore"]
    assert [r.meta for r in out[:4]] == [{"stage": 1}] * 3 + [{"stage": 1, "explore": True}]
    # the same seeds as without exploration: turning it on changes only which sampler the last copies use
    plain = GRPORequestStrategy(4, seed=0).expand([req, req])
    assert [(r.env_seed, r.sampling_seed) for r in out] == [(r.env_seed, r.sampling_seed) for r in plain]
    with pytest.raises(ValueError, match="explore"):
        GRPORequestStrategy(4, explore=4)


def test_group_credit_can_keep_only_the_gains_of_exploring_samples():
    """``explored_gains_only``: an exploring rollout (meta ``explore``, a move the policy did not sample) that did
    worse than its group gets 0, not a negative advantage: pushing down a move the policy barely samples moves
    its probability anywhere, illegal cells included. One that did better keeps its advantage; the policy's own
    samples are untouched."""
    rs = [_rollout([1.0], "g"), _rollout([0.0], "g"), _rollout([1.0], "g"), _rollout([0.0], "g")]
    rs[2].meta["explore"] = rs[3].meta["explore"] = True
    plain = GroupNormalizedReturn().compute(rs)
    kept = GroupNormalizedReturn(explored_gains_only=True).compute(rs)
    key = lambda r: (r.id, 0)  # noqa: E731
    assert plain[key(rs[3])] < 0 and kept[key(rs[3])] == 0.0
    assert kept[key(rs[2])] == plain[key(rs[2])] > 0
    assert kept[key(rs[1])] == plain[key(rs[1])] < 0 and kept[key(rs[0])] == plain[key(rs[0])]


def test_make_credit_rejects_unknown():
    with pytest.raises(ValueError, match="unknown credit assigner 'x'"):
        make_credit("x")


def test_group_credit_without_groups_is_an_error_not_silent_zero_gradients():
    """Rollouts without a group id would each be a group of one: advantage 0, no gradient, no warning."""
    with pytest.raises(ValueError, match="group_id"):
        GroupNormalizedReturn().compute([_rollout([1.0]), _rollout([0.0])])
    with pytest.raises(ValueError, match="GRPORequestStrategy"):
        RolloutBatchSource(RolloutEngine({}), lambda: [], GroupNormalizedReturn())
    # an explicit strategy (requests that carry their own group ids) is the user's call
    RolloutBatchSource(RolloutEngine({}), lambda: [], GroupNormalizedReturn(), strategy=IdentityStrategy())
    RolloutBatchSource(RolloutEngine({}), lambda: [], GroupNormalizedReturn(), strategy=GRPORequestStrategy(2))
