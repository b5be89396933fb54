"""How fast a learner learns the 335 teacher positions when it is given the answer: a screen for the rewards-only
mode's learner (a diagnostic; it shows the policy the solver's moves, so it is never part of ``--teacher none``).

Starts as the mode does (the packaged model, the random-cell cold start on the top half of the layers, half an
epoch at 2e-4), then trains on the solver's best move for each of the 335 positions, batches of 16, through the
learner asked for: a LoRA of ``--rank`` on the top ``--layer-share`` of the layers, or (``--rank 0``) the top half's
layers themselves, at ``--lr`` with ``--schedule``. Prints the greedy value-preserving share on the 335 every
``--every`` passes. A learner that imitates faster per pass learned faster from the move reward per visit too
(docs/studies.md, "What a visit teaches: the step itself" and "The learner, not the visits: the top layers themselves").

    python examples/rewards_only/learner_screen.py --rank 16 --lr 1e-3 --passes 12   # the mode's LoRA
    python examples/rewards_only/learner_screen.py --rank 0 --lr 2e-4 --passes 12    # the top 15 layers themselves

Measured on the Intel Xeon with AVX512-BF16 and AMX (bf16, 2 threads, about 8.5 minutes for 12 passes), value-preserving
after 0 / 2 / 4 / 6 / 8 / 10 / 12 passes: LoRA r16 at 1e-3 52.8 / 60.3 / 60.9 / 63.0 / 63.9 / 75.5 / 80.9%; the
top 15 layers at 2e-4 52.8 / 60.9 / 61.2 / 69.0 / 82.1 / 89.0 / 89.3%.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import time


async def screen(rank: int, layer_share: float, lr: float, passes: int, schedule: str = "constant",
                 every: int = 2, seed: int = 0) -> list[float]:
    """The greedy value-preserving share (%) on the 335 after 0, ``every``, 2 * ``every``, ... passes."""
    import torch

    from ludic.data.offline import OfflineBatchSource, sft_item
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.tictactoe.position_rl import View, score_positions
    from ludic.tictactoe.prompts import ANSWER_TOKENS
    from ludic.tictactoe.recipe import rewards_only_config, rl_learner
    from ludic.tictactoe.synth import random_cell_records, teacher_position_records, teacher_positions
    from ludic.training.algorithms import make_sft
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import decoder_layers, freeze_bottom, load_policy
    from ludic.training.trainer import Trainer

    # the mode's prompt, cold start, batch and learner, as ``ludic recipe tictactoe --teacher none`` builds them
    rc = rewards_only_config(seed=seed, lora_rank=rank, lora_layer_share=layer_share)
    torch.manual_seed(seed)
    model, tok = load_policy(rc.model, dtype=rc.dtype, seed=seed)
    view = View(rc.system_prompt, compact=rc.compact, show_moves=rc.show_moves, max_tokens=ANSWER_TOKENS[rc.answer],
                answer=rc.answer)
    records = dict(compact=rc.compact, style=rc.answer, show_moves=rc.show_moves)
    engine, teacher = TransformersEngine(model, tok), teacher_positions()

    def trainer(items: list, cfg: TrainerConfig) -> Trainer:
        return Trainer(model, make_sft(), OfflineBatchSource(items, rc.sft_batch_size, seed=seed), cfg,
                       checkpoint_dir=None, tokenizer=tok, pad_token_id=tok.pad_token_id)

    n_layers = len(decoder_layers(model))
    freeze_bottom(model, min(n_layers - 1, round(rc.sft_frozen_share * n_layers)))
    cold = [sft_item(r, tok) for r in random_cell_records(rc.system_prompt, seed=seed, **records)]
    steps = math.ceil(rc.cold_start_epochs * len(cold) / rc.sft_batch_size)
    cold_trainer = trainer(cold, TrainerConfig(lr=rc.sft_lr, lr_schedule="cosine", total_steps=steps, warmup_steps=3))
    for _ in range(steps):
        await cold_trainer.train_step()
    model = engine.model = rl_learner(model, rc)
    engine.weights_changed()
    items = [sft_item(r, tok) for r in teacher_position_records(rc.system_prompt, **records)]
    per_pass = math.ceil(len(items) / rc.sft_batch_size)
    learner = trainer(items, TrainerConfig(lr=lr, lr_schedule=schedule, total_steps=per_pass * passes))

    async def value_preserving() -> float:
        return round(100 * (await score_positions(engine, teacher, view)).rates()["value_preserving_rate"], 1)

    out, t0 = [await value_preserving()], time.perf_counter()
    for p in range(1, passes + 1):
        for _ in range(per_pass):
            await learner.train_step()
        engine.weights_changed()
        if p % every == 0 or p == passes:
            out.append(await value_preserving())
            print(f"pass {p}: value-preserving {out[-1]}% ({time.perf_counter() - t0:.0f} s)", flush=True)
    return out


def main() -> None:
    from ludic.tictactoe.recipe import rewards_only_config

    mode = rewards_only_config()  # the defaults: the mode's RL learner
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=mode.lora_rank, help="LoRA rank; 0 trains the top layers themselves")
    ap.add_argument("--layer-share", type=float, default=mode.lora_layer_share, help="the LoRA's share of the layers")
    ap.add_argument("--lr", type=float, default=mode.rl_lr)
    ap.add_argument("--schedule", default="constant", choices=("constant", "linear", "cosine"))
    ap.add_argument("--passes", type=int, default=12)
    ap.add_argument("--every", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    vp = asyncio.run(screen(args.rank, args.layer_share, args.lr, args.passes, args.schedule, args.every, args.seed))
    print(json.dumps({**vars(args), "value_preserving": vp}))


if __name__ == "__main__":
    main()
