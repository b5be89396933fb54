"""Worker for tests/test_distributed_rl.py: GRPO steps on pre-built SAW items, in one process or under torchrun.

    python tests/dist_rl_worker.py ITEMS.json MODEL_DIR OUT.safetensors

ITEMS.json holds, per optimizer step, one list of item dicts per rank; one process trains on all of
them, rank r of a torchrun group on list r only. Rank 0 saves the LoRA weights to OUT.
"""

import asyncio
import json
import sys

from safetensors.torch import save_file

from ludic.distributed import exit_worker, init_distributed, shutdown_distributed
from ludic.training.algorithms import make_algorithm
from ludic.training.lora import LoraSettings, load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWBatch, SAWItem


class ShardSource:
    def __init__(self, steps, rank, world):
        self.steps, self.rank, self.world, self.i = steps, rank, world, 0

    async def next_batch(self):
        shards = self.steps[self.i]
        self.i += 1
        mine = [d for r, shard in enumerate(shards) if self.world == 1 or r == self.rank for d in shard]
        return SAWBatch([SAWItem.from_dict(d) for d in mine])


def main(items_path, model_dir, out):
    rank, world = init_distributed()
    steps = json.loads(open(items_path).read())
    model, tok = load_policy(model_dir, lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    trainer = Trainer(model, make_algorithm("grpo"), ShardSource(steps, rank, world),
                      TrainerConfig(lr=1e-2, micro_token_budget=64), pad_token_id=tok.pad_token_id)
    metrics = []
    asyncio.run(trainer.train(len(steps), lambda step, m: metrics.append(m)))
    if rank == 0:
        save_file({n: p.detach().contiguous() for n, p in model.named_parameters() if "lora_" in n}, out)
        print(json.dumps([{k: m[k] for k in ("loss", "grad_norm", "action_tokens")} for m in metrics]))
    shutdown_distributed()


if __name__ == "__main__":
    main(*sys.argv[1:4])
    exit_worker()
