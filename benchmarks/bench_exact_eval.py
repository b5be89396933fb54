"""Exact vs sampled tic-tac-toe evaluation of one greedy policy, same model, same CPU, one run.

The exact evaluator enumerates every opponent branch of both seats (no noise);
the sampled one plays ``--episodes`` seeded games (half per seat) through the
RolloutEngine and reports a 95% Wilson interval. Both use the recipe's
SYSTEM_PROMPT, strict parser and the in-process TransformersEngine, greedy.

    python benchmarks/bench_exact_eval.py [--model DIR] [--adapter DIR] [--ctx last]
                                          [--episodes 200] [--all-positions] [--threads 1]

Prints, per opponent (minimax, random): wall seconds, distinct prompts and engine
batches of each, the exact non-loss rate against the sampled one with its
interval, and the ratio sampled / exact time. ``--all-positions`` also times the
sweep over every reachable position (4,520 boards; 13,306 prompts when the
observation names the opponent's last move).
"""

from __future__ import annotations

import argparse
import asyncio
import platform
import time


def cpu_flags() -> str:
    try:
        flags = open("/proc/cpuinfo").read()
    except OSError:
        return platform.processor() or "unknown"
    return ",".join(f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f in flags) or "none of avx2/avx512"


async def run(args: argparse.Namespace) -> None:
    import torch

    from ludic.tictactoe.exact import exact_eval
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.tictactoe.prompts import SYSTEM_PROMPT, eval_requests, make_protocol_factory, run_eval
    from ludic.tictactoe.train import outcome_intervals
    from ludic.rollouts.engine import RolloutEngine
    from ludic.training.lora import load_policy

    if args.threads:
        torch.set_num_threads(args.threads)
    model, tok = load_policy(args.model, adapter=args.adapter, dtype=args.dtype, seed=0)
    model.eval()
    print(f"cpu: {cpu_flags()}  torch threads: {torch.get_num_threads()}  "
          f"dtype: {next(model.parameters()).dtype}  ctx: {args.ctx}  max tokens: {args.max_tokens}")
    engine = TransformersEngine(model, tok)  # one engine (its batching task lives with it); stats reset per run
    for opponent in ("minimax", "random"):
        engine.stats.update(batches=0, sequences=0)
        t0 = time.perf_counter()
        exact = await exact_eval(engine, ctx=args.ctx, system_prompt=SYSTEM_PROMPT, opponent=opponent,
                                 max_tokens=args.max_tokens, all_positions=args.all_positions)
        t_exact, b_exact = time.perf_counter() - t0, engine.stats["batches"]

        engine.stats.update(batches=0, sequences=0)
        sampled = RolloutEngine({"single_agent": make_protocol_factory(engine, args.ctx, 0.0, args.max_tokens)},
                                concurrency=64)
        t0 = time.perf_counter()
        metrics, rollouts = await run_eval(sampled, eval_requests(args.episodes, opponent))
        t_sampled = time.perf_counter() - t0
        ci = outcome_intervals(rollouts)

        print(f"\n{opponent}: exact {t_exact:.1f} s ({exact.decisions} prompts, {exact.both.nodes} decisions, "
              f"{b_exact} batches; sweep {exact.sweep_seconds:.1f} s) | sampled {args.episodes} episodes "
              f"{t_sampled:.1f} s ({engine.stats['sequences']} prompts, {engine.stats['batches']} batches)")
        print(f"  non-loss: exact {float(exact.both.non_loss):.4f} | sampled {metrics['non_loss_rate']:.4f} "
              f"[{ci['non_loss_rate_ci95_low']:.4f}, {ci['non_loss_rate_ci95_high']:.4f}]")
        print(f"  time ratio sampled / exact: {t_sampled / t_exact:.2f}")
        if args.all_positions:
            print(exact.table())


def main() -> None:
    from ludic.inference.models import DEFAULT_MODEL

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--adapter", default=None)
    p.add_argument("--ctx", default="last")
    p.add_argument("--episodes", type=int, default=200)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    p.add_argument("--all-positions", action="store_true")
    asyncio.run(run(p.parse_args()))


if __name__ == "__main__":
    main()
