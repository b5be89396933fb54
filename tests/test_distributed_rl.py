"""GRPO under torchrun with two gloo processes equals one process on the same global batch,
including a step where one rank has no items at all (it must still join every collective and step)."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from safetensors.torch import load_file

from ludic.agents.agent import Agent
from ludic.context import FullDialog
from ludic.inference.client import SamplingParams
from ludic.inference.transformers_engine import TransformersEngine
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts.batch import build_saw_items
from ludic.rollouts.credit import GroupNormalizedReturn
from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
from ludic.training.lora import load_policy
from ludic.types import EnvSpec, RolloutRequest

WORKER = str(Path(__file__).with_name("dist_rl_worker.py"))


def _grpo_items(model_dir, n_groups=4, group_size=4):
    model, tok = load_policy(str(model_dir), dtype="float32", seed=0)
    engine = TransformersEngine(model, tok)

    def factory():
        agent = Agent(engine, FullDialog("Talk."), sampling=SamplingParams(temperature=1.0, max_tokens=6),
                      reject_incomplete=False)
        return SingleAgentProtocol(agent)

    reqs = GRPORequestStrategy(group_size, seed=1).expand([RolloutRequest(EnvSpec("test_vowels"), max_steps=1)] * n_groups)
    rollouts = asyncio.run(RolloutEngine({"single_agent": factory}).generate_rollouts(reqs))
    items = build_saw_items(rollouts, GroupNormalizedReturn())
    assert any(abs(it.weight) > 0 for it in items)
    return [it.to_dict() for it in items]


def _run(cmd, **env):
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=180)  # a rank left out of a collective hangs
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_two_process_grpo_matches_single_process_with_an_empty_rank(tiny_model_dir, tmp_path):
    items = _grpo_items(tiny_model_dir)
    steps = [[items[0:8], items[8:16]],   # both ranks have items
             [items[0:16], []]]           # rank 1 has none: it must still all-reduce and step
    path = tmp_path / "items.json"
    path.write_text(json.dumps(steps))
    one = _run([sys.executable, WORKER, str(path), str(tiny_model_dir), str(tmp_path / "one.safetensors")])
    two = _run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", "--master_port=29573", WORKER,
                str(path), str(tiny_model_dir), str(tmp_path / "two.safetensors")], OMP_NUM_THREADS="1")
    for m1, m2 in zip(one, two):
        assert m1["action_tokens"] == m2["action_tokens"]
        assert abs(m1["grad_norm"] - m2["grad_norm"]) < 1e-5 * max(1.0, m1["grad_norm"]), (m1, m2)
    a, b = load_file(str(tmp_path / "one.safetensors")), load_file(str(tmp_path / "two.safetensors"))
    assert a.keys() == b.keys() and a
    for k in a:  # lr 1e-2: a weight moved by Adam differs by at most a tiny fraction of one step
        diff = (a[k] - b[k]).abs()
        assert diff.max() < 5e-4 and diff.mean() < 1e-6, (k, float(diff.max()))
    assert any(a[k].abs().max() > 0 for k in a if "lora_B" in k)  # LoRA B starts at 0: training moved it
