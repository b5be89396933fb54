"""The CUDA paths, on a machine with a GPU (marked ``gpu``; skipped where PyTorch sees none, as on CI's
CPU machines: run them with ``pytest -m gpu tests/gpu`` on a GPU machine).

The same code as on CPU, on the device a GPU user gets by default (``device="auto"``): the policy loads
on the GPU, the in-process engine samples there (stock transformers code: the hand-written fast path is
CPU-only), the trainer steps there, a bf16 / fp16 model trains through fp32 masters, checkpoints resume,
and FSDP2 shards over NCCL. The tiny random model only: no model hub, and the packaged model is too
large to carry to a lent GPU machine (``LUDIC_CACHE`` there holds the tiny model this suite builds).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from conftest import VowelEnv, vowel_grpo_items

from ludic.types import SAWBatch, SAWItem

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (run on a GPU machine)")]


class Fixed:
    """A batch source that serves the same items (the trainer is driven by ``optimize`` here)."""

    def __init__(self, items):
        self.items = items

    async def next_batch(self):
        return SAWBatch(items=self.items, meta={})


@pytest.fixture(scope="module")
def tiny():
    from ludic.inference.models import cache_dir, make_tiny_model

    return str(make_tiny_model(cache_dir() / "models" / "tiny-random-llama"))


def _sft_items(n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [SAWItem(tuple(torch.randint(5, 500, (8,), generator=g).tolist()),
                    tuple(torch.randint(5, 500, (4,), generator=g).tolist()), 1.0) for _ in range(n)]


def test_auto_device_is_the_gpu_and_auto_dtype_bf16(tiny, monkeypatch):
    from ludic.inference.models import resolve_device
    from ludic.training.lora import LoraSettings, load_policy

    assert resolve_device("auto") == "cuda"
    model, _ = load_policy(tiny, lora=LoraSettings(rank=4, alpha=8))
    p = next(model.parameters())
    assert p.device.type == "cuda" and p.dtype == torch.bfloat16
    monkeypatch.setenv("LUDIC_DEVICE", "cpu")
    cpu, _ = load_policy(tiny, dtype="float32")
    assert next(cpu.parameters()).device.type == "cpu"


def test_a_grpo_step_on_the_gpu_matches_the_cpu_in_fp32(tiny):
    """One GRPO + LoRA step on the same items from the same init: loss, gradient norm and the updated
    LoRA weights agree between the CPU (fast path on) and the GPU (stock path)."""
    from ludic.training.algorithms import make_algorithm
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer

    items = vowel_grpo_items(tiny, max_tokens=8)  # sampled on the CPU: both devices train on the same items
    assert any(it.weight != 0 for it in items)
    out = {}
    for dev in ("cpu", "cuda"):
        model, tok = load_policy(tiny, lora=LoraSettings(rank=4, alpha=8), dtype="float32", device=dev, seed=0)
        trainer = Trainer(model, make_algorithm("grpo"), Fixed(items), TrainerConfig(lr=1e-2, max_grad_norm=1.0),
                          pad_token_id=tok.pad_token_id)
        m = trainer.optimize(items)
        lora = {n: p.detach().float().cpu() for n, p in model.named_parameters() if p.requires_grad}
        out[dev] = (m, lora)
    (mc, lc), (mg, lg) = out["cpu"], out["cuda"]
    assert mc["action_tokens"] == mg["action_tokens"] > 0
    assert mg["loss"] == pytest.approx(mc["loss"], rel=1e-4, abs=1e-6), (mc, mg)
    assert mg["grad_norm"] == pytest.approx(mc["grad_norm"], rel=1e-3), (mc, mg)
    for n in lc:
        assert (lc[n] - lg[n]).abs().max() < 1e-4, n


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_low_precision_model_on_the_gpu_trains_through_fp32_masters(tiny, dtype):
    """bf16 / fp16 weights on the GPU: the optimizer steps fp32 masters (fp32 AdamW state, on the GPU), an
    update far under half an ulp (Adam's first step moves each weight by about lr: 1e-5 in bf16, 1e-6 in
    fp16, whose ulp is 8x finer) is kept in the masters, the model holds the masters rounded;
    fp16 adds the loss scaler. Without masters the same step leaves most weights unchanged."""
    from ludic.training.algorithms import make_sft
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import load_policy
    from ludic.training.trainer import Trainer

    items = _sft_items()
    moved = {}
    for masters in (True, False):
        model, tok = load_policy(tiny, dtype=dtype, seed=0)
        w = model.model.layers[1].mlp.down_proj.weight
        start = w.detach().float().clone()
        trainer = Trainer(model, make_sft(), Fixed(items),
                          TrainerConfig(lr=1e-5 if dtype == "bfloat16" else 1e-6, max_grad_norm=1e9,
                                        master_weights=masters),
                          pad_token_id=tok.pad_token_id)
        m = trainer.optimize(items)
        assert torch.isfinite(torch.tensor(m["loss"])), m
        assert w.device.type == "cuda" and w.dtype == getattr(torch, dtype)
        if masters:
            assert trainer.masters.active
            master = w._ludic_master
            assert master.dtype == torch.float32 and master.device.type == "cuda"
            state = {t.dtype for s in trainer.optimizer.state.values() for k, t in s.items() if k != "step"}
            assert state == {torch.float32}
            assert torch.equal(w.detach(), master.detach().to(w.dtype))  # the model holds the masters, rounded
            moved[masters] = float(((master.detach() - start) != 0).float().mean())
            if dtype == "float16":
                assert "loss_scale" in m
        else:
            assert not trainer.masters.active
            moved[masters] = float(((w.detach().float() - start) != 0).float().mean())
    assert moved[True] > 0.9 and moved[False] < 0.5, moved


def test_keep_best_holds_its_snapshot_on_the_cpu_and_restores_it_on_the_gpu(tiny, tmp_path):
    """Full fine-tuning on the GPU under keep-best: the best evaluation's weights are a CPU copy (4 bytes a
    parameter of GPU memory otherwise, issue 37), and the run ends on them, back on the GPU."""
    import asyncio

    from ludic.training.algorithms import make_sft
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import load_policy
    from ludic.training.trainer import Trainer

    model, tok = load_policy(tiny, dtype="float32", seed=0)
    scores = iter([0.9, 0.1])

    async def evaluator():
        return {"success_rate": next(scores)}

    trainer = Trainer(model, make_sft(), Fixed(_sft_items()), TrainerConfig(lr=1e-3), pad_token_id=tok.pad_token_id,
                      checkpoint_dir=tmp_path / "ckpt", evaluator=evaluator, eval_every=1, keep_best="success_rate")
    start = {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}
    asyncio.run(trainer.train(1))
    assert all(t.device.type == "cpu" for t in trainer.keeper.state.values())
    assert trainer.best["step"] == 0
    assert all(p.device.type == "cuda" and torch.equal(p.detach().cpu(), start[n])
               for n, p in model.named_parameters() if p.requires_grad)


def test_ludic_train_runs_on_the_gpu_and_resumes(tiny, tmp_path):
    """``ludic.train`` on a Python env with the defaults' device: the policy, the engine's sampling and the
    trainer on the GPU, the held-out evaluation before and after, a checkpoint; a second call with more
    steps resumes from it (optimizer state and the CUDA RNG restored) and trains on."""
    import ludic
    from ludic.training.checkpoint import latest_checkpoint

    kw = dict(model=tiny, group_size=4, prompts_per_step=2, eval_episodes=4, max_completion_tokens=8,
              logger="none", run_dir=str(tmp_path / "run"), lr=1e-3)
    first = ludic.train(VowelEnv, train_steps=2, **kw)
    assert next(first.model.parameters()).device.type == "cuda"
    assert {"base", "trained"} <= set(first.results)
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    assert ckpt is not None
    assert "cuda" in json.loads((ckpt / "rng.json").read_text())  # the GPU's RNG is saved with the rest
    lines = (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 2 * 2 * 4  # 2 steps x 2 seeds x group 4
    second = ludic.train(VowelEnv, train_steps=3, **kw)
    lines = (tmp_path / "run" / "rollouts.jsonl").read_text().splitlines()
    assert len(lines) == 3 * 2 * 4, "the resumed run replayed or skipped steps"
    assert latest_checkpoint(tmp_path / "run" / "checkpoints") != ckpt
    assert next(second.model.parameters()).device.type == "cuda"


NCCL_WORKER = '''
import json, sys
import torch
import torch.distributed as dist
from ludic.distributed import is_distributed, is_sharded
from ludic.training.algorithms import make_sft
from ludic.training.config import TrainerConfig
from ludic.training.fsdp import full_state_dict, shard_model
from ludic.training.lora import load_policy
from ludic.training.trainer import Trainer
from ludic.types import SAWBatch, SAWItem

class Source:
    async def next_batch(self):
        return SAWBatch(items=ITEMS, meta={})

torch.cuda.set_device(0)
dist.init_process_group("nccl")  # one rank: the one GPU (NCCL refuses two ranks on one device)
assert is_distributed()
g = torch.Generator().manual_seed(0)
ITEMS = [SAWItem(tuple(torch.randint(5, 500, (8,), generator=g).tolist()),
                 tuple(torch.randint(5, 500, (4,), generator=g).tolist()), 1.0) for _ in range(4)]
out = {}
for shard in (False, True):
    model, tok = load_policy(sys.argv[1], dtype="bfloat16")
    w = "model.layers.1.mlp.down_proj.weight"
    start = dict(model.named_parameters())[w].detach().float().cpu()
    if shard:
        model = shard_model(model)  # bf16 compute, fp32 shards (the masters)
        assert is_sharded(model)
    seen = {}
    h = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.update(out=str(o.dtype)) and None)
    trainer = Trainer(model, make_sft(), Source(), TrainerConfig(lr=1e-5, max_grad_norm=1e9), pad_token_id=tok.pad_token_id)
    m = trainer.optimize(ITEMS)
    h.remove()
    full = full_state_dict(model) if shard else {k: v for k, v in model.state_dict().items()}
    moved = (full[w].float().cpu() - start).abs()
    out["sharded" if shard else "plain"] = {
        "loss": m["loss"], "grad_norm": m["grad_norm"], "compute": seen["out"],
        "param_devices": sorted({p.device.type for p in model.parameters()}),
        "shards": sorted({str(p.dtype) for p in model.parameters()}),
        "state": sorted({str(t.dtype) for s in trainer.optimizer.state.values() for k, t in s.items() if k != "step"}),
        "masters_active": trainer.masters.active, "saved": str(full[w].dtype),
        "moved": float((moved > 0).float().mean())}
print(json.dumps(out))
dist.destroy_process_group()
'''


def test_fsdp2_and_data_parallel_over_nccl(tiny, tmp_path):
    """Under torchrun with an NCCL group (one rank on the one GPU): a plain bf16 model steps with the
    trainer's gradient all-reduce over NCCL and fp32 masters; ``shard_model`` shards it as fp32 masters
    computing in bf16 (FSDP2's MixedPrecisionPolicy on CUDA). Both take the same step."""
    script = tmp_path / "nccl_worker.py"
    script.write_text(NCCL_WORKER)
    res = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=1",
                          str(script), tiny], capture_output=True, text=True, timeout=300, env={**os.environ})
    assert res.returncode == 0, res.stderr[-4000:]
    out = json.loads(res.stdout.strip().splitlines()[-1])
    plain, sharded = out["plain"], out["sharded"]
    assert plain["param_devices"] == sharded["param_devices"] == ["cuda"]
    assert plain["masters_active"] and plain["state"] == ["torch.float32"] and plain["compute"] == "torch.bfloat16"
    assert sharded["shards"] == ["torch.float32"] and sharded["state"] == ["torch.float32"]
    assert sharded["compute"] == "torch.bfloat16" and not sharded["masters_active"] and sharded["saved"] == "torch.float32"
    assert sharded["moved"] > 0.9, sharded  # the fp32 shards kept the sub-ulp update
    assert sharded["loss"] == pytest.approx(plain["loss"], rel=1e-3), out
    assert sharded["grad_norm"] == pytest.approx(plain["grad_norm"], rel=2e-2), out


def test_torchrun_on_cpus_of_a_gpu_machine_and_too_many_ranks(tiny, tmp_path):
    """``LUDIC_DEVICE=cpu`` on a GPU machine: torchrun's ranks join over gloo (to train on the CPUs); more
    ranks than GPUs over NCCL stop with an error that says so, not CUDA's "invalid device ordinal"."""
    code = ("import torch\nfrom ludic.distributed import init_distributed\n"
            "init_distributed()\nprint(torch.distributed.get_backend())\n")
    script = tmp_path / "join.py"
    script.write_text(code)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script)]
    cpu = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "LUDIC_DEVICE": "cpu"})
    assert cpu.returncode == 0 and cpu.stdout.split() == ["gloo", "gloo"], cpu.stderr[-2000:]
    if torch.cuda.device_count() < 2:
        env = {k: v for k, v in os.environ.items() if k != "LUDIC_DEVICE"}
        gpu = subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)
        assert gpu.returncode != 0 and "NCCL needs one GPU per rank" in gpu.stderr, gpu.stderr[-2000:]
