"""QA and math: ``ludic train qa`` (GRPO on graded answers) and ``ludic eval qa`` (accuracy, pass@k).

    ludic eval qa --data arith --split test --limit 100                accuracy of the packaged model
    ludic train qa --data arith --train-steps 30                        GRPO, evaluated before and after
    ludic train qa --data openai/gsm8k --grader math --max-completion-tokens 256
    ludic train qa --data arith --tools                                 with a calculator tool (ToolAgent)

Both commands build their agents with ``make_qa_agent`` from the same config
fields (``answer``, ``grader``, ``template``, ``tools``), so the reward the
trainer sees and the accuracy the evaluation reports read answers with the
same parser and grade them with the same grader. Each evaluated sample is
written to a JSONL file (question, reply, parsed answer, correct).
"""

from __future__ import annotations

import asyncio
import json
import random
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Sequence

from ludic.recipes.blocks import (EvalInferenceBlock, GRPOBlock, InferenceBlock, LoraBlock, ModelBlock, TrainRunBlock,
                                  kept_summary, load_policy_for)
from ludic.recipes.common import may_evaluate, train_until_stop
from ludic.eval.stats import pass_at_k  # noqa: F401  (re-exported: its home before eval.stats)
from ludic.training.config import TrainerConfig
from ludic.types import Rollout

DEFAULT_TEMPLATE = "{question}\nReply with the answer as a number only."
TOOL_TEMPLATE = "{question}\nUse the calculator tool, then reply with the answer as a number only."


@dataclass
class QAOptions:
    """How questions are shown, answers read and graded (shared by train and eval)."""

    data: str = "arith"
    """``arith`` (generated word problems), a .jsonl/.parquet file, or a hub id such as openai/gsm8k."""
    question_key: str = "question"
    answer_key: str = "answer"
    grader: str = "math"
    """exact | numeric | math."""
    answer: str = "auto"
    """How the answer is read from the reply: auto | boxed | hash | number."""
    template: str = ""
    """How a question is shown ({question}); default: the question and 'Reply with the answer as a number only.'"""
    system_prompt: str | None = None
    tools: bool = False
    """Give the agent a calculator tool (ToolAgent); the template then asks it to use the tool."""
    max_tool_calls: int = 2
    max_completion_tokens: int = 16
    parse_penalty: float = 0.0
    """Reward of a reply with no answer in it."""

    def question_template(self) -> str:
        return self.template or (TOOL_TEMPLATE if self.tools else DEFAULT_TEMPLATE)


def make_qa_agent(client: Any, opts: QAOptions, sampling: Any) -> Any:
    """The agent both ``ludic train qa`` and ``ludic eval qa`` use: one parser, one format."""
    from ludic.agents.agent import Agent
    from ludic.context import FullDialog
    from ludic.envs.qa import calculator, make_answer_parser

    parser = make_answer_parser(opts.answer, opts.parse_penalty)
    ctx = FullDialog(opts.system_prompt)
    if opts.tools:
        from ludic.agents.tools import ToolAgent

        return ToolAgent(client, [calculator], ctx, parser, sampling, max_tool_calls=opts.max_tool_calls,
                         reject_incomplete=False)
    return Agent(client, ctx, parser, sampling, reject_incomplete=False)


def qa_requests(opts: QAOptions, records: Sequence[dict], **kw: Any) -> list[Any]:
    """One request per record (``kw`` goes to RolloutRequest: group ids, seeds)."""
    from ludic.types import EnvSpec, RolloutRequest

    steps = 1 + (opts.max_tool_calls + 1 if opts.tools else 0)
    return [RolloutRequest(EnvSpec("qa", {"question": r["question"], "answer": r["answer"], "grader": opts.grader,
                                          "template": opts.question_template(), "id": r["id"]}),
                           max_steps=steps, meta={"record_id": r["id"]}, **kw) for r in records]


async def tool_demo_items(opts: QAOptions, records: Sequence[dict], tokenizer: Any) -> list[Any]:
    """SFT items from a teacher playing the tool agent on ``records`` (each needs ``expression``): it calls
    the calculator on the expression, then answers with the tool's result. The transcripts go through the
    real ToolAgent, protocol and chat template, so the trained tokens are those the model will produce;
    only episodes the grader marks correct are kept."""
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import SAWItem

    missing = [r["id"] for r in records if not r.get("expression")]
    if missing:
        raise ValueError(f"--tool-demos needs an 'expression' per record; {len(missing)} lack one, e.g. {missing[0]!r}")
    template = opts.question_template()
    expressions = {template.format(question=r["question"]): r["expression"] for r in records}

    def teacher(messages: list[dict]) -> str:
        last = messages[-1]
        if last["role"] == "tool":
            return last["content"]
        call = {"name": "calculator", "arguments": {"expression": expressions[last["content"]]}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"

    client = FunctionClient(tokenizer, teacher)
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(
        make_qa_agent(client, opts, SamplingParams(temperature=0.0, max_tokens=opts.max_completion_tokens)))})
    rollouts = await engine.generate_rollouts(qa_requests(opts, records), progress="tool demos")
    return [SAWItem(prompt_ids=s.trace.prompt_ids, completion_ids=s.trace.completion_ids, weight=1.0,
                    meta={"record_id": r.meta.get("record_id")})
            for r in rollouts if r.steps and r.steps[-1].info.get("correct") for s in r.steps if s.trace is not None]


def _outcome(r: Rollout) -> dict[str, Any]:
    last = r.steps[-1] if r.steps else None
    info = last.info if last is not None else {}
    return {
        "id": r.meta.get("record_id"), "correct": bool(info.get("correct", False)),
        "parsed": last.parsed_action if last is not None else None,
        "reply": last.action if last is not None else "", "reference": info.get("reference"),
        "tool_calls": sum(len(s.info.get("tool_calls", [])) for s in r.steps),
        "failed": bool(r.meta.get("failed")), "parse_error": any(s.parse_error for s in r.steps),
    }


def qa_metrics(outcomes: Sequence[dict], samples: int, ks: Sequence[int]) -> dict[str, Any]:
    """accuracy (mean over samples) with its 95% interval over records, pass@k (k in ``ks`` up to ``samples``) and
    majority vote over the parsed answers (``eval.samples.sample_summary``), parse-error rate."""
    from ludic.eval.samples import SAMPLE_METRICS, SampleOutcome, normalize_answer, sample_summary

    drawn: dict[Any, int] = {}  # samples of each record so far
    samples_of = []
    for o in outcomes:
        drawn[o["id"]] = j = drawn.get(o["id"], -1) + 1
        samples_of.append(SampleOutcome(problem=o["id"], sample=j, success=bool(o["correct"]),
                                        reward=None if o["failed"] else float(o["correct"]),
                                        answer=normalize_answer(o["parsed"])))
    m = sample_summary(samples_of, ks=[k for k in ks if k <= samples])
    n = max(len(outcomes), 1)
    return {
        "records": m["problems"], "samples": samples, "accuracy": m["success_rate"],
        "accuracy_ci95_low": m["success_ci95_low"], "accuracy_ci95_high": m["success_ci95_high"],
        "parse_error_rate": sum(o["parse_error"] for o in outcomes) / n,
        "failed_rate": sum(o["failed"] for o in outcomes) / n,
        "tool_calls_per_episode": sum(o["tool_calls"] for o in outcomes) / n,
        **{k: v for k, v in m.items() if k.startswith(SAMPLE_METRICS)},
        "ci95_method": {("accuracy" if k == "success_rate" else k): v for k, v in m["ci95_method"].items()
                        if k != "reward_mean"},
    }


async def evaluate_records(client: Any, opts: QAOptions, records: Sequence[dict], *, samples: int = 1,
                           temperature: float = 0.0, ks: Sequence[int] = (1,), out: Path | None = None,
                           seed: int = 0) -> dict[str, Any]:
    """Accuracy of ``client`` on ``records`` (``samples`` replies each), written to ``out`` as JSONL."""
    from ludic.data.jsonl import write_jsonl
    from ludic.inference.client import SamplingParams
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts.engine import RolloutEngine

    sampling = SamplingParams(temperature=temperature, max_tokens=opts.max_completion_tokens)
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(make_qa_agent(client, opts, sampling))},
                           concurrency=64)
    reqs = [replace(r, env_seed=0, sampling_seed=seed + 1000 * j) for j in range(samples)
            for r in qa_requests(opts, records)]
    outcomes = [_outcome(r) for r in await engine.generate_rollouts(reqs, progress="eval qa")]
    questions = {r["id"]: r["question"] for r in records}
    if out is not None:
        write_jsonl(out, [{**o, "question": questions.get(o["id"])} for o in outcomes])
    return qa_metrics(outcomes, samples, ks)


def format_metrics(name: str, m: dict[str, Any]) -> str:
    s = (f"{name}: accuracy {m['accuracy'] * 100:.1f}% (95% CI {m['accuracy_ci95_low'] * 100:.1f}-"
         f"{m['accuracy_ci95_high'] * 100:.1f}%) on {m['records']} records x {m['samples']} samples")
    s += "".join(f", {k} {v * 100:.1f}%" for k, v in m.items() if k.startswith("pass@"))
    s += f", no answer {m['parse_error_rate'] * 100:.1f}%"
    if m["tool_calls_per_episode"]:
        s += f", tool calls/episode {m['tool_calls_per_episode']:.2f}"
    return s


@dataclass
class EvalQAConfig(ModelBlock, EvalInferenceBlock):
    """Accuracy and pass@k on a QA split."""

    qa: QAOptions = field(default_factory=QAOptions)
    split: str = "test"
    limit: int = 100
    """Records evaluated (0 = all)."""
    samples: int = 1
    """Replies per record; pass@k needs samples >= k."""
    k: str = "1"
    """Comma-separated k values for pass@k."""
    temperature: float = 0.0
    out: str = "qa_eval.jsonl"
    seed: int = 0


def eval_qa(cfg: EvalQAConfig) -> dict[str, Any]:
    return asyncio.run(_eval_qa(cfg))


async def _eval_qa(cfg: EvalQAConfig) -> dict[str, Any]:
    from ludic.envs.qa import load_qa_records
    from ludic.recipes.backends import make_eval_client

    records = load_qa_records(cfg.qa.data, cfg.split, cfg.qa.question_key, cfg.qa.answer_key, cfg.limit or None)
    ks = [int(k) for k in cfg.k.split(",") if k.strip()]
    client, close = await make_eval_client(cfg)
    try:
        m = await evaluate_records(client, cfg.qa, records, samples=cfg.samples, temperature=cfg.temperature,
                                   ks=ks, out=Path(cfg.out), seed=cfg.seed)
    finally:
        await close()
    print(format_metrics(f"{cfg.qa.data} {cfg.split}", m))
    print(f"samples written to {cfg.out}")
    return m


@dataclass
class TrainQAConfig(ModelBlock, LoraBlock, GRPOBlock, InferenceBlock, TrainRunBlock):
    """GRPO on graded QA answers, with accuracy on a held-out split before and after."""

    qa: QAOptions = field(default_factory=QAOptions)
    split: str = "train"
    eval_split: str = "test"
    eval_limit: int = 100
    """Held-out records evaluated (greedy) before and after training (0: no evaluation)."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=5e-5))
    eval_every: int = 0
    """Also evaluate every N steps on the --val-limit validation records (logged as eval/*)."""
    val_limit: int = 50
    """Validation records of --eval-every / --keep-best: the eval split's records after the --eval-limit
    test ones (never trained on, and apart from the records that score the run)."""
    keep_best: bool = False
    """End on the weights of the best validation accuracy (needs --eval-every), the start (after the tool
    demos) among the candidates; the test split then scores the kept weights."""
    tool_demos: int = 0
    """With --tools: first this many SFT steps on teacher transcripts (a calculator call on the record's
    expression, then the result as the answer), written through the same agent and template; 0: none."""
    tool_demo_lr: float = 5e-4
    fsdp_mixed_precision: str = "auto"
    """Under torchrun (FSDP2): auto (compute in --dtype over fp32 shards) | bf16 | none (shard as loaded)."""


async def run_tool_demos(cfg: "TrainQAConfig", model: Any, tok: Any, records: Sequence[dict], publisher: Any) -> None:
    """The SFT cold start of ``--tool-demos``: teacher transcripts on the training records, uniform NLL on
    the teacher's tokens, ``cfg.tool_demos`` steps of ``prompts_per_step`` x group_size items."""
    from ludic.recipes.sft import demo_sft

    items = await tool_demo_items(cfg.qa, records[: max(64, cfg.tool_demos * cfg.prompts_per_step)], tok)
    batch = cfg.prompts_per_step * 2  # a tool call and an answer per record
    print(f"[qa] tool demos: {len(items)} teacher turns, {cfg.tool_demos} SFT steps", flush=True)
    await demo_sft(model, tok, items, steps=cfg.tool_demos, batch=batch, lr=cfg.tool_demo_lr, trainer=cfg.trainer,
                   logger=cfg.logger, desc="tool demos", seed=cfg.seed, publisher=publisher)


def train_qa(cfg: TrainQAConfig) -> dict[str, Any]:
    return asyncio.run(_train_qa(cfg))


async def _train_qa(cfg: TrainQAConfig) -> dict[str, Any]:
    from ludic.config import dump_config
    from ludic.distributed import broadcast_object, init_distributed, shutdown_distributed
    from ludic.envs.qa import load_qa_records
    from ludic.inference.client import SamplingParams
    from ludic.interaction import SingleAgentProtocol
    from ludic.recipes.backends import make_inference
    from ludic.recipes.grpo_prompts import reward_metrics
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.algorithms import algorithm_for
    from ludic.training.loggers import logger_names, make_logger
    from ludic.training.fsdp import shard_model
    from ludic.training.trainer import Trainer

    logger_names(cfg.logger)
    if cfg.tool_demos and not cfg.qa.tools:
        raise ValueError("--tool-demos teaches the calculator tool: add --tools")
    rank, world = init_distributed()  # under torchrun: FSDP2, each rank rolls out its share of the prompts
    if cfg.prompts_per_step % world:
        raise ValueError(f"--prompts-per-step {cfg.prompts_per_step} must be a multiple of the {world} ranks")
    records = load_qa_records(cfg.qa.data, cfg.split, cfg.qa.question_key, cfg.qa.answer_key)
    if (cfg.eval_every or cfg.keep_best) and world > 1:
        raise ValueError("--eval-every / --keep-best run on one process (the validation evaluation is rank 0's)")
    if cfg.keep_best and not (cfg.eval_every and cfg.val_limit > 0):
        raise ValueError("--keep-best needs --eval-every N and --val-limit > 0")
    n_val = cfg.val_limit if cfg.eval_every and rank == 0 else 0
    held_out = (load_qa_records(cfg.qa.data, cfg.eval_split, cfg.qa.question_key, cfg.qa.answer_key,
                                cfg.eval_limit + n_val) if (cfg.eval_limit or n_val) and rank == 0 else [])
    held_out, validation = held_out[:cfg.eval_limit], held_out[cfg.eval_limit:]
    if len(validation) < n_val:
        raise ValueError(f"split {cfg.eval_split!r} has {len(held_out) + len(validation)} records: fewer than "
                         f"--eval-limit {cfg.eval_limit} test records plus --val-limit {cfg.val_limit} validation ones")
    run_dir = Path(broadcast_object(str(cfg.resolve_run_dir("qa"))))
    if rank == 0:
        run_dir.mkdir(parents=True, exist_ok=True)
        dump_config(cfg, run_dir / "config.json")
    model, tok = load_policy_for(cfg)
    if world > 1:
        model = shard_model(model, mixed_precision=cfg.fsdp_mixed_precision if cfg.trainer.master_weights else "none")
    inf = await make_inference(cfg.inference, model, tok, cfg.model, run_dir, host=cfg.host, port=cfg.port,
                               dtype=cfg.dtype)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.qa.max_completion_tokens)
    results: dict[str, Any] = {}

    async def evaluate(stage: str) -> None:
        if held_out:
            model.eval()
            m = await evaluate_records(inf.client, cfg.qa, held_out, out=run_dir / f"eval_{stage}.jsonl")
            model.train()
            results[stage] = m
            print(format_metrics(f"[qa] {stage} ({cfg.eval_split})", m), flush=True)

    async def validate() -> dict[str, Any]:
        model.eval()
        m = await evaluate_records(inf.client, cfg.qa, validation, out=run_dir / "eval_val.jsonl")
        model.train()
        return m

    order = list(range(len(records)))
    random.Random(cfg.seed).shuffle(order)
    cursor = 0

    share = cfg.prompts_per_step // world

    def requests_fn() -> list[Any]:
        nonlocal cursor
        picked = [records[order[(cursor + rank * share + i) % len(order)]] for i in range(share)]
        cursor += cfg.prompts_per_step
        return qa_requests(cfg.qa, picked)

    algo = algorithm_for(cfg)
    source = RolloutBatchSource(
        RolloutEngine({"single_agent": lambda: SingleAgentProtocol(make_qa_agent(inf.client, cfg.qa, sampling))},
                      concurrency=64, jsonl_path=run_dir / ("rollouts.jsonl" if rank == 0 else f"rollouts.rank{rank}.jsonl")),
        requests_fn, algo.credit, strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed),
        sample_filter=algo.sample_filter, metrics_fn=reward_metrics,
    )
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps) if rank == 0 else None
    trainer = Trainer(
        model, algo, source,
        replace(cfg.trainer, total_steps=cfg.trainer.total_steps or cfg.train_steps,
                norm_max_tokens=cfg.trainer.norm_max_tokens or cfg.qa.max_completion_tokens),
        publisher=inf.publisher, logger=logger, checkpoint_dir=run_dir / "checkpoints",
        tokenizer=tok, pad_token_id=tok.pad_token_id, evaluator=validate if validation else None,
        eval_every=cfg.eval_every, keep_best="accuracy" if cfg.keep_best else "",
    )
    failure: BaseException | None = None
    try:
        if cfg.resume:
            trainer.resume()
        cursor = trainer.step * cfg.prompts_per_step  # a resumed run continues through the data
        if trainer.step == 0:
            trainer.publish_start()  # the "before" evaluation scores the starting weights as the engine serves them
            await evaluate("before")
            if cfg.tool_demos:
                await run_tool_demos(cfg, model, tok, records, inf.publisher)
                await evaluate("after_demos")
        _, failure = await train_until_stop(trainer, cfg.train_steps)
        results["stopped"] = trainer.stopped  # None: it ran every step
        if cfg.keep_best and trainer.best:
            results["kept"] = kept_summary(trainer.best, len(validation), unit="records")
        if cfg.final_save or failure is not None:  # a stopped run keeps its best weights
            trainer.save()
        if may_evaluate(failure):
            await evaluate("after")
        if "before" in results and "after" in results:
            results["accuracy_gain"] = results["after"]["accuracy"] - results["before"]["accuracy"]
        if rank == 0:
            (run_dir / "qa_results.json").write_text(json.dumps(results, indent=2))
    finally:
        if logger is not None:
            logger.close()  # writes report.html, with the results above
        await inf.close()
        shutdown_distributed()
    if failure is not None:
        raise failure
    return {**results, "run_dir": str(run_dir), "steps": trainer.step}
