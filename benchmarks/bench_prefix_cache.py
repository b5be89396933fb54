"""Multi-turn sampling with the engine's prefix cache against a full prefill of every turn, one run.

Workload: the held-out study's GEM guess-the-number test set (``gem:game:GuessTheNumber-v0-random``: a random
range and secret per instance, up to 8 turns; ``ludic eval env``'s 64 test instances), played greedily by the
packaged SmolLM2-135M-Instruct with ``--max-completion-tokens 24``, twice over the same model:

    cached   TransformersEngine()                          each turn prefills what follows the dialog's last prompt
    full     TransformersEngine(prefix_cache_bytes=0)      each turn prefills the whole dialog (before this cache)

Prints wall time, prompt tokens and the tokens each side prefilled, whether every reply of every episode is the
same in both (greedy: the cache must not change what the policy says, so nor what it learns), and the ratio
full / cached, with the CPU's flags and the dtype. The base model answers without ``\\boxed{}`` and ends most
games in one turn; ``--adapter`` plays a policy that plays on (the study's cold start, say).

    python benchmarks/bench_prefix_cache.py [--episodes 64] [--dtype auto] [--adapter DIR] [--order full,cached]
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ENV = "gem:game:GuessTheNumber-v0-random"


async def play(engine, opts, env, seeds) -> tuple[list, float]:
    from ludic.inference.client import SamplingParams
    from ludic.recipes.env_setup import eval_requests, protocols
    from ludic.rollouts.engine import RolloutEngine

    sampling = SamplingParams(temperature=0.0, max_tokens=opts.max_completion_tokens)
    protos = protocols(engine, opts, env, sampling)
    t0 = time.perf_counter()
    rollouts = await RolloutEngine(protos, concurrency=64).generate_rollouts(eval_requests(opts, env, seeds))
    return rollouts, time.perf_counter() - t0


def main(argv: list[str] | None = None) -> dict:
    from benchmarks.common import header, machine_info
    from ludic.inference.models import load_model, load_tokenizer, resolve_dtype
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.recipes.env_setup import EnvConfig, held_out_for, probe_env

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=64)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--adapter", default=None, help="a LoRA adapter directory to play (default: the base model)")
    p.add_argument("--order", default="full,cached", help="which side runs first")
    args = p.parse_args(argv)
    dtype = resolve_dtype(args.dtype)
    opts = EnvConfig(env=ENV, max_completion_tokens=24)
    env = probe_env(opts)
    seeds = [seed for seed, _ in held_out_for(opts, args.episodes, 0).test]
    tok = load_tokenizer(None)
    model = load_model(None, dtype=dtype)
    if args.adapter:
        from peft import PeftModel

        model = PeftModel.from_pretrained(model, args.adapter)
    model.eval()
    print(f"[prefix] {header(machine_info(dtype))}; {ENV}, {len(seeds)} test episodes, greedy, 24 tokens a reply"
          + (f", adapter {args.adapter}" if args.adapter else ", the base model"), flush=True)
    results: dict[str, dict] = {}
    replies: dict[str, list] = {}
    for side in args.order.split(","):
        engine = TransformersEngine(model, tok, prefix_cache_bytes=0 if side == "full" else 2 << 30)
        rollouts, wall = asyncio.run(play(engine, opts, env, seeds))
        steps = [s for r in rollouts for s in r.steps if s.trace is not None]
        prompt = sum(len(s.trace.prompt_ids) for s in steps)
        reused = engine.prefix_cache.stats["reused_tokens"]
        replies[side] = [[s.trace.completion_ids for s in r.steps if s.trace is not None] for r in rollouts]
        results[side] = {"wall_s": wall, "turns": len(steps), "prompt_tokens": prompt, "prefilled": prompt - reused,
                         "completion_tokens": sum(len(s.trace.completion_ids) for s in steps)}
        print(f"[prefix] {side:6s}  {wall:7.1f} s  {len(steps)} turns  prompt tokens {prompt}  prefilled "
              f"{prompt - reused}  sampled {results[side]['completion_tokens']}", flush=True)
    same = replies["full"] == replies["cached"]
    ratio = results["full"]["wall_s"] / results["cached"]["wall_s"]
    print(f"[prefix] every reply the same in both: {same}; ratio full / cached: wall {ratio:.2f}x, prefilled tokens "
          f"{results['full']['prefilled'] / max(1, results['cached']['prefilled']):.2f}x", flush=True)
    return {**results, "same_replies": same, "ratio": ratio, "dtype": dtype}


if __name__ == "__main__":
    main()
