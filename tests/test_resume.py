"""Exact, crash-safe resume: a run stopped after step k and resumed equals an uninterrupted run, and a
crash at any point of a checkpoint write leaves a loadable latest checkpoint."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import vowel_grpo_trainer

from ludic.rollouts.engine import read_rollouts
from ludic.training.checkpoint import latest_checkpoint, load_checkpoint
from ludic.training.lora import LoraSettings, load_policy
from ludic.training.trainer import TrainerConfig

WORKER = str(Path(__file__).with_name("ckpt_crash_worker.py"))
FAULT_POINTS = ("tmp_written", "renamed", "pointer_tmp", "pointed", "pruning", "old_moved")
"""Where save_checkpoint can die: files written under a temporary name; step folder renamed into place;
new pointer written under a temporary name; pointer replaced; old checkpoints half pruned; and, when a
step is saved again (the final save after a periodic one), the old folder moved aside."""


def _run(model_dir, run_dir):
    """A fresh GRPO run (new model, engine, source, trainer), as a restarted process would build it.

    env_seed is None in the requests: the strategy draws env and sampling seeds from its RNG."""
    torch.manual_seed(1234)  # whatever the process did before must not matter after a resume
    model, _, trainer = vowel_grpo_trainer(model_dir, run_dir, TrainerConfig(lr=5e-2, checkpoint_every=1,
                                                                            max_to_keep=5), max_tokens=6, strategy_seed=7)
    return model, trainer


def _seeds(run_dir):
    return [(r.meta["env_seed"], r.meta["sampling_seed"], r.meta["group_id"]) for r in read_rollouts(run_dir / "rollouts.jsonl")]


def _lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_stopped_and_resumed_run_equals_uninterrupted_run(tiny_model_dir, tmp_path):
    straight = tmp_path / "straight"
    model_a, trainer_a = _run(tiny_model_dir, straight)
    asyncio.run(trainer_a.train(4))

    split = tmp_path / "split"
    _, trainer_b = _run(tiny_model_dir, split)
    asyncio.run(trainer_b.train(2))
    del trainer_b
    model_c, trainer_c = _run(tiny_model_dir, split)  # "restart the process"
    assert trainer_c.resume() and trainer_c.step == 2
    asyncio.run(trainer_c.train(4))

    assert _seeds(split) == _seeds(straight)  # the same env and sampling seeds, episode by episode
    a, c = _lora(model_a), _lora(model_c)
    for k in a:
        assert torch.allclose(a[k], c[k], atol=1e-6, rtol=0), (k, float((a[k] - c[k]).abs().max()))


def test_a_torn_latest_pointer_falls_back_to_the_newest_complete_checkpoint(tmp_path):
    (tmp_path / "step_000001").mkdir()
    (tmp_path / "step_000001" / "trainer_state.json").write_text("{}")
    (tmp_path / "latest.json").write_text('{"last_checkpoint": "step_0000')  # a crash mid-write
    assert latest_checkpoint(tmp_path) == tmp_path / "step_000001"


def _worker(model_dir, run_dir, steps, **env):
    return subprocess.run([sys.executable, WORKER, str(model_dir), str(run_dir), str(steps)], capture_output=True,
                          text=True, env={**os.environ, **env}, timeout=300)


@pytest.mark.parametrize("point", FAULT_POINTS)
def test_a_crash_at_any_point_of_a_checkpoint_write_leaves_a_loadable_checkpoint(tiny_model_dir, tmp_path, point):
    # steps 1-2 are saved normally; a save of step 3 (which also prunes step 1) dies at `point`
    # ("old_moved": the final save of step 3, after the periodic one)
    out = _worker(tiny_model_dir, tmp_path, 3, LUDIC_FAULT_AT=point, LUDIC_FAULT_STEP="3")
    assert out.returncode == 86, (point, out.returncode, out.stderr[-2000:])
    ckpt = latest_checkpoint(tmp_path / "ckpt")
    assert ckpt is not None
    model, _ = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    state = load_checkpoint(ckpt, model=model)
    assert state["step"] in (2, 3)
    again = _worker(tiny_model_dir, tmp_path, 4)  # the next start resumes and finishes
    assert again.returncode == 0, again.stderr[-2000:]
    lines = [json.loads(x) for x in again.stdout.splitlines() if x.startswith("{")]
    assert lines[0]["resumed_at"] == state["step"] and lines[-1]["step"] == 4


def test_a_checkpoint_is_on_disk_before_anyone_hears_of_it(tiny_model_dir, tmp_path, monkeypatch):
    """Every file of a checkpoint, its folder and the folder holding it (for the renames) are fsynced
    before ``save_checkpoint`` returns: the pipeline acknowledges entries (XACK, fsynced by Redis) right
    after, so a power cut must not leave acknowledged entries whose checkpoint never reached the disk."""
    from ludic.training.checkpoint import save_checkpoint

    synced: list[str] = []
    real = os.fsync

    def recording(fd):
        synced.append(os.path.realpath(f"/proc/self/fd/{fd}"))
        return real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32")
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    final = save_checkpoint(tmp_path / "ckpt", 3, model=model, optimizer=opt, tokenizer=tok, state={"x": 1})
    files = {os.path.realpath(p) for p in final.rglob("*") if p.is_file()}
    dirs = {os.path.realpath(p) for p in [final, *final.rglob("*")] if p.is_dir()}
    # written inside the temporary folder, then renamed: compare names relative to the step folder
    rel = lambda p: os.path.relpath(p.replace(".tmp_step_000003", "step_000003").replace(".json.tmp", ".json"),  # noqa: E731
                                    tmp_path)
    done = {rel(p) for p in synced}
    assert {rel(p) for p in files} <= done, sorted({rel(p) for p in files} - done)
    assert {rel(p) for p in dirs} <= done and "ckpt" in done, sorted(done)
    assert "ckpt/latest.json" in done
