"""OpenSpielEnv on real pyspiel: every game of the task list plus named games, answers parsed the
suite's way, retries and forfeits, deterministic replays, private information kept private."""

import numpy as np
import pytest
from conftest import require

pyspiel = require("pyspiel")

from ludic.envs.openspiel import RETRY_MESSAGE, OpenSpielEnv, parse_action  # noqa: E402
from ludic.envs.openspiel_suite import GAMES, decode_task, task_id_for  # noqa: E402

NAMED = ("kuhn_poker", "tic_tac_toe", "connect_four")


def _play(env, seed, rng, *, bad_first=True, max_turns=3000):
    """Play the agent seat(s) with random legal ids; the first answer of the game is junk."""
    obs = env.reset(seed=seed)
    assert all("Legal Actions:" in o or "Waiting" in o or "Game over" in o for o, _ in obs.values())
    turns, outcomes = 0, {}
    while env.active_agents and turns < max_turns:
        actions = {}
        for a in env.active_agents:
            legal, _ = env.legal_lines(env.seat_of[a])
            actions[a] = "???" if bad_first and turns == 0 else str(legal[rng.randint(len(legal))])
        outcomes = env.step(actions)
        if bad_first and turns == 0:
            first = next(iter(actions))
            assert outcomes[first].obs.startswith(RETRY_MESSAGE.format(attempt=2, attempts=3) + "\n\nCurrent State:")
            assert outcomes[first].info["invalid"] and not outcomes[first].terminated
        turns += 1
    return outcomes, turns


@pytest.mark.parametrize("game", GAMES + NAMED)
def test_every_game_plays_to_a_score_in_unit_interval_with_the_retry_path(game):
    kw = {"task_id": task_id_for(game, 1)} if game in GAMES else {"game": game}
    env = OpenSpielEnv(**kw)
    rng = np.random.RandomState(0)
    total = {a: 0.0 for a in env.agent_ids}
    env.reset(seed=3)
    outcomes, turns = _play(env, 3, rng)
    assert not env.active_agents, f"{game} did not end in {turns} turns"
    for a, out in outcomes.items():
        assert out.terminated
        assert 0.0 <= out.info["score"] <= 1.0
        assert out.info["success"] == (out.info["score"] > 0.5)
        total[a] += out.reward
    assert "Game over" in env.observe(env.agent_ids[0])
    assert env.suggested_sysprompt.startswith(f"You are playing {game}.")


@pytest.mark.parametrize("game", ["leduc_poker", "liars_dice", "goofspiel", "backgammon", "2048"])
def test_same_task_and_seed_replay_the_same_game_and_another_seed_differs(game):
    histories = []
    for seed in (11, 11, 12):
        env = OpenSpielEnv(task_id=task_id_for(game, 0))
        _play(env, seed, np.random.RandomState(5), bad_first=False)
        histories.append([(h["player"], h["action"]) for h in env.history])
    assert histories[0] == histories[1]
    assert histories[0] != histories[2]


def test_rewards_sum_to_the_score_in_a_game_that_pays_as_it_goes():
    env = OpenSpielEnv(game="2048")
    env.reset(seed=1)
    rng, paid, outcomes = np.random.RandomState(0), 0.0, {}
    while env.active_agents:
        legal, _ = env.legal_lines(0)
        outcomes = env.step({"agent_0": str(legal[rng.randint(len(legal))])})
        paid += outcomes["agent_0"].reward
    assert paid == pytest.approx(outcomes["agent_0"].info["score"], abs=1e-9)
    assert outcomes["agent_0"].info["score"] > 0


@pytest.mark.parametrize("game", ["kuhn_poker", "leduc_poker", "liars_dice"])
def test_a_seat_never_sees_another_seats_private_cards(game):
    """Vary the last private deal before the first decision (seat 1's card or die): seat 0's
    text stays the same, seat 1's changes."""
    env = OpenSpielEnv(task_id=task_id_for(game)) if game in GAMES else OpenSpielEnv(game=game)
    probe, deals = env.game.new_initial_state(), 0
    while probe.is_chance_node():
        probe.apply_action(probe.chance_outcomes()[0][0])
        deals += 1
    first = env.game.new_initial_state()
    for _ in range(deals - 1):
        first.apply_action(first.chance_outcomes()[0][0])
    seen0, seen1 = set(), set()
    for outcome, _ in first.chance_outcomes():
        env.state = first.clone()
        env.state.apply_action(outcome)
        seen0.add(env.state_text(0))
        seen1.add(env.state_text(1))
    assert len(seen0) == 1, seen0
    assert len(seen1) > 1


def test_three_invalid_answers_forfeit_with_score_zero():
    env = OpenSpielEnv(game="tic_tac_toe", seats="all")
    env.reset(seed=0)
    for k in range(3):
        out = env.step({"player_0": "I am not sure"})
    assert out["player_0"].terminated and out["player_0"].info["score"] == 0.0
    assert out["player_0"].info["forfeit"] == "player_0"
    assert out["player_1"].terminated and out["player_1"].info["score"] == 1.0
    assert not env.active_agents


def test_parse_action_follows_the_suite_order():
    legal, names = [0, 1, 2, 13], ["Fold", "Call", "Raise", "a3"]
    assert parse_action(" 2 ", legal, names) == 2
    assert parse_action("7", legal, names) is None  # a bare illegal number does not fall through
    assert parse_action("<think>maybe 1</think>I pick 13, then 2", legal, names) == 2  # legal-order, whole words
    assert parse_action("action 13", legal, names) == 13
    assert parse_action("I will call.", legal, names) == 1
    assert parse_action("play A-3!", legal, names) == 13  # letters and digits only
    assert parse_action("<think>2</think>", legal, names) is None
    assert parse_action("nothing", legal, names) is None
    assert parse_action("banana", [185], ["\u2660 \u2190 A\u2660"]) is None  # one letter is not a name


def test_task_ids_decode_to_the_suite_variants():
    t = decode_task(1 * 10**8 + 5)
    assert (t.game, t.params) == ("liars_dice", {"players": 2, "numdice": 5})
    assert decode_task(3).params["num_cards"] == 14  # goofspiel: 8 + 2 * (3 % 5)
    assert decode_task(task_id_for("hex", 2)).params == {"board_size": 9}
    assert decode_task(22 * 10**8).game == "goofspiel"  # the game index wraps around the list
    with pytest.raises(ValueError, match="task_id"):
        decode_task(-1)
    with pytest.raises(ValueError, match="unknown pyspiel game 'nope'"):
        OpenSpielEnv(game="nope")
    with pytest.raises(ValueError, match="seats"):
        OpenSpielEnv(game="kuhn_poker", seats=[0, 2])


def test_seat_comes_from_the_seed_and_mcts_opponent_plays():
    env = OpenSpielEnv(game="tic_tac_toe", opponent="mcts", mcts=(30, 2))
    seats = {s: env.reset(seed=s)["agent_0"][1]["seat"] for s in (4, 5)}
    assert seats == {4: 0, 5: 1}
    outcomes, _ = _play(env, 5, np.random.RandomState(0), bad_first=False)
    assert any(h["player"] == 0 for h in env.history) and outcomes["agent_0"].terminated


def test_simultaneous_self_play_waits_for_every_seat():
    env = OpenSpielEnv(task_id=task_id_for("goofspiel", 0), seats="all")
    env.reset(seed=2)
    assert env.active_agents == ["player_0", "player_1"]
    legal, _ = env.legal_lines(0)
    out = env.step({"player_0": str(legal[0])})
    assert env.active_agents == ["player_1"] and "Waiting" in out["player_0"].obs
    legal1, _ = env.legal_lines(1)
    env.step({"player_1": str(legal1[-1])})
    assert env.active_agents == ["player_0", "player_1"]
    assert [h["player"] for h in env.history if h["player"] >= 0][:2] == [0, 1]


def test_env_spec_builds_it_by_name():
    from ludic.envs.registry import make_env
    from ludic.types import EnvSpec

    env = make_env(EnvSpec("openspiel", {"task_id": task_id_for("leduc_poker"), "opponent": "random"}))
    assert env.game_name == "leduc_poker" and env.agent_ids == ["agent_0"]


def test_a_reply_cut_by_the_token_limit_still_reaches_the_env(scripted, tokenizer):
    """The games agent answers in a few tokens; a cut reply is the env's to parse (3 attempts, then
    a forfeit), not an agent-side format failure retried until max_steps (60 model calls a game)."""
    import asyncio

    from ludic.recipes.games import TrainGamesConfig
    from ludic.recipes.games_setup import protocols
    from ludic.types import FinishReason

    client = scripted(["I think the best move here is"], tokenizer, finish=FinishReason.LENGTH)
    proto = protocols(client, TrainGamesConfig(), 1.0)["single_agent"]()
    [r] = asyncio.run(proto.run(OpenSpielEnv(game="kuhn_poker"), max_steps=60, env_seed=0))
    assert len(r.steps) == 3 and len(client.requests) == 3
    assert r.steps[-1].terminated and r.steps[-1].info["forfeit"] == "agent_0" and r.steps[-1].info["score"] == 0.0
