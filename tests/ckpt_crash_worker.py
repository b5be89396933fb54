"""Worker for the crash tests in tests/test_resume.py: SFT steps on fixed items with a checkpoint after
every step and a final save, resuming from the latest checkpoint in RUN_DIR. ``LUDIC_FAULT_AT`` (with
``LUDIC_FAULT_STEP``) kills it mid-save.

    python tests/ckpt_crash_worker.py MODEL_DIR RUN_DIR STEPS
"""

import asyncio
import json
import sys

import torch

from ludic.training.algorithms import make_sft
from ludic.training.lora import LoraSettings, load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWBatch, SAWItem


class Items:
    async def next_batch(self):
        g = torch.Generator().manual_seed(0)
        return SAWBatch([SAWItem(tuple(torch.randint(5, 500, (6,), generator=g).tolist()),
                                 tuple(torch.randint(5, 500, (3,), generator=g).tolist()), 1.0) for _ in range(4)])


def main(model_dir, run_dir, steps):
    model, tok = load_policy(model_dir, lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    trainer = Trainer(model, make_sft(), Items(), TrainerConfig(lr=1e-2, checkpoint_every=1, max_to_keep=2),
                      checkpoint_dir=f"{run_dir}/ckpt", tokenizer=tok, pad_token_id=tok.pad_token_id)
    resumed = trainer.resume()
    print(json.dumps({"resumed_at": trainer.step if resumed else None}), flush=True)
    asyncio.run(trainer.train(int(steps)))
    trainer.save()  # a final save of the same step, as the recipes do
    print(json.dumps({"step": trainer.step}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:4])
