"""League of frozen snapshots and the opponent sampler (ludic.training.league)."""

import json
from collections import Counter

import pytest
import torch

from ludic.training.league import League, OpponentSampler, frozen_copy_clients, parse_mixture


class FakePolicy:
    """Saves a marker file like ``save_pretrained`` (the league only calls that on the policy)."""

    def __init__(self):
        self.value = 0

    def save_pretrained(self, folder):
        folder.mkdir(parents=True)
        (folder / "weights.txt").write_text(str(self.value))


def _names(league):
    return [s.name for s in league.snapshots]


def test_parse_mixture_normalises_and_names_bad_entries():
    assert parse_mixture("self:0.4,league:0.3,minimax:0.2,random:0.1") == pytest.approx(
        {"self": 0.4, "league": 0.3, "minimax": 0.2, "random": 0.1})
    assert parse_mixture("self:2, minimax:2") == {"self": 0.5, "minimax": 0.5}
    assert parse_mixture("self") == {"self": 1.0}
    assert parse_mixture("self:1,random:0") == {"self": 1.0}  # a zero weight is never drawn
    for text, msg in [("self:x", "'self' is not a number"), ("self:-1", "must be >= 0"),
                      ("self:1,self:2", "given twice"), ("random:0", "positive weight"),
                      ("bob:1", "unknown opponent 'bob'")]:
        with pytest.raises(ValueError, match=msg):
            parse_mixture(text, allowed=["self", "league", "random"])


def test_league_snapshots_every_n_steps_keeps_the_newest_and_indexes_them(tmp_path):
    league = League(tmp_path / "league", max_size=2, every=5)
    policy = FakePolicy()
    taken = []
    for step in range(0, 16):
        policy.value = step
        taken.append(league.maybe_snapshot(policy, step))
    assert [s.step for s in taken if s is not None] == [0, 5, 10, 15]
    assert league.maybe_snapshot(policy, 15) is None  # already taken
    assert _names(league) == ["step_000010", "step_000015"]  # bounded: the oldest went
    assert sorted(p.name for p in (tmp_path / "league").iterdir()) == ["league.json", "step_000010", "step_000015"]
    assert (tmp_path / "league" / "step_000010" / "weights.txt").read_text() == "10"
    index = json.loads((tmp_path / "league" / "league.json").read_text())
    assert index == {"snapshots": [{"name": "step_000010", "step": 10}, {"name": "step_000015", "step": 15}]}
    assert _names(League(tmp_path / "league", max_size=2, every=5)) == _names(league)  # reopened from disk
    assert League(tmp_path / "never", every=0).maybe_snapshot(policy, 0) is None


def test_league_load_state_dict_restores_a_checkpointed_league(tmp_path):
    league = League(tmp_path / "league", max_size=3, every=1)
    policy = FakePolicy()
    for step in range(3):
        league.maybe_snapshot(policy, step)
    state = league.state_dict()  # what a checkpoint at step 2 holds
    league.maybe_snapshot(policy, 3)  # taken after that checkpoint; drops step 0 from disk
    with pytest.warns(UserWarning, match="step_000000"):
        league.load_state_dict(state)
    # step 0 is gone (dropped with a warning), step 3 is from the lost future: deleted
    assert _names(league) == ["step_000001", "step_000002"]
    assert not (tmp_path / "league" / "step_000003").exists()
    assert json.loads((tmp_path / "league" / "league.json").read_text()) == league.state_dict()


def test_league_client_needs_a_live_snapshot_and_is_cached(tmp_path):
    made = []
    league = League(tmp_path / "league", max_size=1, every=1, make_client=lambda s: made.append(s.name) or object())
    policy = FakePolicy()
    first = league.maybe_snapshot(policy, 0)
    assert league.client(first) is league.client(first) and made == ["step_000000"]
    league.maybe_snapshot(policy, 1)
    with pytest.raises(KeyError, match="step_000000"):
        league.client(first)
    with pytest.raises(RuntimeError, match="make_client"):
        no_clients = League(tmp_path / "other", every=1)
        no_clients.client(no_clients.maybe_snapshot(policy, 0))


def test_frozen_copy_client_plays_the_snapshot_not_the_live_policy(tiny_model_dir, tmp_path):
    from ludic.inference.client import SamplingParams
    from ludic.training.lora import LoraSettings, load_policy

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    league = League(tmp_path / "league", every=1, make_client=frozen_copy_clients(model, tok))
    snap = league.maybe_snapshot(model, 0)
    with torch.no_grad():  # the policy trains on after the snapshot
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.add_(0.5)
    engine = league.client(snap)
    frozen = dict(engine.model.named_parameters())
    live = dict(model.named_parameters())
    lora_b = [n for n in live if "lora_B" in n]
    assert lora_b and all(torch.count_nonzero(frozen[n]) == 0 for n in lora_b)  # LoRA B starts at zero
    assert all(torch.equal(frozen[n], live[n]) for n in live if "lora_" not in n)  # same base weights
    assert not any(p.requires_grad for p in frozen.values()) and engine.policy_version == 0
    [out] = engine.generate([[1, 2, 3]], [SamplingParams(temperature=0.0, max_tokens=3)])
    assert len(out.trace.completion_ids) >= 1


def test_sampler_draws_the_mixture_and_alternates_seats_per_kind(tmp_path):
    league = League(tmp_path / "league", every=1)
    sampler = OpponentSampler("self:0.5,league:0.25,minimax:0.25", league, seed=3)
    first = sampler.draw()
    assert first.kind in ("self", "minimax")  # an empty league is played as self
    league.maybe_snapshot(FakePolicy(), 0)
    draws = [sampler.draw() for _ in range(4000)]
    freq = Counter(d.kind for d in draws)
    assert abs(freq["self"] / 4000 - 0.5) < 0.03 and abs(freq["league"] / 4000 - 0.25) < 0.03
    assert all(d.snapshot is not None for d in draws if d.kind == "league")
    for kind in ("self", "league", "minimax"):
        seats = [d.seat for d in draws if d.kind == kind][:6]
        assert seats in ([0, 1, 0, 1, 0, 1], [1, 0, 1, 0, 1, 0])
    with pytest.raises(ValueError, match="no League"):
        OpponentSampler("league:1")


def test_sampler_state_round_trip_repeats_the_draws(tmp_path):
    league = League(tmp_path / "league", every=1)
    for step in range(3):
        league.maybe_snapshot(FakePolicy(), step)
    sampler = OpponentSampler("self:1,league:1,random:1", league, seed=0)
    for _ in range(5):
        sampler.draw()
    state = json.loads(json.dumps(sampler.state_dict()))  # it goes through trainer_state.json
    expected = [sampler.draw() for _ in range(20)]
    resumed = OpponentSampler("self:1,league:1,random:1", League(tmp_path / "league", every=1), seed=99)
    resumed.load_state_dict(state)
    assert [resumed.draw() for _ in range(20)] == expected


def test_frozen_copy_client_of_a_fully_fine_tuned_policy(tiny_model_dir, tmp_path):
    from ludic.training.lora import load_policy

    model, tok = load_policy(str(tiny_model_dir), dtype="float32", seed=0)
    league = League(tmp_path / "league", every=1, make_client=frozen_copy_clients(model, tok))
    snap = league.maybe_snapshot(model, 0)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    frozen = dict(league.client(snap).model.named_parameters())
    assert all(torch.equal(frozen[n], before[n]) for n in before)
