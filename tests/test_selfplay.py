"""Self-play, league and bot opponents in ``ludic train tictactoe`` (ludic.tictactoe.opponents)."""

import json
import random
from collections import defaultdict

import pytest

from ludic.inference.client import ChatResponse
from ludic.tictactoe.train import TrainTicTacToeConfig, train
from ludic.tictactoe.opponents import OpponentRequests, opponent_metrics, opponent_requests
from ludic.rollouts.batch import RolloutBatchSource
from ludic.rollouts.credit import GroupNormalizedReturn
from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
from ludic.tokenization import render_ids
from ludic.training.config import TrainerConfig
from ludic.training.league import League, OpponentSampler
from ludic.types import FinishReason, TokenTrace

CELLS = [r + c for r in "ABC" for c in "123"]


class RandomMoveClient:
    """Answers ``<think>..</think><move>cell</move>`` with a cell drawn from the request's seed
    (legal or not), tokenised for real: games end in wins, draws, illegal moves and forfeits."""

    def __init__(self, tokenizer, name="policy"):
        self._tokenizer = tokenizer
        self.name = name
        self.calls = 0

    @property
    def tokenizer(self):
        return self._tokenizer

    async def complete(self, request):
        self.calls += 1
        cell = random.Random(request.sampling.seed).choice(CELLS)
        ids = self._tokenizer(f"<think>{self.name}</think><move>{cell}</move>", add_special_tokens=False)["input_ids"]
        ids = ids + [self._tokenizer.eos_token_id]
        prompt = request.prompt_ids or tuple(render_ids(self._tokenizer, request.messages))
        trace = TokenTrace(tuple(prompt), tuple(ids), (-0.5,) * len(ids), (0,) * len(ids), FinishReason.STOP)
        return ChatResponse(text=f"<think>{self.name}</think><move>{cell}</move>", trace=trace)


def _source(cfg, sampler, client):
    engine = RolloutEngine({}, concurrency=16)
    requests = OpponentRequests(cfg, sampler, engine, client)
    engine.protocols["single_agent"] = lambda: pytest.fail("no bot was drawn")
    source = RolloutBatchSource(engine, requests, GroupNormalizedReturn("mean"),
                                strategy=GRPORequestStrategy(cfg.group_size, seed=1), metrics_fn=opponent_metrics)
    return engine, requests, source


def _advantages(items):
    """Rollout id -> (group, seat, advantage); every item of a rollout carries the rollout's advantage."""
    out = {}
    for it in items:
        out[it.meta["rollout_id"]] = (it.meta["group_id"], it.meta["agent_id"], it.weight)
    return out


async def test_self_play_trains_both_seats_each_normalised_within_its_seat(tokenizer):
    cfg = TrainTicTacToeConfig(opponent="self", group_size=4, rollouts_per_update=12, ctx="last", compact=True)
    _, _, source = _source(cfg, OpponentSampler("self"), RandomMoveClient(tokenizer))
    batch = await source.next_batch()
    rollouts = source.last_rollouts
    assert {r.meta["opponent"] for r in rollouts} == {"self"} and len(rollouts) == 2 * 12
    by_group = defaultdict(list)
    for r in rollouts:
        by_group[r.meta["group_id"]].append(r.meta["agent_id"])
    assert len(by_group) == 3 and all(sorted(seats) == ["O"] * 4 + ["X"] * 4 for seats in by_group.values())
    adv = _advantages(batch.items)
    assert {seat for _, seat, _ in adv.values()} == {"X", "O"}  # both seats are trained
    sums, returns = defaultdict(float), defaultdict(list)
    for r in rollouts:
        if r.id in adv:
            group, seat, a = adv[r.id]
            sums[(group, seat)] += a
            returns[(group, seat)].append(r.total_reward)
    # each seat's baseline is its own mean return: advantages sum to zero per (group, seat) ...
    assert all(abs(v) < 1e-9 for v in sums.values())
    # ... and X's mean differs from O's somewhere, so a pooled baseline would not have
    means = {k: sum(v) / len(v) for k, v in returns.items()}
    assert any(abs(means[(g, "X")] - means[(g, "O")]) > 0.1 for g in by_group if (g, "X") in means and (g, "O") in means)
    assert batch.meta["vs_self/rollouts"] == 24 and batch.meta["num_frozen_rollouts"] == 0


async def test_league_games_train_only_the_policy_seat_and_alternate_it(tokenizer, tmp_path):
    cfg = TrainTicTacToeConfig(opponent_pool="league:1", group_size=2, rollouts_per_update=8, ctx="last")
    frozen_client = RandomMoveClient(tokenizer, name="frozen")
    league = League(tmp_path / "league", max_size=1, every=1, make_client=lambda snap: frozen_client)

    class Policy:
        def save_pretrained(self, folder):
            folder.mkdir(parents=True)

    league.maybe_snapshot(Policy(), 0)
    policy = RandomMoveClient(tokenizer)
    engine, _, source = _source(cfg, OpponentSampler("league:1", league), policy)
    batch = await source.next_batch()
    rollouts = source.last_rollouts
    frozen = [r for r in rollouts if r.meta.get("trainable") is False]
    trained = [r for r in rollouts if r.meta.get("trainable", True)]
    assert len(frozen) == len(trained) == 8 and frozen_client.calls > 0 and policy.calls > 0
    assert all(r.meta["agent_id"] != r.meta["trained_seat"] for r in frozen)
    assert all(r.meta["agent_id"] == r.meta["trained_seat"] for r in trained)
    assert all(r.meta["opponent_snapshot"] == "step_000000" for r in rollouts)
    assert [r.meta["trained_seat"] for r in trained[::2]] == ["X", "O", "X", "O"]  # group after group
    for r in trained:  # the frozen seat's moves come from the frozen client, the trained seat's from the policy
        assert all("<think>policy</think>" in s.action for s in r.steps)
    for r in frozen:
        assert all("<think>frozen</think>" in s.action for s in r.steps)
    assert {it.meta["rollout_id"] for it in batch.items} <= {r.id for r in trained}
    assert batch.meta["num_frozen_rollouts"] == 8 and batch.meta["vs_league/rollouts"] == 8
    assert {k for k in engine.protocols if k.startswith("league:")} == {"league:step_000000:O", "league:step_000000:X"}
    league.maybe_snapshot(Policy(), 1)  # step 0 leaves the league (max_size 1): its protocols go too
    await source.next_batch()
    assert {k for k in engine.protocols if k.startswith("league:")} <= {"league:step_000001:O", "league:step_000001:X"}


def test_pool_bots_alternate_the_agent_seat_and_bad_opponents_are_refused(tokenizer, tmp_path):
    cfg = TrainTicTacToeConfig(opponent_pool="minimax:1,random:1", compact=True, show_opponent_move=False)
    requests = OpponentRequests(cfg, OpponentSampler(cfg.opponent_pool, seed=0), RolloutEngine({}),
                                RandomMoveClient(tokenizer))
    reqs = requests() + requests() + requests() + requests()
    for kind in ("minimax", "random"):
        starts = [r.env.kwargs["agent_starts"] for r in reqs if r.meta["opponent"] == kind]
        assert starts[:2] == [True, False]
    assert all(r.env.kind == "tictactoe" and r.env.kwargs["compact"] for r in reqs)
    with pytest.raises(ValueError, match="unknown opponent 'alice'"):
        opponent_requests(TrainTicTacToeConfig(opponent_pool="alice:1"), RolloutEngine({}), None, None, None, tmp_path)
    with pytest.raises(ValueError, match="unknown tic-tac-toe opponent 'alice'"):
        opponent_requests(TrainTicTacToeConfig(opponent="alice"), RolloutEngine({}), None, None, None, tmp_path)
    assert opponent_requests(TrainTicTacToeConfig(opponent="minimax"), RolloutEngine({}), None, None, None,
                             tmp_path) is None


def test_train_self_play_and_a_league_pool_that_survives_resume(tiny_model_dir, tmp_path):
    base = dict(model=str(tiny_model_dir), group_size=2, rollouts_per_update=4, max_completion_tokens=6,
                logger="none", concurrency=8, trainer=TrainerConfig(checkpoint_every=1))
    m = train(TrainTicTacToeConfig(run_dir=str(tmp_path / "self"), opponent="self", train_steps=1, **base))
    assert m["vs_self/rollouts"] == 8 and not (tmp_path / "self" / "league").exists()
    metas = [json.loads(line)["meta"] for line in (tmp_path / "self" / "rollouts.jsonl").read_text().splitlines()]
    assert sorted(x["agent_id"] for x in metas) == ["O"] * 4 + ["X"] * 4

    run = tmp_path / "pool"
    pool = dict(run_dir=str(run), opponent_pool="league:1,self:1,random:1", league_every=1, league_size=2, **base)
    train(TrainTicTacToeConfig(train_steps=1, **pool))
    league = run / "league"
    assert json.loads((league / "league.json").read_text())["snapshots"] == [
        {"name": "step_000000", "step": 0}, {"name": "step_000001", "step": 1}]
    assert (league / "step_000001" / "adapter_model.safetensors").exists()
    ckpt = json.loads((run / "checkpoints" / "step_000001" / "trainer_state.json").read_text())
    assert [s["name"] for s in ckpt["source_state"]["requests"]["league"]["snapshots"]] == [
        "step_000000", "step_000001"]  # the final save comes after the step's snapshot
    train(TrainTicTacToeConfig(train_steps=2, **pool))  # resumes at step 1: keeps its league, snapshots step 2
    assert [s["name"] for s in json.loads((league / "league.json").read_text())["snapshots"]] == [
        "step_000001", "step_000002"]
    train(TrainTicTacToeConfig(train_steps=1, resume=False, **pool))  # a fresh run: a fresh league
    assert [s["name"] for s in json.loads((league / "league.json").read_text())["snapshots"]] == [
        "step_000000", "step_000001"]
