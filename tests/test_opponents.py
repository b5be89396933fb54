"""Opponents a two-player policy never trained against (issue 38 part 3): a uniformly random legal player
where the game lists its legal moves, the game package's own bot, a league snapshot; wins by the opponent's
invalid move or forfeit reported apart from wins in play."""

import asyncio
import json

import pytest
from conftest import require

import ludic
from ludic.errors import TrainingStopped
from ludic.eval.opponents import legal_moves, random_legal_reply


def test_legal_moves_are_read_from_textarena_and_openspiel_observations():
    kuhn = "[GAME] ### Starting round 1 out of 1 rounds. Your card is: 'K'\n[GAME] Your available actions are: '[check]', '[bet]'"
    assert legal_moves(kuhn) == ["[check]", "[bet]"]
    ttt = "Available Moves: '[0]', '[4]', '[8]'"
    assert legal_moves(ttt) == ["[0]", "[4]", "[8]"]
    spiel = "Current State:\n...\nYou are Player 0.\nLegal Actions:\n0 -> Pass\n1 -> Bet\n\nYour choice (ID only):"
    assert legal_moves(spiel) == ["0", "1"]
    assert legal_moves("Connect four: enter a column like '[col 4]'.") is None
    pick = random_legal_reply(seed=3)
    replies = {pick([{"role": "user", "content": f"{kuhn}\n(game {i})"}]) for i in range(40)}
    assert replies == {"[check]", "[bet]"}  # uniform over the legal moves
    assert pick([{"role": "user", "content": kuhn}]) == pick([{"role": "user", "content": kuhn}])  # order-free


def test_a_win_by_the_opponents_invalid_move_is_counted_apart(tokenizer):
    """A random legal player against one that answers nonsense wins every game, all of them by forfeit: the
    summary says 0% in play."""
    require("textarena")
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.recipes.env_setup import EnvConfig, evaluate_episodes, eval_requests, probe_env, protocols

    opts = EnvConfig(env="textarena:KuhnPoker-v0", env_kwargs='{"max_rounds": 1}')
    env = probe_env(opts)
    greedy = SamplingParams(temperature=0.0, max_tokens=8)
    protos = protocols(FunctionClient(tokenizer, random_legal_reply(0)), opts, env, greedy,
                       FunctionClient(tokenizer, lambda messages: "I would rather not."), greedy)
    m = asyncio.run(evaluate_episodes(protos, eval_requests(opts, env, range(1_000_000_000, 1_000_000_008))))
    assert m["success_rate"] == 1.0 and m["forfeit_win_rate"] == 1.0 and m["play_win_rate"] == 0.0


@pytest.mark.slow
def test_a_two_player_run_is_measured_against_opponents_it_never_trained_against(tiny_model_dir, tmp_path):
    """``--opponent frozen``: the policy trains against its frozen start only; its test episodes also meet a
    random legal player and the snapshot of itself halfway through training (TextArena ships no bot), the start
    measured against the same opponents."""
    require("textarena")
    run = tmp_path / "run"
    out = ludic.train("textarena:KuhnPoker-v0", model=str(tiny_model_dir), run_dir=str(run), train_steps=2,
                      env_kwargs={"max_rounds": 1}, opponent="frozen", eval_episodes=4, val_episodes=2,
                      group_size=2, prompts_per_step=2, logger="none", dtype="float32", max_completion_tokens=6,
                      max_no_signal_steps=0)
    opp = out.results["opponents"]
    assert set(opp) == {"random", "league"} and set(opp["random"]) == {"base", "trained"}
    assert set(opp["league"]) == {"base", "trained"} and (run / "league_snapshot" / "adapter_config.json").exists()
    assert all("forfeit_win_rate" in m and "play_win_rate" in m for o in opp.values() for m in o.values())
    assert (run / "eval_trained_vs_random.jsonl").exists() and out.results["trained"]["episodes"] == 4
    assert out.results["league_snapshot"] == {"step": 1, "steps_run": 2, "how": "half the 2 steps"}


@pytest.mark.slow
def test_a_two_player_run_that_stops_before_half_its_steps_still_meets_a_league_snapshot(tiny_model_dir, tmp_path):
    """A run that stops early (here: no learning signal for 3 steps of a 40-step run, before the halfway
    snapshot) is measured against the snapshot nearest half the steps it ran (kept at steps 1, 2, 4, ...), and
    says which step that was; the candidates are cleared once the snapshot is chosen."""
    require("textarena")
    run = tmp_path / "run"
    with pytest.raises(TrainingStopped):  # a failure (it never learned), whose summary is kept
        ludic.train("textarena:KuhnPoker-v0", model=str(tiny_model_dir), run_dir=str(run), train_steps=40,
                    env_kwargs={"max_rounds": 1}, opponent="frozen", eval_episodes=4, val_episodes=2,
                    group_size=2, prompts_per_step=2, logger="none", dtype="float32", max_completion_tokens=6,
                    max_no_signal_steps=3)
    results = json.loads((run / "summary.json").read_text())
    assert results["stopped"]["step"] == 3, results["stopped"]  # the tiny model's replies are all invalid
    opp = results["opponents"]
    assert set(opp["league"]) == {"base", "trained"}
    snap = results["league_snapshot"]
    assert snap["step"] in (1, 2) and snap["steps_run"] == 3 and "stopped" in snap["how"], snap
    assert (run / "league_snapshot" / "adapter_config.json").exists() and not (run / "league_candidates").exists()


def test_a_resumed_run_with_its_league_snapshot_makes_no_candidates_folder(tmp_path):
    """Found in the study's resumed runs: a run resumed after its halfway snapshot was taken left an empty
    ``league_candidates/`` beside it (the candidates' League made its folder before the snapshot was looked for)."""
    from ludic.recipes.env_setup import LEAGUE_DIR, HalfwaySnapshot

    (tmp_path / LEAGUE_DIR).mkdir()
    (tmp_path / LEAGUE_DIR / HalfwaySnapshot.INFO).write_text(json.dumps({"step": 30, "how": "half the budget"}))
    snap = HalfwaySnapshot(tmp_path)
    snap.on_step(None, 64, "")  # taken: nothing more is kept
    snap.at_stop(60)
    assert snap.record == {"step": 30, "how": "half the budget", "steps_run": 60}
    assert not (tmp_path / "league_candidates").exists()


@pytest.mark.slow
def test_an_openspiel_game_meets_the_packages_own_bot(tiny_model_dir, tmp_path):
    require("pyspiel")
    out = ludic.train("openspiel", model=str(tiny_model_dir), run_dir=str(tmp_path / "run"), train_steps=1,
                      env_kwargs={"game": "kuhn_poker", "seats": "all"}, opponent="frozen", eval_episodes=4,
                      val_episodes=2, group_size=2, prompts_per_step=2, logger="none", dtype="float32",
                      max_completion_tokens=4, max_no_signal_steps=0)
    assert {"random", "bot"} <= set(out.results["opponents"])
    assert out.results["opponents"]["bot"]["trained"]["episodes"] == 4
