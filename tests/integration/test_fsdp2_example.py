"""The FSDP2 math example on CPU: one vLLM server process + two FSDP2 training processes (gloo)."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

pytestmark = pytest.mark.integration
require("vllm")

EXAMPLE = Path(__file__).parents[2] / "examples" / "fsdp2_training" / "train_math_fsdp2.py"


def test_one_server_two_sharded_trainers(tmp_path):
    run = tmp_path / "run"
    out = subprocess.run([sys.executable, str(EXAMPLE), "--run-dir", str(run), "--train-steps", "2",
                          "--eval-limit", "4", "--prompts-per-step", "2", "--group-size", "2",
                          "--max-completion-tokens", "8", "--logger", "print"],
                         capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, (out.stdout[-3000:], out.stderr[-3000:])
    assert "2 FSDP2 processes (gloo)" in out.stdout
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2]
    assert metrics[-1]["policy_version"] == 3  # the starting weights, then one push per step
    # each rank sampled its own share of every step: 1 prompt x 2 samples x 2 steps per rank
    for name in ("rollouts.jsonl", "rollouts.rank1.jsonl"):
        rollouts = [json.loads(x) for x in (run / name).read_text().splitlines()]
        assert len(rollouts) == 4, name
        assert {v for r in rollouts[2:] for s in r["steps"] for v in (s["trace"] or {}).get("policy_versions", [])} == {2}
    pushed = sorted(p.name for p in (run / "weights").iterdir())
    assert pushed and pushed[-1].startswith("v0000003")  # rank 0 pushed the gathered, merged weights
    results = json.loads((run / "qa_results.json").read_text())
    assert set(results) >= {"before", "after", "accuracy_gain"} and results["after"]["records"] == 4
    assert (run / "checkpoints" / "latest.json").exists() and (run / "report.html").exists()
