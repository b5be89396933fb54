"""SFT of the tic-tac-toe recipe's teacher data in each precision: accuracy per step and per minute.

    python -m benchmarks.bench_precision [--precisions mixed,float32,pure] [--steps 189] [--points 9]
                                         [--seed 0] [--out benchmarks/precision.json]

The recipe's SFT stage exactly (``ludic recipe tictactoe``): the 335 teacher positions, the top 15
of SmolLM2-135M's 30 layers trained (the bottom and the embeddings frozen, their output cached),
batch 16, AdamW at 2e-4 with a cosine schedule over ``--steps``, through ``Trainer``. Precisions:

    mixed    bf16 weights and compute, fp32 master weights and AdamW state (the default on bf16 CPUs)
    float32  fp32 weights and compute
    pure     bf16 weights and AdamW state (``--no-master-weights``: sub-ulp updates are lost)

At ``--points`` steps the clock stops and the policy answers the 335 positions greedily, served in
the dtype it trains in (best move and value-preserving rates). Printed per precision: the curve
against steps and against training minutes (evaluation time left out), and, for each pair, the
accuracy each reaches in the wall time of the slower one's run. ``--dtype auto`` is chosen from
this: the precision that reaches the higher accuracy in the same wall time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from pathlib import Path
from typing import Any

PRECISIONS = {"mixed": ("bfloat16", True), "float32": ("float32", True), "pure": ("bfloat16", False)}


async def run_one(precision: str, steps: int, points: int, seed: int) -> dict[str, Any]:
    """One SFT run of the recipe's stage in ``precision``: its curve (step, train seconds, rates)."""
    from ludic.data.offline import OfflineBatchSource, sft_item
    from ludic.tictactoe.synth import teacher_position_records, teacher_positions
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.tictactoe.position_rl import View, score_positions
    from ludic.tictactoe.prompts import ANSWER_TOKENS
    from ludic.tictactoe.recipe import RecipeConfig
    from ludic.training.algorithms import make_sft
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import decoder_layers, freeze_bottom, load_policy
    from ludic.training.trainer import Trainer

    rc = RecipeConfig()
    dtype, masters = PRECISIONS[precision]
    model, tok = load_policy(rc.model, dtype=dtype, seed=seed)
    engine = TransformersEngine(model, tok)
    view = View(rc.system_prompt, compact=rc.compact, show_moves=rc.show_moves,
                max_tokens=ANSWER_TOKENS[rc.answer], answer=rc.answer)
    boards = teacher_positions()
    records = teacher_position_records(rc.system_prompt, compact=rc.compact, style=rc.answer, show_moves=rc.show_moves)
    items = [sft_item(r, tok) for r in records]
    n_layers = len(decoder_layers(model))
    frozen = round(rc.sft_frozen_share * n_layers)
    freeze_bottom(model, frozen)
    tcfg = TrainerConfig(lr=rc.sft_lr, lr_schedule="cosine", micro_token_budget=rc.micro_token_budget,
                         total_steps=steps, warmup_steps=3, cache_frozen_bottom="item", master_weights=masters)
    trainer = Trainer(model, make_sft(), OfflineBatchSource(items, rc.sft_batch_size, seed=seed), tcfg,
                      tokenizer=tok, pad_token_id=tok.pad_token_id)
    t0 = time.perf_counter()
    trainer.bottom_cache.fill(model, items, tok.pad_token_id)
    train_s = time.perf_counter() - t0
    at = {round(steps * (k + 1) / points) for k in range(points)}
    curve, losses = [], []
    while trainer.step < steps:
        t0 = time.perf_counter()
        m = await trainer.train_step()
        train_s += time.perf_counter() - t0
        losses.append(m["loss"])
        if trainer.step in at:
            score = await score_positions(engine, boards, view)
            rates = score.rates()
            curve.append({"step": trainer.step, "train_s": train_s, "loss": sum(losses[-10:]) / len(losses[-10:]),
                          "best_move_rate": rates["best_move_rate"],
                          "value_preserving_rate": rates["value_preserving_rate"], "legal_rate": rates["legal_rate"]})
            print(f"[precision] {precision:8s} step {trainer.step:4d}  {train_s / 60:5.2f} min  loss {curve[-1]['loss']:.3f}  "
                  f"best {rates['best_move_rate']:.1%}  value-preserving {rates['value_preserving_rate']:.1%}", flush=True)
    return {"precision": precision, "dtype": dtype, "master_weights": masters, "steps": steps,
            "s_per_step": train_s / steps, "curve": curve}


def at_time(curve: list[dict[str, Any]], seconds: float) -> float:
    """The best-move rate of the last measurement taken within ``seconds`` of training (0 before any)."""
    done = [c for c in curve if c["train_s"] <= seconds + 1e-9]
    return done[-1]["best_move_rate"] if done else 0.0


def summary(runs: list[dict[str, Any]]) -> list[str]:
    lines = []
    for r in runs:
        last = r["curve"][-1]
        lines.append(f"{r['precision']:8s} ({r['dtype']}, master weights {r['master_weights']}): "
                     f"{r['s_per_step']:.2f} s/step, after {r['steps']} steps: best move {last['best_move_rate']:.1%}, "
                     f"value-preserving {last['value_preserving_rate']:.1%}, loss {last['loss']:.3f}")
    for i, a in enumerate(runs):
        for b in runs[i + 1:]:
            budget = min(a["curve"][-1]["train_s"], b["curve"][-1]["train_s"])
            lines.append(f"in {budget / 60:.2f} min of training: {a['precision']} {at_time(a['curve'], budget):.1%} "
                         f"best move, {b['precision']} {at_time(b['curve'], budget):.1%}")
    return lines


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--precisions", default="mixed,float32")
    ap.add_argument("--steps", type=int, default=189)
    ap.add_argument("--points", type=int, default=9)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default="benchmarks/precision.json")
    args = ap.parse_args(argv)
    from benchmarks.common import header, machine_info

    runs = []
    for p in [x.strip() for x in args.precisions.split(",") if x.strip()]:
        if p not in PRECISIONS:
            raise SystemExit(f"--precisions: unknown {p!r}; choose from {', '.join(PRECISIONS)}")
        runs.append(asyncio.run(run_one(p, args.steps, args.points, args.seed)))
    info = machine_info(",".join(r["dtype"] for r in runs))
    Path(args.out).write_text(json.dumps({"machine": info, "runs": runs}, indent=2))
    print(header(info))
    print("\n".join(summary(runs)))


if __name__ == "__main__":
    main()
