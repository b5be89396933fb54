"""Rejection sampling, the generic way: roll out, filter, write SFT records.

    python examples/rejection_sampling.py --episodes 50 --min-reward 1.0 --output data/tictactoe_winners_only.jsonl

Any env works: rollouts come from RolloutEngine, the filter is any predicate on a
Rollout (here: total reward >= --min-reward, with format rewards at 0 so draws do not
sneak in), and rollouts_to_records turns the kept episodes into chat SFT records.
"""

import argparse
import asyncio

from ludic.agents.agent import Agent
from ludic.context import FullDialog
from ludic.data.jsonl import write_jsonl
from ludic.tictactoe.synth import filter_rollouts, rollouts_to_records
from ludic.inference.client import SamplingParams
from ludic.inference.transformers_engine import TransformersEngine
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import think_move_parser
from ludic.tictactoe.prompts import SYSTEM_PROMPT
from ludic.rollouts.engine import RolloutEngine
from ludic.training.lora import load_policy
from ludic.types import EnvSpec, RolloutRequest


async def main(args: argparse.Namespace) -> None:
    model, tok = load_policy(args.model, adapter=args.adapter)
    engine = TransformersEngine(model, tok)

    def protocol() -> SingleAgentProtocol:
        agent = Agent(engine, FullDialog(SYSTEM_PROMPT), think_move_parser(),
                      SamplingParams(temperature=args.temperature, max_tokens=args.max_tokens))
        return SingleAgentProtocol(agent, stop_on_parse_error=True)

    requests = [RolloutRequest(EnvSpec("tictactoe", {"agent_starts": i % 2 == 0}), env_seed=i, sampling_seed=i,
                               max_steps=args.max_steps) for i in range(args.episodes)]
    rollouts = await RolloutEngine({"single_agent": protocol}, concurrency=args.concurrency).generate_rollouts(requests)
    kept = filter_rollouts(rollouts, lambda r: r.total_reward >= args.min_reward)
    write_jsonl(args.output, rollouts_to_records(kept, SYSTEM_PROMPT))
    print(f"kept {len(kept)} / {len(rollouts)} episodes -> {args.output}")


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=None, help="base model (default: the packaged SmolLM2-135M-Instruct)")
    ap.add_argument("--adapter", default=None, help="LoRA adapter folder")
    ap.add_argument("--episodes", type=int, default=50)
    ap.add_argument("--max-steps", type=int, default=5)
    ap.add_argument("--concurrency", type=int, default=32)
    ap.add_argument("--temperature", type=float, default=0.8)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--min-reward", type=float, default=1.0)
    ap.add_argument("--output", default="data/tictactoe_winners_only.jsonl")
    asyncio.run(main(ap.parse_args()))
