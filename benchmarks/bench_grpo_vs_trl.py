"""GRPO step time, Ludic vs TRL, same model, same CPU, same workload, one run.

Workload (the GUIDE's TRL baseline): SmolLM2-135M-Instruct, LoRA r16 / alpha 32 on all linear
layers, 16 completions per step (2 prompts x 8), at most 32 completion tokens, temperature 1,
lr 1e-5, no KL term, bf16 where the CPU has native bf16 (else float32), no gradient checkpointing
(TRL 1.x turns it on by default; ``--trl-gradient-checkpointing`` restores that). One precision
scheme on both sides, printed with the results: bf16 frozen base weights and compute, fp32 LoRA
adapters and AdamW state (Ludic: ``training.precision``; TRL: peft's fp32 adapters and ``bf16=True``,
accelerate's mixed precision, also on CPU). Prompts are the
tic-tac-toe recipe's system prompt plus a compact board. The reward only needs variance
(distinct characters / 32), so both trainers do real updates. A step is generation + scoring
+ one optimizer step on both sides.

    python benchmarks/bench_grpo_vs_trl.py [--steps 3] [--dtype auto] [--quick]
    python benchmarks/bench_grpo_vs_trl.py --gpu          # one CUDA GPU: see below

``--gpu`` (the issue's GPU table; CI never runs it): the same workload on a model scaled to about
1B parameters, Ludic sampling from an in-process vLLM engine (``VLLMEngineClient``, the LoRA adapter
pushed after every step) and training on the GPU, against TRL's GRPOTrainer with vLLM in colocate
mode. With no model hub on such a machine, the model is ``random:llama-1b``: the packaged model's
tokenizer under a randomly initialised Llama of Llama-3.2-1B's shape (same FLOPs and bytes as a
trained model of that shape; random weights rarely stop early, so both sides generate the full 32
tokens). ``--model``, ``--engine``, ``--device`` and ``--trl-vllm`` set the parts one by one.

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

from benchmarks.common import at_least, format_table, precision_of, row  # noqa: E402

LORA = {"r": 16, "alpha": 32, "targets": "all-linear"}
LR = 1e-5
SEED = 42
"""Both sides: TRL's trainer seed (its default), Ludic's LoRA init and sampling seeds."""


SHAPES: dict[str, dict[str, Any]] = {
    "llama-1b": {"hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
                 "num_key_value_heads": 8, "head_dim": 64, "rope_theta": 500000.0, "tie_word_embeddings": True},
    "tiny": {"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2, "num_attention_heads": 4,
             "num_key_value_heads": 2, "head_dim": 16, "tie_word_embeddings": True},
}
"""Model shapes for ``random:<name>`` (Llama architecture, the packaged tokenizer's vocabulary): with
that 49152-token vocabulary ``llama-1b`` has 1.07B parameters; ``tiny`` is for tests."""


def random_model(shape: str, root: Path | None = None) -> Path:
    """A folder holding a seeded, randomly initialised Llama of ``SHAPES[shape]`` in bf16, with the
    packaged model's tokenizer and chat template (made once, then reused from ``root``, by default
    Ludic's cache). For speed comparisons on machines without a model hub."""
    import shutil

    import torch
    import transformers

    from ludic.inference.models import cache_dir, packaged_model_dir

    if shape not in SHAPES:
        raise SystemExit(f"unknown model shape {shape!r} (random:<shape>): choose from {', '.join(SHAPES)}")
    out = (root or cache_dir() / "models") / f"random-{shape}"
    if (out / "config.json").exists():
        return out
    src = packaged_model_dir()
    base = transformers.AutoConfig.from_pretrained(src)
    cfg = transformers.LlamaConfig(**{**base.to_dict(), **SHAPES[shape], "architectures": ["LlamaForCausalLM"],
                                      "torch_dtype": "bfloat16"})
    torch.manual_seed(SEED)
    model = transformers.LlamaForCausalLM(cfg).to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for f in src.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template", "generation_config")):
            shutil.copy(f, tmp / f.name)
    tmp.rename(out)
    return out


def model_dir_for(spec: str | None) -> str:
    """``None``: the packaged model; ``random:<shape>``: ``random_model(shape)``; else a folder or name."""
    from ludic.inference.models import packaged_model_dir

    if spec is None:
        return str(packaged_model_dir())
    if spec.startswith("random:"):
        return str(random_model(spec.split(":", 1)[1]))
    return spec


def workload(quick: bool = False) -> dict[str, int]:
    """Prompts per step, completions per prompt, completion token limit (--quick: 1 x 4, 8 tokens)."""
    return {"prompts": 1, "group_size": 4, "max_tokens": 8} if quick else {"prompts": 2, "group_size": 8, "max_tokens": 32}


def reward_text(text: str) -> float:
    return len(set(text)) / 32.0


def prompts(n: int) -> list[list[dict]]:
    from ludic.tictactoe.env import TicTacToeEnv
    from ludic.tictactoe.prompts import SYSTEM_PROMPT

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
              "gradient_checkpointing", "seed", "vllm_mode", "vllm_gpu_memory_utilization")


def bench_trl(model_dir: str, steps: int, dtype: str, *, prompts_per_step: int = 2, group_size: int = 8,
              max_tokens: int = 32, gradient_checkpointing: bool = False, device: str = "cpu",
              use_vllm: bool = False) -> dict[str, Any]:
    """TRL's GRPOTrainer for 1 warm-up + ``steps`` steps; seconds and token totals of the timed steps.

    TRL 1.x turns gradient checkpointing on by default; Ludic's trainer does not, so it is off here
    unless ``gradient_checkpointing`` (the same work on both sides). ``device="cuda"`` trains on the
    GPU (bf16 mixed precision when ``dtype`` is bfloat16); ``use_vllm`` samples with vLLM in colocate
    mode (TRL syncs weights into vLLM's model runner, which vLLM's CPU backend does not support: a
    GPU only)."""
    if use_vllm and device != "cuda":
        raise SystemExit("TRL's colocated vLLM (use_vllm) needs a GPU: run with --device cuda")
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
        use_cpu=device == "cpu", bf16=dtype == "bfloat16", report_to="none",
        logging_steps=1000, save_strategy="no", beta=0.0, disable_tqdm=True, shuffle_dataset=False,
        model_init_kwargs={"dtype": getattr(torch, dtype)},  # the weights in Ludic's dtype on every device
        gradient_checkpointing=gradient_checkpointing, seed=SEED,
        **({"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.3} if use_vllm else {}),
    )
    lora = LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"], target_modules=LORA["targets"], task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model_dir, reward_funcs=reward, args=args, train_dataset=ds, peft_config=lora,
                          callbacks=[Clock()])
    tok = trainer.processing_class
    tok = getattr(tok, "tokenizer", tok)
    eos_ids.update(i for i in (tok.eos_token_id, tok.pad_token_id) if i is not None)
    cfg = {"model": model_dir, "dtype": dtype, "device": device, "threads": torch.get_num_threads(),
           "prompts per step": prompts_per_step, "completions per step": n,
           "lora": f"r{LORA['r']} alpha {LORA['alpha']} {LORA['targets']}", "reward": "distinct chars / 32",
           **{k: getattr(args, k, None) for k in TRL_FIELDS}}
    show("TRL GRPOTrainer", cfg)
    trainer.train()
    cfg["precision"] = precision_of(trainer.model, trainer.optimizer, "bfloat16" if args.bf16 else None)
    return {"times": times[1:], "generated": generated[1:], "trained": trained[1:], "config": cfg}


def bench_ludic(model_dir: str, steps: int, dtype: str, *, prompts_per_step: int = 2, group_size: int = 8,
                max_tokens: int = 32, profile: bool = False, engine_kind: str = "transformers",
                device: str = "cpu") -> dict[str, Any]:
    """Ludic's Trainer (RolloutBatchSource over an in-process engine, GRPO preset) for 1 warm-up +
    ``steps`` steps; seconds (with the generation / training split) and token totals of the timed
    steps. ``engine_kind``: ``transformers`` (the TransformersEngine sharing the trained model: a
    publish is a version tag) or ``vllm`` (a ``VLLMEngineClient``; the LoRA adapter is saved and
    loaded as a new ``LoRARequest`` after every step, inside the timed step). ``device``: where the
    policy trains. ``profile``: the last step runs under ``torch.profiler``, its top operators by
    self CPU time are returned as ``profile`` (a table)."""
    import torch

    from ludic.agents.agent import Agent
    from ludic.context import make_context
    from ludic.envs.prompt_env import register_reward
    from ludic.inference.client import SamplingParams
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.tictactoe.prompts import SYSTEM_PROMPT
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.algorithms import make_algorithm
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer, TrainerConfig
    from ludic.types import EnvSpec, RolloutRequest

    register_reward("bench_text", lambda prompt, completion: reward_text(completion))
    lora = LoraSettings(rank=LORA["r"], alpha=LORA["alpha"], target_modules=LORA["targets"])
    random.seed(SEED)  # unseeded sampling rows draw their seeds from here (token totals still vary by run)
    model, tok = load_policy(model_dir, lora=lora, dtype=dtype, seed=SEED, device=device)
    if engine_kind == "vllm":
        from ludic.inference.vllm_engine import VLLMEngineClient

        gpu = {"gpu_memory_utilization": 0.3} if device == "cuda" else {}
        engine: Any = VLLMEngineClient(model_dir, dtype=dtype, enable_lora=True, max_lora_rank=LORA["r"],
                                       seed=SEED, max_model_len=1024, **gpu)
        engine_desc = "VLLMEngineClient (in-process vLLM), LoRA adapter pushed every step"
    elif engine_kind == "transformers":
        engine = TransformersEngine(model, tok)
        engine_desc = f"TransformersEngine max_batch_size={engine.max_batch_size}"
    else:
        raise SystemExit(f"unknown engine {engine_kind!r}: transformers or vllm")
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
    cfg = {"model": model_dir, "dtype": dtype, "device": device, "threads": torch.get_num_threads(),
           "prompts per step": prompts_per_step, "completions per step": prompts_per_step * group_size,
           "lora": f"r{lora.rank} alpha {lora.alpha} {lora.target_modules}", "reward": "distinct chars / 32",
           "sampling": dataclasses.asdict(sampling), "context": "last observation + system prompt",
           "engine": engine_desc,
           "algorithm": algo.describe(), "trainer": dataclasses.asdict(tcfg), "seed": SEED}
    show("Ludic", cfg)
    try:
        out = timed_steps(trainer, source, steps, profile)
    finally:
        if engine_kind == "vllm":
            engine.close()
    cfg["precision"] = precision_of(model, trainer.optimizer)
    return {**out, "config": cfg}


def timed_steps(trainer: Any, source: Any, steps: int, profile: bool = False) -> dict[str, Any]:
    """1 warm-up + ``steps`` steps of ``trainer``: each timed step's seconds, generated and trained
    completion tokens and generation / training split (the warm-up left out); with ``profile`` the
    last step runs under torch.profiler and its top operators are returned as ``profile``."""
    import torch
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    cuda = torch.cuda.is_available()
    times, generated, trained, split, table = [], [], [], [], None
    for k in range(steps + 1):
        profiled = profile and k == steps
        with (torch_profile(activities=[ProfilerActivity.CPU]) if profiled else contextlib.nullcontext()) as prof:
            t0 = time.perf_counter()
            m = asyncio.run(trainer.train_step())
            if cuda:  # the step's GPU work is done before the clock stops
                torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
        if profiled:
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=20)
        generated.append(sum(len(s.trace.completion_ids) for r in source.last_rollouts for s in r.steps if s.trace))
        trained.append(int(m["action_tokens"]))
        split.append({"generation_s": float(m.get("generation_s", 0.0)), "train_s": float(m.get("train_s", 0.0))})
    return {"times": times[1:], "generated": generated[1:], "trained": trained[1:], "split": split[1:],
            "profile": table}


def mean(xs: list[float]) -> float:
    return statistics.mean(xs) if xs else float("nan")


GPU = {"model": "random:llama-1b", "engine": "vllm", "device": "cuda", "trl_vllm": True}
"""``--gpu``: the issue's GPU configuration of part (a)."""


def run(steps: int | None = None, dtype: str = "auto", *, quick: bool = False,
        trl_gradient_checkpointing: bool = False, model: str | None = None, engine: str = "transformers",
        device: str = "cpu", trl_vllm: bool = False) -> dict[str, Any]:
    """Both sides, one after the other; part (a) of the runner. ``model``: see ``model_dir_for``;
    ``engine``: Ludic's sampler (``bench_ludic``); ``device``: where both sides train;
    ``trl_vllm``: TRL samples with colocated vLLM (a GPU only)."""
    from ludic.inference.models import resolve_dtype

    steps = steps or (1 if quick else 3)
    w = workload(quick)
    model_dir, dtype = model_dir_for(model), resolve_dtype(dtype)
    kw = {"prompts_per_step": w["prompts"], "group_size": w["group_size"], "max_tokens": w["max_tokens"]}
    lu = bench_ludic(model_dir, steps, dtype, engine_kind=engine, device=device, **kw)
    trl = bench_trl(model_dir, steps, dtype, gradient_checkpointing=trl_gradient_checkpointing, device=device,
                    use_vllm=trl_vllm, **kw)
    lt, tt = statistics.median(lu["times"]), statistics.median(trl["times"])
    n = w["prompts"] * w["group_size"]
    setup = "" if (model, engine, device, trl_vllm) == (None, "transformers", "cpu", False) else \
        f" [{device}; {model or 'packaged model'}; Ludic {engine}, TRL {'vLLM' if trl_vllm else 'generate'}]"
    print(f"[grpo] dtype {dtype}; {n} completions (<= {w['max_tokens']} tokens) per step; LoRA r16; "
          f"median of {steps} steps after 1 warm-up{setup}")
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
    print(f"[grpo] precision: ludic {lu['config']['precision']} | trl {trl['config']['precision']}")
    print(f"[grpo] ratio  TRL / Ludic = {tt / lt:.2f}x")
    rows = [row("a", f"GRPO step s (TRL GRPOTrainer / Ludic){setup}", lt, tt, tt / lt, unit="s", goal=">=5x",
                met=at_least(tt / lt, 5.0)),
            row("a", "completion tokens per step (Ludic / TRL)", tr_l, tr_t, tr_l / tr_t if tr_t else None)]
    return {"workload": {**w, "steps": steps, "dtype": dtype, "model": model_dir, "engine": engine, "device": device,
                         "trl_vllm": trl_vllm}, "ludic": lu, "trl": trl, "ratio": tt / lt,
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
    ap.add_argument("--model", default=None, help="a model folder or name, or random:<shape> "
                    f"({', '.join(SHAPES)}); default: the packaged SmolLM2-135M-Instruct")
    ap.add_argument("--engine", default="transformers", choices=["transformers", "vllm"], help="Ludic's sampler")
    ap.add_argument("--device", default="cpu", choices=["cpu", "cuda"], help="where both sides train")
    ap.add_argument("--trl-vllm", action="store_true", help="TRL samples with colocated vLLM (a GPU only)")
    ap.add_argument("--gpu", action="store_true", help="the GPU table: " + ", ".join(f"{k} {v}" for k, v in GPU.items()))
    args = ap.parse_args()
    setup = dict(GPU) if args.gpu else {"model": args.model, "engine": args.engine, "device": args.device,
                                        "trl_vllm": args.trl_vllm}
    if args.profile:
        from ludic.inference.models import resolve_dtype

        w = workload(args.quick)
        lu = bench_ludic(model_dir_for(setup["model"]), 1, resolve_dtype(args.dtype), profile=True,
                         engine_kind=setup["engine"], device=setup["device"],
                         prompts_per_step=w["prompts"], group_size=w["group_size"], max_tokens=w["max_tokens"])
        print(f"[grpo] ludic profiled step {lu['times'][0]:.2f} s: generation {lu['split'][0]['generation_s']:.2f} s, "
              f"training {lu['split'][0]['train_s']:.2f} s (profiler overhead included)")
        print(lu["profile"])
        return
    out = run(args.steps, args.dtype, quick=args.quick, trl_gradient_checkpointing=args.trl_gradient_checkpointing,
              **setup)
    print(format_table(out["rows"]))


if __name__ == "__main__":
    main()
