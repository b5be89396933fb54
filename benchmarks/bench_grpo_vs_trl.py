"""GRPO step time, Ludic vs TRL, same model, same CPU, same workload, one run.

Workload (the GUIDE's TRL baseline): SmolLM2-135M-Instruct, LoRA r16 on all linear
layers, 16 completions per step (2 prompts x 8), at most 32 completion tokens,
temperature 1, float32 on CPUs without native bf16. Prompts are the tic-tac-toe
recipe's system prompt plus a compact board. The reward only needs variance
(distinct characters / 32), so both trainers do real updates.

    python benchmarks/bench_grpo_vs_trl.py [--steps 3]

Prints seconds per step (median over the measured steps, after one warm-up
step each), completion tokens per step and the ratio TRL / Ludic.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time


def reward_text(text: str) -> float:
    return len(set(text)) / 32.0


def prompts(n: int) -> list[list[dict]]:
    from ludic.envs.tictactoe import TicTacToeEnv
    from ludic.recipes.tictactoe import SYSTEM_PROMPT

    out = []
    for i in range(n):
        env = TicTacToeEnv(compact=True, agent_starts=i % 2 == 0, opponent="random")
        obs, _ = env.reset(seed=i)[env.agent_id]
        out.append([{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": obs}])
    return out


def bench_trl(model_dir: str, steps: int, dtype: str) -> list[float]:
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    def reward(completions, **kw):
        return [reward_text(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    ds = Dataset.from_list([{"prompt": p} for p in prompts(2 * (steps + 1))])
    args = GRPOConfig(
        output_dir="/tmp/ludic_bench_trl", max_steps=steps + 1, per_device_train_batch_size=16,
        num_generations=8, max_completion_length=32, temperature=1.0, learning_rate=1e-5, use_cpu=True,
        bf16=False, report_to="none", logging_steps=1000, save_strategy="no", beta=0.0,
        model_init_kwargs={"dtype": getattr(torch, dtype)}, disable_tqdm=True, shuffle_dataset=False,
    )
    lora = LoraConfig(r=16, lora_alpha=32, target_modules="all-linear", task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=ds, peft_config=lora,
                          callbacks=[Clock()])
    trainer.train()
    return times[1:]


def bench_ludic(model_dir: str, steps: int, dtype: str) -> tuple[list[float], list[int]]:
    from ludic.agents.agent import Agent
    from ludic.context import make_context
    from ludic.envs.prompt_env import register_reward
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.recipes.tictactoe import SYSTEM_PROMPT
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.algorithms import make_algorithm
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer, TrainerConfig
    from ludic.types import EnvSpec, RolloutRequest

    register_reward("bench_text", lambda prompt, completion: reward_text(completion))
    model, tok = load_policy(model_dir, lora=LoraSettings(rank=16, alpha=32), dtype=dtype)
    engine = TransformersEngine(model, tok)

    def factory():
        agent = Agent(engine, make_context("last", SYSTEM_PROMPT),
                      sampling=SamplingParams(temperature=1.0, max_tokens=32), reject_incomplete=False)
        return SingleAgentProtocol(agent)

    ps = prompts(2 * (steps + 1))
    it = iter(ps)

    def requests_fn():
        return [RolloutRequest(EnvSpec("prompt", {"prompt": next(it)[1]["content"], "reward": "bench_text"}),
                               max_steps=1) for _ in range(2)]

    algo = make_algorithm("grpo")
    source = RolloutBatchSource(RolloutEngine({"single_agent": factory}, concurrency=64), requests_fn,
                                algo.credit, strategy=GRPORequestStrategy(8))
    trainer = Trainer(model, algo, source, TrainerConfig(lr=1e-5), publisher=InProcessPublisher(engine),
                      pad_token_id=tok.pad_token_id)
    times, tokens = [], []
    for _ in range(steps + 1):
        t0 = time.perf_counter()
        m = asyncio.run(trainer.train_step())
        times.append(time.perf_counter() - t0)
        tokens.append(int(m["completion_tokens"]))
    return times[1:], tokens[1:]


def main() -> None:
    from ludic.inference.models import packaged_model_dir, resolve_dtype

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--dtype", default="auto")
    args = ap.parse_args()
    model_dir, dtype = str(packaged_model_dir()), resolve_dtype(args.dtype)
    ludic_times, ludic_tokens = bench_ludic(model_dir, args.steps, dtype)
    trl_times = bench_trl(model_dir, args.steps, dtype)
    lt, tt = statistics.median(ludic_times), statistics.median(trl_times)
    print(f"dtype {dtype}; 16 completions (<= 32 tokens) per step; LoRA r16; median of {args.steps} steps")
    print(f"ludic  {lt:7.2f} s/step   (steps: {', '.join(f'{t:.1f}' for t in ludic_times)}; "
          f"completion tokens/step: {statistics.mean(ludic_tokens):.0f})")
    print(f"trl    {tt:7.2f} s/step   (steps: {', '.join(f'{t:.1f}' for t in trl_times)})")
    print(f"ratio  TRL / Ludic = {tt / lt:.2f}x")


if __name__ == "__main__":
    main()
