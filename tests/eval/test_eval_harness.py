"""``ludic eval env --samples K`` on the tiny model (K samples per held-out instance in a run folder, pass@k with
intervals) and ``ludic eval rescore`` of its samples with reward functions defined here (module-level, importable
by ``module:function`` with this folder on PYTHONPATH)."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ENV = ("--env", "reasoning_gym:gcd", "--env-kwargs", '{"config": {"max_value": 20}}')


def even_length(reply: str, info: dict) -> bool:
    """A reward function for the test: success when the reply has an even number of characters."""
    return len(reply) % 2 == 0


def graded_by_rollout(reply: str, info: dict, rollout) -> dict:
    """A reward function that reads the whole episode: its reward is the problem's index, its success the
    reference's presence."""
    return {"reward": float(rollout.meta["problem"]), "success": "reference" in info}


def ludic(*args, cwd, extra_path=""):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (extra_path, os.environ.get("PYTHONPATH", "")) if p)}
    proc = subprocess.run([sys.executable, "-m", "ludic", *args], capture_output=True, text=True, timeout=900,
                          cwd=cwd, env=env)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    return proc


def _pass_at_k_by_hand(records, k):
    from math import comb

    by = {}
    for r in records:
        by.setdefault(r["meta"]["problem"], []).append(r["steps"][-1]["info"]["success"] >= 1.0)
    return sum(1 - comb(len(v) - sum(v), k) / comb(len(v), k) for v in by.values()) / len(by)


@pytest.mark.slow
def test_eval_env_samples_k_per_instance_into_a_run_folder_and_rescore_them(tiny_model_dir, tmp_path):
    from conftest import require

    require("reasoning_gym")
    proc = ludic("eval", "env", *ENV, "--model", str(tiny_model_dir), "--episodes", "3", "--samples", "4",
                 "--temperature", "1", "--max-completion-tokens", "8", "--dtype", "float32", cwd=tmp_path)
    (run,) = (tmp_path / "runs").glob("eval-*")
    records = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert len(records) == 3 * 4
    assert sorted((r["meta"]["problem"], r["meta"]["sample"]) for r in records) == [(p, j) for p in range(3)
                                                                                     for j in range(4)]
    assert len({r["meta"]["sampling_seed"] for r in records}) == 12  # each sample its own seed
    assert all(len({r["meta"]["env_seed"] for r in records if r["meta"]["problem"] == p}) == 1 for p in range(3))
    summary = json.loads((run / "summary.json").read_text())
    assert summary["problems"] == 3 and summary["samples"] == 4 and summary["episodes"] == 12
    passes = [summary[f"pass@{k}"] for k in (1, 2, 4)]
    assert passes == sorted(passes) and "pass@3" not in summary  # pass@k does not fall with k
    for k in (1, 2, 4):
        assert summary[f"pass@{k}_ci95_low"] <= summary[f"pass@{k}"] <= summary[f"pass@{k}_ci95_high"]
        assert summary[f"pass@{k}"] == pytest.approx(_pass_at_k_by_hand(records, k))
    assert summary["pass@1"] == pytest.approx(summary["success_rate"]) and summary["config"]["samples"] == 4
    assert "3 problems x 4 samples: pass@1" in proc.stdout and f"{run.name}/samples.jsonl" in proc.stdout
    assert "WARNING: --samples" not in proc.stdout  # temperature 1: no identical-samples warning

    proc = ludic("eval", "rescore", str(run), "--reward", "test_eval_harness:even_length", cwd=tmp_path,
                 extra_path=str(HERE))
    out = run / "samples.rescored-even_length.jsonl"
    rescored = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rescored) == 12 and all(r["meta"]["rescored"]["reward_fn"] == "test_eval_harness:even_length"
                                       for r in rescored)
    for before, after in zip(records, rescored):
        want = float(len(before["steps"][-1]["action"]) % 2 == 0)
        assert after["steps"][-1]["reward"] == after["total_reward"] == want
        assert after["steps"][-1]["info"]["success"] == want
        assert after["meta"]["rescored"]["reward"] == before["total_reward"]
    again = json.loads((run / "samples.rescored-even_length.summary.json").read_text())
    assert again["success_rate"] == pytest.approx(sum(r["total_reward"] for r in rescored) / 12)
    for k in (1, 2, 4):
        assert again[f"pass@{k}"] == pytest.approx(_pass_at_k_by_hand(rescored, k))
    assert again["pass@1"] <= again["pass@2"] <= again["pass@4"]
    assert again["original"]["pass@4"] == summary["pass@4"] and "stored scores" in proc.stdout

    from ludic.eval.rescore import RescoreConfig, rescore  # in-process, a function of the whole rollout

    m = rescore(RescoreConfig(source=str(run / "samples.jsonl"), reward="test_eval_harness:graded_by_rollout",
                              out=str(tmp_path / "by_rollout.jsonl")))
    assert m["success_rate"] == 1.0 and m["reward_mean"] == pytest.approx(1.0)  # problems 0, 1, 2
    assert (tmp_path / "by_rollout.summary.json").exists()


@pytest.mark.slow
def test_eval_env_warns_that_greedy_samples_are_identical_and_takes_out(tiny_model_dir, tmp_path):
    from conftest import require

    require("reasoning_gym")
    out = tmp_path / "greedy.jsonl"
    proc = ludic("eval", "env", *ENV, "--model", str(tiny_model_dir), "--episodes", "2", "--samples", "2",
                 "--max-completion-tokens", "6", "--dtype", "float32", "--out", str(out), cwd=tmp_path)
    assert "WARNING: --samples 2 at --temperature 0" in proc.stdout and not (tmp_path / "runs").exists()
    records = [json.loads(line) for line in out.read_text().splitlines()]
    replies = {}
    for r in records:
        replies.setdefault(r["meta"]["problem"], set()).add(r["steps"][-1]["action"])
    assert len(records) == 4 and all(len(v) == 1 for v in replies.values())  # greedy: the samples are alike
    summary = json.loads((tmp_path / "greedy.summary.json").read_text())
    assert summary["pass@2"] == summary["pass@1"] == summary["success_rate"]


def test_rescore_names_a_wrong_reward_or_source(tmp_path):
    from ludic.errors import UsageError
    from ludic.eval.rescore import RescoreConfig, rescore

    (tmp_path / "eval_base.jsonl").write_text("")
    with pytest.raises(UsageError, match="has no samples.jsonl; name one of its rollout files: eval_base.jsonl"):
        rescore(RescoreConfig(source=str(tmp_path), reward="test_eval_harness:even_length"))
    with pytest.raises(UsageError, match="cannot import 'no_such_rewards'"):
        rescore(RescoreConfig(source=str(tmp_path / "eval_base.jsonl"), reward="no_such_rewards:f"))
    with pytest.raises(UsageError, match="module:function"):
        rescore(RescoreConfig(source=str(tmp_path / "eval_base.jsonl"), reward="even_length"))
