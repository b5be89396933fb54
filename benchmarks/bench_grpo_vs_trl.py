"""GRPO step time, Ludic vs TRL, same model, same CPU, same workload, one run.

Workload (the GUIDE's TRL baseline): SmolLM2-135M-Instruct, LoRA r16 / alpha 32 on all linear
layers, 16 completions per step (2 prompts x 8), at most 32 completion tokens, temperature 1,
lr 1e-5, no KL term, bf16 where the CPU has native bf16 (else float32), no gradient checkpointing
(TRL 1.x turns it on by default; ``--trl-gradient-checkpointing`` restores that). Prompts are the
tic-tac-toe recipe's system prompt plus a compact board. The reward only needs variance
(distinct characters / 32), so both trainers do real updates. A step is generation + scoring
+ one optimizer step on both sides.

    python benchmarks/bench_grpo_vs_trl.py [--steps 3] [--dtype auto] [--quick]

Prints each side's configuration, seconds per step (median over the measured steps, after one
warm-up step each), generated and trained completion tokens per step on both sides (TRL's are
counted in its reward function, which receives every completion's token ids), whether they
match, and the ratio TRL / Ludic.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import random
import statistics
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import at_least, format_table, row  # noqa: E402

LORA = {"r": 16, "alpha": 32, "targets": "all-linear"}
LR = 1e-5
SEED = 42
"""Both sides: TRL's trainer seed (its default), Ludic's LoRA init and sampling seeds."""


def workload(quick: bool = False) -> dict[str, int]:
    """Prompts per step, completions per prompt, completion token limit (--quick: 1 x 4, 8 tokens)."""
    return {"prompts": 1, "group_size": 4, "max_tokens": 8} if quick else {"prompts": 2, "group_size": 8, "max_tokens": 32}


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


def show(side: str, cfg: dict[str, Any]) -> None:
    print(f"[grpo] {side} configuration:")
    for k, v in cfg.items():
        print(f"[grpo]   {k}: {v}")


TRL_FIELDS = ("per_device_train_batch_size", "num_generations", "generation_batch_size", "steps_per_generation",
              "gradient_accumulation_steps", "max_completion_length", "temperature", "top_p", "top_k", "min_p",
              "repetition_penalty", "loss_type", "beta", "epsilon", "epsilon_high", "scale_rewards",
              "importance_sampling_level", "num_iterations", "mask_truncated_completions", "learning_rate",
              "lr_scheduler_type", "weight_decay", "max_grad_norm", "optim", "bf16", "use_cpu", "use_vllm",
              "gradient_checkpointing", "seed")


def bench_trl(model_dir: str, steps: int, dtype: str, *, prompts_per_step: int = 2, group_size: int = 8,
              max_tokens: int = 32, gradient_checkpointing: bool = False) -> dict[str, Any]:
    """TRL's GRPOTrainer for 1 warm-up + ``steps`` steps; seconds and token totals of the timed steps.

    TRL 1.x turns gradient checkpointing on by default; Ludic's trainer does not, so it is off here
    unless ``gradient_checkpointing`` (the same work on both sides)."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    times: list[float] = []
    generated: list[int] = []
    trained: list[int] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    eos_ids: set[int] = set()

    def reward(completions, completion_ids=None, **kw):
        if completion_ids is not None:  # called once per generation batch = once per step here
            generated.append(sum(len(ids) for ids in completion_ids))
            if args.mask_truncated_completions:  # TRL then drops truncated completions from the loss
                trained.append(sum(len(ids) for ids in completion_ids if ids and ids[-1] in eos_ids))
            else:
                trained.append(generated[-1])
        return [reward_text(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    n = prompts_per_step * group_size
    ds = Dataset.from_list([{"prompt": p} for p in prompts(prompts_per_step * (steps + 1))])
    args = GRPOConfig(
        output_dir="/tmp/ludic_bench_trl", max_steps=steps + 1, per_device_train_batch_size=n,
        num_generations=group_size, max_completion_length=max_tokens, temperature=1.0, learning_rate=LR,
        use_cpu=True, bf16=False, report_to="none", logging_steps=1000, save_strategy="no", beta=0.0,
        model_init_kwargs={"dtype": getattr(torch, dtype)}, disable_tqdm=True, shuffle_dataset=False,
        gradient_checkpointing=gradient_checkpointing, seed=SEED,
    )
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["targets"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=ds, peft_config=lora,
                          callbacks=[Clock()])
    tok = trainer.processing_class
    tok = getattr(tok, "tokenizer", tok)
    eos_ids.update(i for i in (tok.eos_token_id, tok.pad_token_id) if i is not None)
    cfg = {"model": model_dir, "dtype": dtype, "threads": torch.get_num_threads(),
           "prompts per step": prompts_per_step, "completions per step": n,
           "lora": f"r{LORA['r']} alpha {LORA['alpha']} {LORA['targets']}", "reward": "distinct chars / 32",
           **{k: getattr(args, k, None) for k in TRL_FIELDS}}
    show("TRL GRPOTrainer", cfg)
    trainer.train()
    return {"times": times[1:], "generated": generated[1:], "trained": trained[1:], "config": cfg}


def bench_ludic(model_dir: str, steps: int, dtype: str, *, prompts_per_step: int = 2, group_size: int = 8,
                max_tokens: int = 32, profile: bool = False) -> dict[str, Any]:
    """Ludic's Trainer (RolloutBatchSource over the in-process TransformersEngine, GRPO preset) for
    1 warm-up + ``steps`` steps; seconds (with the generation / training split) and token totals of
    the timed steps. ``profile``: the last step runs under ``torch.profiler``, its top operators
    by self CPU time are returned as ``profile`` (a table)."""
    import torch

    from ludic.agents.agent import Agent
    from ludic.context import make_context
    from ludic.envs.prompt_env import register_reward
    from ludic.inference.client import SamplingParams
    from ludic.inference.publish import InProcessPublisher
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
    lora = LoraSettings(rank=LORA["r"], alpha=LORA["alpha"], target_modules=LORA["targets"])
    random.seed(SEED)  # unseeded sampling rows draw their seeds from here (token totals still vary by run)
    model, tok = load_policy(model_dir, lora=lora, dtype=dtype, seed=SEED)
    engine = TransformersEngine(model, tok)
    sampling = SamplingParams(temperature=1.0, max_tokens=max_tokens)

    def factory():
        agent = Agent(engine, make_context("last", SYSTEM_PROMPT), sampling=sampling, reject_incomplete=False)
        return SingleAgentProtocol(agent)

    it = iter(prompts(prompts_per_step * (steps + 1)))

    def requests_fn():
        return [RolloutRequest(EnvSpec("prompt", {"prompt": next(it)[1]["content"], "reward": "bench_text"}),
                               max_steps=1) for _ in range(prompts_per_step)]

    algo = make_algorithm("grpo")
    source = RolloutBatchSource(RolloutEngine({"single_agent": factory}, concurrency=64), requests_fn,
                                algo.credit, strategy=GRPORequestStrategy(group_size))
    tcfg = TrainerConfig(lr=LR)
    trainer = Trainer(model, algo, source, tcfg, publisher=InProcessPublisher(engine), pad_token_id=tok.pad_token_id)
    cfg = {"model": model_dir, "dtype": dtype, "threads": torch.get_num_threads(),
           "prompts per step": prompts_per_step, "completions per step": prompts_per_step * group_size,
           "lora": f"r{lora.rank} alpha {lora.alpha} {lora.target_modules}", "reward": "distinct chars / 32",
           "sampling": dataclasses.asdict(sampling), "context": "last observation + system prompt",
           "engine": f"TransformersEngine max_batch_size={engine.max_batch_size}",
           "algorithm": algo.describe(), "trainer": dataclasses.asdict(tcfg), "seed": SEED}
    show("Ludic", cfg)
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    times, generated, trained, split = [], [], [], []
    table = None
    for k in range(steps + 1):
        profiled = profile and k == steps
        with (torch_profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext()) as prof:
            t0 = time.perf_counter()
            m = asyncio.run(trainer.train_step())
            times.append(time.perf_counter() - t0)
        if profiled:
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        generated.append(sum(len(s.trace.completion_ids) for r in source.last_rollouts for s in r.steps if s.trace))
        trained.append(int(m["action_tokens"]))
        split.append({"generation_s": float(m.get("generation_s", 0.0)), "train_s": float(m.get("train_s", 0.0))})
    return {"times": times[1:], "generated": generated[1:], "trained": trained[1:], "split": split[1:],
            "config": cfg, "profile": table}


def mean(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else float("nan")


def run(steps: int | None = None, dtype: str = "auto", *, quick: bool = False,
        trl_gradient_checkpointing: bool = False) -> dict[str, Any]:
    """Both sides, one after the other; part (a) of the runner."""
    from ludic.inference.models import packaged_model_dir, resolve_dtype

    steps = steps or (1 if quick else 3)
    w = workload(quick)
    model_dir, dtype = str(packaged_model_dir()), resolve_dtype(dtype)
    kw = {"prompts_per_step": w["prompts"], "group_size": w["group_size"], "max_tokens": w["max_tokens"]}
    lu = bench_ludic(model_dir, steps, dtype, **kw)
    trl = bench_trl(model_dir, steps, dtype, gradient_checkpointing=trl_gradient_checkpointing, **kw)
    lt, tt = statistics.median(lu["times"]), statistics.median(trl["times"])
    n = w["prompts"] * w["group_size"]
    print(f"[grpo] dtype {dtype}; {n} completions (<= {w['max_tokens']} tokens) per step; LoRA r16; "
          f"median of {steps} steps after 1 warm-up")
    sp = lu["split"]
    print(f"[grpo] ludic split: generation {mean([x['generation_s'] for x in sp]):.2f} s, "
          f"training {mean([x['train_s'] for x in sp]):.2f} s per step")
    for name, side, t in (("ludic", lu, lt), ("trl", trl, tt)):
        print(f"[grpo] {name:5s} {t:7.2f} s/step   (steps: {', '.join(f'{x:.1f}' for x in side['times'])}; "
              f"tokens/step generated {mean(side['generated']):.0f}, trained {mean(side['trained']):.0f})")
    g_l, g_t = mean(lu["generated"]), mean(trl["generated"])
    tr_l, tr_t = mean(lu["trained"]), mean(trl["trained"])
    within = abs(g_l - g_t) <= 0.1 * max(g_l, g_t, 1) and abs(tr_l - tr_t) <= 0.1 * max(tr_l, tr_t, 1)
    print(f"[grpo] generated = trained on each side: ludic {'yes' if lu['generated'] == lu['trained'] else 'no'}, "
          f"trl {'yes' if trl['generated'] == trl['trained'] else 'no'}; ludic vs TRL tokens/step within 10%: "
          f"{'yes' if within else 'NO'} (sampling differs, so totals match only in expectation)")
    print(f"[grpo] ratio  TRL / Ludic = {tt / lt:.2f}x")
    rows = [row("a", "GRPO step s (TRL GRPOTrainer / Ludic)", lt, tt, tt / lt, unit="s", goal=">=5x",
                met=at_least(tt / lt, 5.0)),
            row("a", "completion tokens per step (Ludic / TRL)", tr_l, tr_t, tr_l / tr_t if tr_t else None)]
    return {"workload": {**w, "steps": steps, "dtype": dtype}, "ludic": lu, "trl": trl, "ratio": tt / lt,
            "tokens_within_10pct": within, "rows": rows}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="timed steps after 1 warm-up (default 3; 1 with --quick)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--quick", action="store_true", help="1 prompt x 4 completions of <= 8 tokens, 1 step")
    ap.add_argument("--trl-gradient-checkpointing", action="store_true",
                    help="TRL's own default (off here: Ludic does not checkpoint activations either)")
    ap.add_argument("--profile", action="store_true",
                    help="only the Ludic side: 1 warm-up + 1 step under torch.profiler; print where the time goes")
    args = ap.parse_args()
    if args.profile:
        from ludic.inference.models import packaged_model_dir, resolve_dtype

        w = workload(args.quick)
        lu = bench_ludic(str(packaged_model_dir()), 1, resolve_dtype(args.dtype), profile=True,
                         prompts_per_step=w["prompts"], group_size=w["group_size"], max_tokens=w["max_tokens"])
        print(f"[grpo] ludic profiled step {lu['times'][0]:.2f} s: generation {lu['split'][0]['generation_s']:.2f} s, "
              f"training {lu['split'][0]['train_s']:.2f} s (profiler overhead included)")
        print(lu["profile"])
        return
    out = run(args.steps, args.dtype, quick=args.quick, trl_gradient_checkpointing=args.trl_gradient_checkpointing)
    print(format_table(out["rows"]))


if __name__ == "__main__":
    main()
