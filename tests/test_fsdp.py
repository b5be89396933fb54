"""FSDP2 on CPU: two gloo processes with the model sharded by ``fully_shard`` train exactly like one process
on the same global batch (SFT with full fine-tuning, GRPO with LoRA), publish the same merged weights,
and write a checkpoint a single process loads."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import vowel_grpo_items
from safetensors.torch import load_file

from ludic.types import SAWItem

WORKER = str(Path(__file__).with_name("fsdp_worker.py"))


def _run(cmd, **env):
    out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **env}, timeout=300)
    if out.returncode != 0:  # the failing rank's own error comes before torchrun's summary
        errors = [line for line in out.stderr.splitlines() if "Error" in line or "error" in line or "terminate" in line]
        raise AssertionError("\n".join(errors[:20]) + "\n" + out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def _sft_items(tokenizer):
    texts = [("2+2=", " 4"), ("Capital of France:", " Paris"), ("Colour of the sky:", " blue, mostly"),
             ("1, 2, 3,", " 4, 5, 6"), ("Hello", " world!"), ("Ludic trains", " agents")]
    items = []
    for p, c in texts:
        pi = tuple(tokenizer(p, add_special_tokens=False)["input_ids"])
        ci = tuple(tokenizer(c, add_special_tokens=False)["input_ids"])
        items.append(SAWItem(prompt_ids=pi, completion_ids=ci, weight=1.0).to_dict())
    return items


def _grpo_items(model_dir):
    return [it.to_dict() for it in vowel_grpo_items(model_dir, max_tokens=6)]


@pytest.mark.parametrize("mode", ["sft", "grpo"])
def test_fsdp2_two_processes_match_one(mode, tiny_model_dir, tokenizer, tmp_path):
    items = _sft_items(tokenizer) if mode == "sft" else _grpo_items(tiny_model_dir)
    half = len(items) // 2
    steps = [[items[:half], items[half:]], [items[half:], items[:half]]]
    path = tmp_path / "items.json"
    path.write_text(json.dumps(steps))
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _run([sys.executable, WORKER, mode, str(path), str(tiny_model_dir), str(tmp_path / "one")])
    two = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                WORKER, mode, str(path), str(tiny_model_dir), str(tmp_path / "two")], OMP_NUM_THREADS="1")
    for m1, m2 in zip(one, two):
        assert m1["action_tokens"] == m2["action_tokens"]
        assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5, abs=1e-7), (m1, m2)
        assert m1["grad_norm"] == pytest.approx(m2["grad_norm"], rel=1e-4), (m1, m2)
    for name in ("trained", "merged"):
        a, b = load_file(str(tmp_path / "one" / f"{name}.safetensors")), load_file(str(tmp_path / "two" / f"{name}.safetensors"))
        assert a.keys() == b.keys() and a
        for k in a:
            diff = (a[k].float() - b[k].float()).abs()
            assert diff.max() < 5e-4 and diff.mean() < 2e-6, (name, k, float(diff.max()))

    # the sharded run's checkpoint loads into a plain single-process model and holds the trained weights
    from ludic.training.checkpoint import latest_checkpoint, load_checkpoint
    from ludic.training.lora import LoraSettings, load_policy

    lora = LoraSettings(rank=4, alpha=8) if mode == "grpo" else None
    fresh, _ = load_policy(str(tiny_model_dir), lora=lora, dtype="float32", seed=1)
    load_checkpoint(latest_checkpoint(tmp_path / "two" / "ckpt"), model=fresh)
    trained = load_file(str(tmp_path / "two" / "trained.safetensors"))
    params = dict(fresh.named_parameters())
    for k, v in trained.items():
        assert (params[k].detach() - v).abs().max() < 1e-6, k


def _one_and_resumed_two(mode, model_dir, tmp_path):
    """Three GRPO steps in one process (``one/``) and in two sharded processes that checkpoint after the
    first and resume in a fresh model and trainer (``two/``); each run's per-step metrics."""
    items = _grpo_items(model_dir)
    half = len(items) // 2
    steps = [[items[:half], items[half:]], [items[half:], items[:half]], [items[:half], items[half:]]]
    path = tmp_path / "items.json"
    path.write_text(json.dumps(steps))
    (tmp_path / "one").mkdir()
    (tmp_path / "two").mkdir()
    one = _run([sys.executable, WORKER, mode, str(path), str(model_dir), str(tmp_path / "one")])
    two = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                WORKER, mode, str(path), str(model_dir), str(tmp_path / "two"), "1"], OMP_NUM_THREADS="1")
    return one, two


def test_fsdp2_resume_continues_like_an_uninterrupted_run(tiny_model_dir, tmp_path):
    """Two sharded processes train a step, checkpoint, and a fresh sharded model + trainer (another LoRA
    init) resume from it: the second step then matches one process that never stopped (Adam state included)."""
    one, two = _one_and_resumed_two("grpo", tiny_model_dir, tmp_path)
    assert len(two) == 3
    for m1, m2 in zip(one, two):
        assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5, abs=1e-7), (m1, m2)
    a, b = load_file(str(tmp_path / "one" / "trained.safetensors")), load_file(str(tmp_path / "two" / "trained.safetensors"))
    assert a.keys() == b.keys() and a
    for k in a:
        assert (a[k].float() - b[k].float()).abs().max() < 5e-4, k


def test_fsdp2_kl_reference_snapshot_of_a_cold_started_adapter_is_sharded_and_resumed(tiny_model_dir, tmp_path):
    """KL to an adapter trained before RL: the reference is a snapshot of the sharded (DTensor) adapter,
    gathered into the checkpoint and sharded again on resume; KL is 0 at the first step and every step
    matches one process that never stopped."""
    one, two = _one_and_resumed_two("grpo_kl", tiny_model_dir, tmp_path)
    assert len(one) == len(two) == 3
    assert one[0]["kl"] == pytest.approx(0.0, abs=1e-7) and one[2]["kl"] > 0
    for m1, m2 in zip(one, two):
        assert m1["kl"] == pytest.approx(m2["kl"], rel=1e-3, abs=1e-8), (m1, m2)
        assert m1["loss"] == pytest.approx(m2["loss"], rel=1e-5, abs=1e-7), (m1, m2)


def test_ludic_sft_under_torchrun_shards_and_matches_one_process(tiny_model_dir, tmp_path):
    """`ludic sft` under torchrun shards the model (FSDP2) and ends at one process's weights on the same
    global batches (2 ranks x batch 2 against 1 rank x batch 4), with a final folder a plain load reads."""
    rows = [{"prompt": p, "completion": c} for p, c in [("2+2=", " 4"), ("Capital of France:", " Paris"),
                                                        ("Sky:", " blue"), ("1, 2, 3,", " 4, 5"), ("Hi", " there"),
                                                        ("Ludic", " trains"), ("a b", " c d"), ("x", " y")]]
    data = tmp_path / "sft.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    common = ["--model", str(tiny_model_dir), "--data", str(data), "--epochs", "1", "--dtype", "float32",
              "--no-chat-template", "--lr", "1e-3", "--logger", "none", "--lr-schedule", "constant"]
    subprocess.run([sys.executable, "-m", "ludic", "sft", *common, "--batch-size", "4", "--run-dir", str(tmp_path / "one")],
                   check=True, capture_output=True, timeout=300)
    two = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m",
                          "ludic", "sft", *common, "--batch-size", "2", "--run-dir", str(tmp_path / "two")],
                         capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert two.returncode == 0, two.stderr[-3000:]
    a = load_file(str(tmp_path / "one" / "final" / "model.safetensors"))
    b = load_file(str(tmp_path / "two" / "final" / "model.safetensors"))
    assert a.keys() == b.keys()
    changed = 0
    for k in a:
        assert (a[k].float() - b[k].float()).abs().max() < 5e-4, k
    base = load_file(str(next(Path(tiny_model_dir).glob("*.safetensors"))))
    changed = sum(not bool((base[k].float() == a[k].float()).all()) for k in a if k in base)
    assert changed > 0  # it trained


def test_exit_worker_flushes_and_skips_finalisation_only_in_a_worker():
    """A torchrun worker ends with ``exit_worker`` (no interpreter finalisation, where a gloo group a
    sharded model still holds could abort the process after its work was done); what it printed is
    flushed first. A process that never joined a group is left alone."""
    code = ("import atexit, sys, ludic.distributed as d\n"
            "atexit.register(lambda: print('finalised'))\n"
            "print('done', end='')\n"
            "d.exit_worker(3 if d._JOINED else 0)\n"
            "sys.exit(7)\n")
    plain = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert (plain.returncode, plain.stdout) == (7, "donefinalised\n")
    joined = subprocess.run([sys.executable, "-c", code.replace("import atexit", "import atexit, ludic.distributed\n"
                                                                "ludic.distributed._JOINED = True\nimport os")],
                            capture_output=True, text=True, timeout=60)
    assert (joined.returncode, joined.stdout) == (3, "done"), joined.stderr


MIXED_WORKER = '''
import json, sys
import torch
from ludic.distributed import exit_worker, init_distributed, is_rank0, shutdown_distributed
from ludic.training.algorithms import make_sft
from ludic.training.fsdp import full_state_dict, shard_model
from ludic.training.lora import load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWBatch, SAWItem

class Source:
    async def next_batch(self):
        return SAWBatch(items=ITEMS, meta={})

rank, world = init_distributed()
model, tok = load_policy(sys.argv[1], dtype="bfloat16")
start = {n: p.detach().clone() for n, p in model.named_parameters()}
model = shard_model(model)  # auto: the model's bf16 is the compute dtype, the shards fp32
g = torch.Generator().manual_seed(0)
ITEMS = [SAWItem(tuple(torch.randint(5, 500, (8,), generator=g).tolist()),
                 tuple(torch.randint(5, 500, (4,), generator=g).tolist()), 1.0) for _ in range(4)][rank::world]
shard_dtypes = sorted({str(p.dtype) for p in model.parameters()})
seen = {}
h = model.model.layers[0].mlp.down_proj.register_forward_hook(lambda m, i, o: seen.update(out=str(o.dtype)) and None)
trainer = Trainer(model, make_sft(), Source(), TrainerConfig(lr=1e-5, max_grad_norm=1e9), pad_token_id=tok.pad_token_id)
trainer.optimize(ITEMS)
h.remove()
state_dtypes = sorted({str(t.dtype) for s in trainer.optimizer.state.values() for k, t in s.items() if k != "step"})
full = full_state_dict(model)
if is_rank0():
    w = "model.layers.1.mlp.down_proj.weight"
    moved = (full[w].float() - start[w].float()).abs()
    print(json.dumps({"shards": shard_dtypes, "state": state_dtypes, "compute": seen["out"],
                      "masters_active": trainer.masters.active, "saved": str(full[w].dtype),
                      "sub_ulp_moved": float(((moved > 0) & (moved < start[w].float().abs() * 2 ** -9)).float().mean())}))
shutdown_distributed()
exit_worker()
'''


def test_fsdp2_shards_a_bf16_model_as_fp32_masters_computing_in_bf16(tiny_model_dir, tmp_path):
    """A bf16 model under FSDP2 (``shard_model``'s default): fp32 shards and AdamW state, bf16 activations,
    and the first step's updates (about lr = 1e-5, under half a bf16 ulp of most weights) kept."""
    script = tmp_path / "mixed_worker.py"
    script.write_text(MIXED_WORKER)
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                str(script), str(tiny_model_dir)], OMP_NUM_THREADS="1")
    assert out["shards"] == ["torch.float32"] and out["state"] == ["torch.float32"]
    assert out["compute"] == "torch.bfloat16" and out["saved"] == "torch.float32"
    assert not out["masters_active"]  # FSDP's fp32 shards are the masters: no second copy
    assert out["sub_ulp_moved"] > 0.3, out


FP16_WORKER = '''
import json, sys
import torch
from ludic.distributed import exit_worker, init_distributed, is_rank0, shutdown_distributed
from ludic.training.algorithms import make_sft
from ludic.training.fsdp import shard_model
from ludic.training.lora import load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWBatch, SAWItem

class Source:
    async def next_batch(self):
        return SAWBatch(items=ITEMS, meta={})

rank, world = init_distributed()
model, tok = load_policy(sys.argv[1], dtype="float16")
model = shard_model(model)  # auto: fp16 compute over fp32 shards (MixedPrecisionPolicy(param_dtype=fp16))
g = torch.Generator().manual_seed(0)
ITEMS = [SAWItem(tuple(torch.randint(5, 500, (8,), generator=g).tolist()),
                 tuple(torch.randint(5, 500, (4,), generator=g).tolist()), 1.0) for _ in range(4)][rank::world]
trainer = Trainer(model, make_sft(), Source(), TrainerConfig(lr=1e-4, max_grad_norm=1e9), pad_token_id=tok.pad_token_id)
out = {"shards": sorted({str(p.dtype) for p in model.parameters()}), "scaler": trainer.masters.scaler is not None}
if out["scaler"]:
    m = trainer.optimize(ITEMS)
    out["first"] = {k: m.get(k) for k in ("loss_scale", "skipped_overflow", "grad_norm")}
    trainer.masters.scaler.scale = 1e30  # every rank overflows in its shard of the gradients: all skip, in lockstep
    m = trainer.optimize(ITEMS)
    out["overflow"] = {k: m.get(k) for k in ("loss_scale", "skipped_overflow")}
if is_rank0():
    print(json.dumps(out))
shutdown_distributed()
exit_worker()
'''


def test_fsdp2_fp16_mixed_precision_scales_the_loss(tiny_model_dir, tmp_path):
    """Was: FSDP2 shards an fp16 model as fp32 parameters computing in fp16, and the loss scaler, decided by the
    trainable parameters' dtype (fp32 shards), was never made: fp16 backward without loss scaling."""
    script = tmp_path / "fp16_worker.py"
    script.write_text(FP16_WORKER)
    out = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
                str(script), str(tiny_model_dir)], OMP_NUM_THREADS="1")
    assert out["shards"] == ["torch.float32"] and out["scaler"], out
    assert out["first"]["loss_scale"] == 2.0 ** 16 and out["first"]["skipped_overflow"] is None, out
    assert out["overflow"] == {"loss_scale": 5e29, "skipped_overflow": 1}, out
