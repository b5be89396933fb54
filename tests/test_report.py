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
