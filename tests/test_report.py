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
