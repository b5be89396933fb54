"""Curriculum: stage progression, weighted failure replay, checkpoint state; the games ladder."""

import random

import pytest
from conftest import require

from ludic.rollouts.curriculum import Curriculum, Stage


def test_progression_replay_and_state():
    cur = Curriculum([Stage("easy", {"opponent": "random"}), Stage("hard", {"opponent": "mcts"})],
                     threshold=0.7, window=10, replay_share=0.3, seed=0)
    fresh = lambda rng: {"task_id": rng.randrange(10**8)}  # noqa: E731
    for k in range(10):
        cur.update({"task_id": k}, score=1.0 if k < 6 else 0.0)  # 60% < 70%: stays
    assert cur.stage.name == "easy" and len(cur.failures) == 4
    for k in range(10):
        cur.update({"task_id": 100 + k}, score=1.0)  # the window slides to 100%: moves on
    assert cur.stage.name == "hard" and len(cur.recent) == 3  # moved on at the 7th, the window restarted
    cur.failures.clear()
    cur.update({"task_id": 7}, score=0.0)
    cur.update({"task_id": 8}, score=0.45)
    draws = [cur.draw(fresh) for _ in range(2000)]
    replays = [t["task_id"] for t, r in draws if r]
    assert 0.25 < len(replays) / len(draws) < 0.35
    assert replays.count(7) / replays.count(8) == pytest.approx(1.0 / 0.55, rel=0.2)  # weight 1 - score
    m = cur.metrics()
    assert m["curriculum/stage"] == 1.0 and 0.25 < m["curriculum/replay_share"] < 0.35
    state = cur.state_dict()
    again = Curriculum([Stage("easy"), Stage("hard")], window=10)
    again.load_state_dict(state)
    assert again.stage.name == "hard" and again.draw(fresh) == cur.draw(fresh)


def test_games_ladder_reaches_the_env():
    require("pyspiel")
    from ludic.recipes.games import GameRequests, TrainGamesConfig

    cfg = TrainGamesConfig(games="liars_dice", curriculum=True, episodes_per_update=4)
    req = GameRequests(cfg, seed=0)
    assert all(r.env.kwargs["opponent"] == "random" and "mcts" not in r.env.kwargs for r in req())
    req.curriculum.index = 1
    assert all(r.env.kwargs["mcts"] == (300, 20) for r in req())  # a tenth of liars_dice's (3000, 200)
    req.curriculum.index = 2
    reqs = req()
    assert all(r.env.kwargs["mcts"] == (3000, 200) and r.env.kwargs["opponent"] == "mcts" for r in reqs)
    from ludic.envs.registry import make_env

    env = make_env(reqs[0].env)  # not reset: a 3000-simulation MCTS move takes minutes
    assert env.opponent == "mcts" and env.mcts == (3000, 200)
    with pytest.raises(ValueError, match="curriculum"):
        GameRequests(TrainGamesConfig(curriculum=True, opponent="self"), seed=0)
