"""Worker for tests/test_fsdp.py: SFT (full fine-tuning) or GRPO (LoRA) steps on pre-built SAW items,
in one process or under torchrun with the model sharded by FSDP2 (``shard_model``).

    python tests/fsdp_worker.py MODE ITEMS.json MODEL_DIR OUT_DIR [RESUME_AFTER]

MODE is sft, grpo, or grpo_kl (GRPO with a KL penalty to an adapter trained before RL). ITEMS.json holds, per optimizer step, one list of item dicts per rank; one process
trains on all of them, rank r of a torchrun group on list r only. Rank 0 writes OUT_DIR/trained.safetensors
(the trained parameters, gathered), OUT_DIR/merged.safetensors (the weights a publisher pushes: LoRA merged)
and a checkpoint under OUT_DIR/ckpt, and prints the per-step metrics as JSON.
"""

import asyncio
import json
import sys
from pathlib import Path

import torch

from dist_rl_worker import ShardSource  # the same per-rank item source (this folder is on sys.path)
from safetensors.torch import save_file

from ludic.distributed import exit_worker, init_distributed, is_rank0, is_sharded, shutdown_distributed
from ludic.inference.publish import merged_state_dict
from ludic.training.algorithms import make_algorithm
from ludic.training.fsdp import GatheringPublisher, full_state_dict, shard_model
from ludic.training.lora import LoraSettings, load_policy
from ludic.training.trainer import Trainer, TrainerConfig


class Capture:
    """A full-weight publisher stand-in that keeps what it was given (rank 0)."""

    def __init__(self):
        self.sd = None

    def publish(self, sd, version, force=False):
        self.sd = merged_state_dict(sd, dtype=None)
        return {"version": version}


def build(mode, model_dir, steps, rank, world, out, capture, seed=0):
    lora = LoraSettings(rank=4, alpha=8) if mode.startswith("grpo") else None
    model, tok = load_policy(model_dir, lora=lora, dtype="float32", seed=seed)
    if mode == "grpo_kl":  # a cold start trained the adapter before RL: the KL reference is a snapshot of it
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for n, p in model.named_parameters():
                if "lora_B" in n:
                    p.copy_(0.05 * torch.randn(p.shape, generator=g))
    if world > 1:
        model = shard_model(model, mixed_precision="none")
        assert is_sharded(model)
    algorithm = make_algorithm("grpo", kl_coef=0.1) if mode == "grpo_kl" else make_algorithm(mode)
    trainer = Trainer(model, algorithm, ShardSource(steps, rank, world),
                      TrainerConfig(lr=1e-2 if lora else 1e-3, micro_token_budget=64, max_grad_norm=1.0),
                      publisher=GatheringPublisher(capture), checkpoint_dir=out / "ckpt", tokenizer=tok,
                      pad_token_id=tok.pad_token_id)
    return model, trainer


def main(mode, items_path, model_dir, out_dir, resume_after=None):
    """``resume_after`` k: train k steps and checkpoint, then a fresh model (other random LoRA init)
    and trainer resume from that checkpoint and train the rest, as after a crash."""
    rank, world = init_distributed()
    out = Path(out_dir)
    steps = json.loads(open(items_path).read())
    capture = Capture()
    model, trainer = build(mode, model_dir, steps, rank, world, out, capture)
    metrics = []
    if resume_after is not None:
        asyncio.run(trainer.train(int(resume_after), lambda step, m: metrics.append(m)))
        trainer.save()
        model, trainer = build(mode, model_dir, steps, rank, world, out, capture, seed=1)
        assert trainer.resume() and trainer.step == int(resume_after)
        trainer.source.i = trainer.step
    asyncio.run(trainer.train(len(steps), lambda step, m: metrics.append(m)))
    trainer.save()
    sd = full_state_dict(model) if is_sharded(model) else model.state_dict()
    if is_rank0():
        trained = {n for n, p in model.named_parameters() if p.requires_grad}
        save_file({k: v.detach().contiguous() for k, v in sd.items() if k in trained}, str(out / "trained.safetensors"))
        save_file({k: v.contiguous() for k, v in capture.sd.items()}, str(out / "merged.safetensors"))
        print(json.dumps([{k: m[k] for k in ("loss", "grad_norm", "action_tokens", "kl") if k in m} for m in metrics]))
    shutdown_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:6])
    exit_worker()
