"""report.html from a run directory's files (the browser test loads one in Chromium)."""

import json

from ludic.report import build_report


def _write(path, rows):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_a_multi_stage_run_gets_one_page_with_every_stage(tmp_path):
    run = tmp_path / "recipe"
    run.mkdir()
    (run / "config.json").write_text("{}")
    (run / "report.json").write_text(json.dumps({"results": {"rl": {"minimax_non_loss": 0.943}}}))
    _write(run / "sft" / "metrics.jsonl", [{"step": i, "loss": 1.0 / i} for i in range(1, 6)])
    _write(run / "rl" / "metrics.jsonl", [{"step": i, "reward_mean": 0.1 * i} for i in range(1, 4)])
    _write(run / "rl" / "rollouts.jsonl", [{"id": "r1", "total_reward": 1.0, "meta": {"env_kind": "tictactoe"},
                                            "steps": [{"prev_obs": "KNOWN-BOARD", "action": "B2", "reward": 1.0}]}])
    page = build_report(run).read_text()
    assert "minimax_non_loss" in page and "0.943" in page
    assert "Stage sft" in page and "Stage rl" in page and "href='rl/report.html'" in page
    assert page.count('<circle class="pt"') == 5 + 3  # sft/loss and rl/reward_mean, one point per row
    assert "KNOWN-BOARD" in page  # the last stage's trajectories


def test_tinker_results_are_a_table(tmp_path):
    (tmp_path / "tinker_results.json").write_text(json.dumps({"after": {"win_rate": 0.25}}))
    assert "after.win_rate" in build_report(tmp_path).read_text()


def test_per_stage_results_become_one_column_per_stage(tmp_path):
    (tmp_path / "qa_results.json").write_text(json.dumps(
        {"before": {"accuracy": 0.07, "records": 100}, "after": {"accuracy": 0.33, "records": 100}, "accuracy_gain": 0.26}))
    page = build_report(tmp_path).read_text()
    assert "<th>before</th><th>after</th>" in page
    assert "<tr><td>accuracy</td><td>0.07</td><td>0.33</td></tr>" in page and "accuracy_gain" in page


def test_the_report_leads_with_the_headline_and_folds_the_raw_results(tmp_path):
    """The page opens on the headline score per stage with its interval, then curves, trajectories and
    config; the raw results come last, folded."""
    import json

    from ludic.report import build_report

    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps({"step": i, "reward_mean": i / 10}) + "\n" for i in range(3)))
    stage = {"success_rate": 0.25, "success_ci95_low": 0.15, "success_ci95_high": 0.38, "episodes": 64}
    (tmp_path / "summary.json").write_text(json.dumps({
        "base": stage, "trained": {**stage, "success_rate": 0.5},
        "kept": {"step": 20, "last_step": 30, "metric": "success_rate"},
        "headline": {"metric": "success_rate", "stages": {
            "base": {"value": 0.25, "low": 0.15, "high": 0.38, "n": 64},
            "trained": {"value": 0.5, "low": 0.38, "high": 0.62, "n": 64}}}}))
    page = build_report(tmp_path).read_text()
    order = [page.index(h) for h in ("Headline: success_rate", "Learning curves", "Sample trajectories", "<h2>Config",
                                     "<h2>Evaluation")]
    assert order == sorted(order)
    assert "50.0%" in page and "38.0% - 62.0%" in page and "Kept weights: step 20 of 30" in page
    assert page.index("<details><summary>every result") > page.index("<h2>Evaluation")


# ---------------------------------------------------------------- behaviour: curves by importance, the viewer, games

def _rollout(instance, success, *, seed=0, parse=False, prompt=None, reply="<answer>7</answer>"):
    """A ``Rollout.to_dict`` row of one turn (``instance`` None: only the env seed names it)."""
    reset = {"instance": instance} if instance is not None else {}
    info = {"success": float(success), "parse_error": parse, "reference": "7"}
    return {"id": f"r-{instance}-{seed}", "total_reward": float(success),
            "meta": {"reset_info": reset, "env_seed": seed, "env_kind": "qa"},
            "steps": [{"index": 0, "prev_obs": prompt or f"QUESTION {instance} seed {seed}", "action": reply,
                       "parsed_action": None if parse else "7", "next_obs": None, "reward": float(success),
                       "terminated": True, "truncated": False, "info": info, "trace": None}]}


BASE_OK = {"q0": True, "q1": False, "q2": False, "q3": False, "q4": False}
TRAINED_OK = {"q0": True, "q1": True, "q2": True, "q3": False, "q5": True}


def write_behaviour_run(run):
    """A run directory as ``ludic train env`` writes it, by hand: curves with a negative series and a constant
    one, 6 training episodes, eval_base and eval_trained on instances q0-q3 (in other orders), q4 in base only,
    q5 in trained only, and one instance named by its env seed alone (seed 77) in both."""
    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text("{}")
    _write(run / "metrics.jsonl", [
        {"step": i, "step_s": 10.0 + i % 2, "stale_dropped": 0.0, "policy_loss": -0.00123 - 0.01 * i,
         "success_rate": 0.1 * i, "reward_mean": 0.2 * i, "zz_custom": i * i, "grad_norm": 1.0 + i}
        for i in range(1, 5)] + [{"step": s, "eval/success_rate": v} for s, v in ((0, 0.2), (4, 0.6))])
    _write(run / "rollouts.jsonl", [_rollout(f"t{i}", i % 3 == 0, seed=100 + i, parse=i == 4) for i in range(6)])
    _write(run / "eval_base.jsonl", [_rollout(k, ok, seed=i, parse=k == "q3", reply=f"BASE-REPLY-{k}")
                                     for i, (k, ok) in enumerate(BASE_OK.items())] + [_rollout(None, False, seed=77)])
    _write(run / "eval_trained.jsonl", [_rollout(None, True, seed=77)] + [
        _rollout(k, ok, seed=i, reply=f"TRAINED-REPLY-{k}") for i, (k, ok) in reversed(list(enumerate(TRAINED_OK.items())))])
    return run


def test_curves_come_by_importance_and_constant_series_fold_last(tmp_path):
    import re

    page = build_report(write_behaviour_run(tmp_path / "run")).read_text()
    metrics = re.findall(r'<svg class="plot" data-metric="([^"]+)"', page)
    assert metrics[:4] == ["eval/success_rate", "success_rate", "reward_mean", "policy_loss"], metrics
    assert metrics.index("grad_norm") < metrics.index("zz_custom") < metrics.index("step_s")  # timings last
    assert metrics[-1] == "stale_dropped" and page.index("<details class='flat'>") < page.index('data-metric="stale_dropped"')
    assert "1 constant series" in page and "stale_dropped = 0" in page


def test_negative_axis_labels_keep_their_minus_sign_inside_the_plot():
    """The y labels are anchored at their end, left of the frame: the margin must hold the longest one, or its first
    character (a minus sign) is cut at the SVG's edge (the browser test measures it)."""
    import re

    from ludic.report import svg_plot

    svg = svg_plot("policy_loss", [(1, -0.00123), (2, -0.0456), (3, -1.5e-05)])
    found = re.findall(r'<text x="([\d.]+)" y="\d+" class="ax (y[01])"[^>]*>([^<]+)</text>', svg)
    labels = {cls: (float(x), text) for x, cls, text in found}
    assert labels["y0"][1] == "-0.0456" and labels["y1"][1] == "-1.5e-05"
    for x, text in labels.values():
        assert x >= 6.5 * len(text)  # room for the whole label at ~6.5 px a character (10 px font)
    near = svg_plot("logp", [(1, -10.7937), (2, -10.7737)])
    assert ">-10.79<" in near and ">-10.77<" in near  # both ends print apart


def test_the_viewer_embeds_episodes_with_their_stage_outcome_and_instance(tmp_path):
    import re

    page = build_report(write_behaviour_run(tmp_path / "run")).read_text()
    eps = re.findall(r'<details class="ep" data-stage="([^"]+)" data-outcome="(\w+)" data-parse="(\d)" data-key="([^"]*)"',
                     page)
    assert len(eps) == 6 + 6 + 6
    assert sorted(k for s, o, _, k in eps if s == "eval_trained" and o == "success") == ["q0", "q1", "q2", "q5", "seed 77"]
    assert [k for s, _, p, k in eps if p == "1"] == ["t4", "q3"]
    assert "BASE-REPLY-q0" in page and "TRAINED-REPLY-q2" in page and "18 of the 18 episodes" in page
    assert "<option value=\"eval_base\" selected>" in page and "<option value=\"eval_trained\" selected>" in page
    assert "No rollouts.jsonl" not in page and "<script>" in page


def test_the_page_stays_bounded_and_keeps_the_pairs(tmp_path, monkeypatch):
    """Past MAX_EPISODES the files share the cap; the instances two evaluations share come first, so the side by
    side view keeps its pairs; training episodes are taken evenly through the file; the page says so."""
    import re

    from ludic import report_viewer

    monkeypatch.setattr(report_viewer, "MAX_EPISODES", 30)
    run = tmp_path / "run"
    _write(run / "rollouts.jsonl", [_rollout(f"t{i}", False, seed=i) for i in range(500)])
    _write(run / "eval_base.jsonl", [_rollout(f"only-base-{i}", False, seed=i) for i in range(40)]
           + [_rollout(f"shared-{i}", False, seed=i) for i in range(5)])
    _write(run / "eval_trained.jsonl", [_rollout(f"shared-{i}", True, seed=i) for i in range(5)])
    page = build_report(run).read_text()
    eps = re.findall(r'<details class="ep" data-stage="([^"]+)" data-outcome="\w+" data-parse="\d" data-key="([^"]*)"', page)
    assert len(eps) == 30 and "30 of the 550 episodes" in page and "at most 30 are embedded" in page
    keys = {s: [k for st, k in eps if st == s] for s in ("training", "eval_base", "eval_trained")}
    assert len(keys["eval_trained"]) == 5 and {f"shared-{i}" for i in range(5)} <= set(keys["eval_base"])
    assert keys["training"][0] == "t0" and keys["training"][-1] == "t499"  # spread over the whole run


def _png() -> bytes:
    import struct
    import zlib

    def chunk(kind, data):
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 1, 1, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\x00\x80")) + chunk(b"IEND", b""))


def write_recipe_run(run):
    """The tic-tac-toe recipe's layout, by hand: no top-level metrics, sft/ with curves, rl/ that logged no step
    (its goal was met before the first RL batch), exact-evaluation decisions of a solver policy, games.jsonl."""
    from ludic.tictactoe.board import best_moves, coord, is_over, reachable_positions
    from ludic.tictactoe.positions import board_to_string
    from ludic.tictactoe.showcase import write_games

    run.mkdir(parents=True, exist_ok=True)
    (run / "config.json").write_text("{}")
    stage = {"minimax": {"non_loss_rate": 1.0}, "random": {"non_loss_rate": 1.0}, "teacher_positions": {"legal_rate": 1.0}}
    (run / "report.json").write_text(json.dumps({"results": {"base": stage, "sft": stage, "rl": stage}, "rl_steps": 0,
                                                 "rl_stopped": "goal", "rl_last_round": {}}))
    (run / "learning_curves.png").write_bytes(_png())
    _write(run / "sft" / "metrics.jsonl", [{"step": i, "loss": 1.0 / i} for i in range(1, 4)])
    (run / "rl").mkdir()
    (run / "rl" / "metrics.jsonl").write_text("")
    perfect = [{"board": board_to_string(b), "observation": f"BOARD {board_to_string(b)}", "completion": coord(best_moves(b)[0]),
                "action": coord(best_moves(b)[0]), "move": best_moves(b)[0], "optimal": True, "value_preserving": True}
               for b in reachable_positions() if not is_over(b)]
    for name in ("base", "rl"):
        _write(run / f"decisions_{name}_minimax.jsonl", perfect)
    write_games(run, ["base", "sft", "rl"])
    return run


def test_the_recipe_layout_shows_its_picture_games_decisions_and_why_rl_is_empty(tmp_path):
    page = build_report(write_recipe_run(tmp_path / "recipe")).read_text()
    assert "<img src='data:image/png;base64," in page and "learning_curves.png" in page
    assert "No rollouts.jsonl" not in page
    assert "This stage logged no step" in page and "rl_stopped = goal" in page and "rl_steps = 0" in page
    assert 'data-stage="decisions_rl_minimax"' in page and "BOARD X........" in page
    assert '<option value="decisions_base_minimax" selected>' in page and '<option value="decisions_rl_minimax" selected>' in page
    assert "<h2>Games</h2>" in page and page.count("<table class='board'>") > 10
    games = (tmp_path / "recipe" / "games.jsonl").read_text().splitlines()
    assert len(games) >= 4 and page.count("<div class='game' data-outcome='draw'>") == len(games)  # a perfect policy draws
    assert page.index("<h2>Games</h2>") < page.index("<h2>Sample trajectories</h2>")


def test_qa_outcome_records_are_one_turn_episodes_and_other_rows_are_skipped(tmp_path):
    """``ludic train qa`` writes outcome records (question, reply, correct) to eval_<stage>.jsonl; before/after pair."""
    import re

    rec = {"id": 3, "correct": True, "parsed": "Paris", "reply": "<answer>Paris</answer>", "reference": "Paris",
           "tool_calls": 0, "failed": False, "parse_error": False, "question": "Capital of France?"}
    _write(tmp_path / "eval_before.jsonl", [{**rec, "correct": False, "reply": "Lyon"}, {"something": "else"}])
    _write(tmp_path / "eval_after.jsonl", [rec])
    page = build_report(tmp_path).read_text()
    eps = re.findall(r'<details class="ep" data-stage="([^"]+)" data-outcome="(\w+)" data-parse="\d" data-key="([^"]*)"', page)
    assert eps == [("eval_after", "success", "Capital of France?"), ("eval_before", "failure", "Capital of France?")]
    assert '<option value="eval_before" selected>' in page and '<option value="eval_after" selected>' in page
    assert "&lt;answer&gt;Paris&lt;/answer&gt;" in page and "2 of the 2 episodes" in page
