"""SFT under torchrun with two gloo processes equals one process on the same global batch."""

import json
import os
import subprocess
import sys

import torch
from safetensors.torch import load_file

from ludic.data.jsonl import write_jsonl


def _records(n=8):
    return [{"messages": [{"role": "system", "content": "Play."}, {"role": "user", "content": f"Board {i}"}],
             "completion": f"<think>t{i}</think><move>B{i % 3 + 1}</move>"} for i in range(n)]


def _run(cmd, env=None):
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return out


def test_two_process_sft_matches_single_process(tiny_model_dir, tmp_path):
    data = tmp_path / "sft.jsonl"
    write_jsonl(data, _records())
    common = ["--model", str(tiny_model_dir), "--data", str(data), "--max-steps", "2", "--lr", "1e-3",
              "--logger", "none", "--no-resume", "--lr-schedule", "constant", "--dtype", "float32"]
    _run([sys.executable, "-m", "ludic", "sft", *common, "--batch-size", "4", "--run-dir", str(tmp_path / "one")])
    _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29571",
          "-m", "ludic", "sft", *common, "--batch-size", "2", "--run-dir", str(tmp_path / "two")],
         env={"OMP_NUM_THREADS": "1"})
    one = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    base = load_file(str(tiny_model_dir / "model.safetensors"))
    assert one.keys() == two.keys()
    changed = 0
    for k in one:
        # Adam divides by sqrt(v): where a gradient is ~0, summation-order noise (1e-9) can move one
        # weight by a visible fraction of lr. So: every weight within 5% of one lr step, and on average ~equal.
        diff = (one[k].float() - two[k].float()).abs()
        assert diff.max() < 5e-5 and diff.mean() < 1e-7, (k, float(diff.max()), float(diff.mean()))
        changed += not torch.equal(one[k].float(), base[k].float())
    assert changed > 0
    logs = list((tmp_path / "two").glob("sft_training_logs_*.txt"))
    assert len(logs) == 1  # only rank 0 logs
    assert json.loads((tmp_path / "two" / "config.json").read_text())["batch_size"] == 2
