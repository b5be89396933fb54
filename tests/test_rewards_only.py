"""Tic-tac-toe from rewards alone (issue 39): ``ludic recipe tictactoe --teacher none`` shows the policy no
solver-chosen move anywhere. Its format cold start answers each position with a uniformly random legal cell,
and RL trains on the policy's own samples scored by the solver."""

import json
import math
import statistics

import ludic.tictactoe.board as ttt


def _board(record):
    """The position a cold-start record asks about (its meta keeps it)."""
    return tuple(record["meta"]["board"])


def test_rewards_only_shows_the_policy_no_solver_move(tiny_model_dir, tmp_path):
    from ludic.tictactoe.recipe import RecipeConfig, recipe

    run = tmp_path / "run"
    report = recipe(RecipeConfig(model=str(tiny_model_dir), run_dir=str(run), teacher="none", budget_minutes=0,
                                 sft_steps=3, sft_batch_size=8, curve_points=2, rl_rounds=1, rl_steps_per_round=1,
                                 positions_per_step=3, group_size=2, logger="none"))
    assert json.loads((run / "config.json").read_text())["teacher"] == "none"
    assert report["teacher"] == "none" and set(report["results"]) == {"base", "sft", "rl"}
    records = [json.loads(line) for line in (run / "sft" / "records.jsonl").read_text().splitlines()]
    assert len(records) >= 335
    best = expected = 0.0
    for r in records:  # every reply a legal cell; best moves no more often than a uniform choice gives them
        board = _board(r)
        legal = ttt.legal_moves(board)
        move = ttt.parse_coord(r["completion"])
        assert move in legal, r["completion"]
        best += move in ttt.best_moves(board)
        expected += len(ttt.best_moves(board)) / len(legal)
    n, p = len(records), expected / len(records)
    assert abs(best / n - p) <= 4 * math.sqrt(p * (1 - p) / n), (best / n, p)
    rl = [json.loads(line) for line in (run / "rl" / "rollouts.jsonl").read_text().splitlines()]
    assert rl and all(v >= 0 for r in rl for s in r["steps"] for v in s["trace"]["policy_versions"])  # sampled
    assert statistics.fmean(len(s["trace"]["completion_ids"]) for r in rl for s in r["steps"]) > 0


def test_the_solver_mode_writes_its_teacher_records_too(tiny_model_dir, tmp_path):
    """The default (``--teacher solver``): the same records file holds the solver's move per position."""
    from ludic.tictactoe.recipe import RecipeConfig, recipe

    run = tmp_path / "run"
    recipe(RecipeConfig(model=str(tiny_model_dir), run_dir=str(run), teacher="solver", budget_minutes=0, sft_steps=1,
                        sft_batch_size=4, curve_points=2, rl_rounds=0, max_rl_rounds=1, rl_steps_per_round=1,
                        positions_per_step=2, group_size=2, logger="none", eval_base=False))
    records = [json.loads(line) for line in (run / "sft" / "records.jsonl").read_text().splitlines()]
    assert len(records) == 335 and all(ttt.parse_coord(r["completion"]) in ttt.best_moves(_board(r)) for r in records)
