"""Any environment, one command: ``ludic train env`` / ``ludic eval env``, and ``ludic.train(env)`` in Python.

    ludic train env --env reasoning_gym:leg_counting
    ludic train env --env textarena:GuessTheNumber-v0 --max-completion-tokens 32
    ludic train env --env textarena:TicTacToe-v0 --opponent frozen     two players: vs the starting policy
    ludic train env --env gem:game:Mastermind-v0-easy
    ludic train env --env my_package.envs:MyEnv --env-kwargs '{"size": 5}'
    ludic train env --env verifiers:my_taskset                           a verifiers environment, its rubric the reward
    ludic train env --env my_package.envs:MyEnv --tools my_package.tools:lookup   the agent may call lookup(...)
    ludic eval env --env reasoning_gym:leg_counting --adapter runs/env-.../final

``--env`` takes every env kind ``ludic.envs.registry`` knows: a registered name, an adapter prefix
(``textarena:``, ``reasoning_gym:``, ``verifiers:``, ``gem:``, ``gym:``) or an import path to a ``LudicEnv`` factory.
``--tools`` gives the agent Python functions to call (``ToolAgent``; an env's own tools, as a verifiers toolset's,
join them).

The run: the packaged model with a LoRA adapter, GRPO (groups of ``group_size`` episodes from one env
seed), the env's own rewards. It evaluates greedily on held-out seeds (``eval_episodes``) before and
after training, and every ``eval_every`` steps on validation seeds apart from those (what ``keep_best``
chooses on, the start among the candidates); the headline is the success rate
(``info["success"]`` of an episode's last step, else a positive total reward) with its 95% interval,
beside the mean reward. A multi-player env is played by self-play (``--opponent self``: every seat is
the policy and trains) or against a frozen copy of the starting policy (``--opponent frozen``: the
trained seat alternates); it is evaluated against that frozen copy either way.

``format_demos``: a format cold start for any env. Give example replies (a .jsonl of ``{"reply": ...}``
or a .txt, one per line: a teacher answers each turn with one of them) or a function
``observation -> reply`` (``module:function``, or a callable in Python); a short SFT on those turns,
through the same agent and chat template, runs before RL. Use it when the model never writes the
format the env reads: the trainer stops after ``max_no_signal_steps`` steps without any learning
signal and says so.

The env side (``EnvConfig``, the protocols, the episode metrics and the held-out evaluation) is in
``ludic.recipes.env_setup``, which the env pipeline (``recipes.env_pipeline``) shares.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import statistics
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from ludic.errors import TrainingStopped, UsageError
from ludic.eval.samples import constant_answer_warning, expand_samples
from ludic.recipes.blocks import GRPOBlock, LoraBlock, ModelBlock, TrainRunBlock, kept_summary, load_policy_for
from ludic.recipes.common import StepBudget, default_run_dir, machine, may_evaluate, train_until_stop
from ludic.recipes.env_setup import (INSTANCES_FILE, EnvConfig, HalfwaySnapshot, TrainingSeeds, env_metrics,
                                     eval_requests, evaluate_episodes, format_summary, held_out_for, opponent_suite,
                                     probe_env, protocols, register_python_env, tool_spec, trained_overlap,
                                     write_instances)
from ludic.recipes.format_demos import format_demo_items
from ludic.training.config import TrainerConfig

PARTIAL_FILE = "summary.partial.json"
"""The results so far (each test stage as it is measured): a resumed run's summary keeps its earlier stages."""


@dataclass
class TrainEnvConfig(ModelBlock, LoraBlock, GRPOBlock, TrainRunBlock):
    """GRPO + LoRA on any environment, evaluated on held-out seeds before and after."""

    env: EnvConfig = field(default_factory=EnvConfig)
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=2e-4))
    """lr 2e-4, full steps: on reasoning-gym gcd (values 2-40, seed 0, 30 steps) 5e-5 left the sampled reward
    flat (0.16 -> 0.19 over 5-step windows) and 2e-4 doubled it (0.15 -> 0.34). Steps scaled by signal
    (``--scale-lr-by-signal``) hold a good policy (the calculator tool after its demo SFT: plain 2e-4 lost
    28-33 points on two seeds of three in 10 steps, scaled none), but from a weak one they learned less or
    not at all in 30 steps (chain_sum 23.2% against 25.3%, Kuhn poker 45.3% = its start against 68.8%), so
    the default keeps full steps and guards a good start with ``keep_best`` on validation episodes (docs/studies.md)."""
    eval_episodes: int = 64
    """Held-out episodes (greedy) before and after training; 0: no evaluation."""
    eval_every: int = 5
    """Also evaluate every N steps on the validation episodes (logged as eval/*; 0: before and after only). With
    --train-steps given it sets the validation cadence; when the budget alone decides, validation goes by the clock."""
    val_episodes: int = 32
    """Validation episodes (greedy) of the evaluations during training (--eval-every): held-out seeds apart
    from the test ones (``env_setup.VAL_SEED_FIRST``), so --keep-best does not choose on the test."""
    keep_best: bool = True
    """End on the weights of the best validation evaluation (by success rate; off when --eval-every is 0), the start
    (step 0) among the candidates; the summary and the report show the last step's validation score beside
    the kept one, and the test episodes score the kept weights."""
    format_demos: str = ""
    """Example replies (.jsonl / .txt) or module:function (observation -> reply) for a format cold start."""
    format_demo_steps: int = 10
    format_demo_epochs: float = 1.0
    """Passes over the format demos in ``format_demo_steps`` steps (each step takes ``demos x epochs / steps``)."""
    format_demo_lr: float = 2e-4
    budget_minutes: float = 30.0
    """The run's time budget, evaluations included (``recipes.common.StepBudget``): steps go on while one more and
    the closing evaluation fit, validation evaluations come every 1/8 of it (unless --train-steps is given:
    then --eval-every); 0: no budget (``--train-steps`` decides)."""
    train_steps: int = 0
    """At most this many optimizer steps (0: the budget decides)."""
    prompts_per_step: int = 8
    """Prompts (env seeds) per step, each sampled group_size times. 8, not the block's 4: in 30-minute runs of the
    held-out study 4 left reasoning-gym gcd 2-99 collapsing toward one answer (it learned at 1 of 3 seeds in bf16,
    0 of 3 in fp32) and 8 learned it at 3 of 3 in bf16 (0 of 2 in fp32); chain_sum and products ended 3-5 points
    higher at one seed each (docs/study.md, "The defaults, measured")."""


@dataclass
class EvalEnvConfig(ModelBlock):
    """Success rate and mean reward of a policy on held-out episodes of any environment."""

    env: EnvConfig = field(default_factory=EnvConfig)
    episodes: int = 64
    """Test instances (``held_out_for``: distinct ones, the test set ``ludic train env`` holds out)."""
    samples: int = 1
    """Episodes per test instance, each with its own sampling seed: pass@k (k = 1, 2, 4, ..., samples), mean success
    and majority vote (``eval.samples``); more than 1 wants --temperature above 0."""
    temperature: float = 0.0
    out: str = ""
    """The episodes' JSONL (one rollout a line, ``meta.problem`` / ``meta.sample``), its summary beside it
    (``<stem>.summary.json``); default: a new run folder ``runs/eval-<time>/`` (samples.jsonl, summary.json)."""
    seed: int = 0


# -------------------------------------------------------------------------------------------- train


@dataclass
class TrainResult:
    """What ``ludic.train`` returns: the trained policy and where its run lives."""

    model: Any
    tokenizer: Any
    run_dir: Path
    results: dict[str, Any]


def run_length(cfg: Any) -> str:
    """What the run's length will be, said before it starts: the budget bounds it; a step count alone is timed
    from its first step (the ETA in the step log)."""
    steps = f"at most {cfg.train_steps} steps" if cfg.train_steps else "as many steps as fit"
    if cfg.budget_minutes:
        return (f"run length: at most about {cfg.budget_minutes:g} minutes (--budget-minutes, set-up and "
                f"evaluations included), {steps}")
    return (f"run length: {cfg.train_steps} steps and no time budget: the step log's ETA follows the first step "
            "(--budget-minutes N bounds the time instead)")


def train(env: Any, *, model: str | None = None, format_demos: Any = None, tools: Any = None,
          **overrides: Any) -> TrainResult:
    """Train a policy on ``env`` with the defaults of ``ludic train env``, from Python.

    ``env``: an env kind string, a ``LudicEnv`` class or a factory. ``overrides`` set fields of
    ``TrainEnvConfig``, of its ``env`` section (``max_completion_tokens=``, ``env_kwargs=`` as a dict)
    or of its ``trainer`` section (``lr=``). ``format_demos``: example replies' file, or a function
    ``observation -> reply`` (a format cold start). ``tools``: Python functions the agent may call (Ludic's
    ``ToolAgent``: schemas from their signatures and docstrings, results as tool messages); the config records
    each as ``module:function`` (``python:<module>.<name>`` for one that does not import back).

        result = ludic.train(GuessEnv, train_steps=20, max_completion_tokens=24)
        result.results["trained"]["success_rate"], result.run_dir   # also "base", "format_demos", "kept", ...
    """
    cfg = TrainEnvConfig()
    env_cfg, trainer_cfg = cfg.env, cfg.trainer
    kind = env if isinstance(env, str) else register_python_env(env)
    env_over = {"env": kind}
    if tools is not None:
        env_over["tools"] = tools if isinstance(tools, str) else ",".join(tool_spec(t) for t in tools)
    for k, v in overrides.items():
        if k == "env_kwargs" and isinstance(v, dict):
            v = json.dumps(v)
        if k in TrainEnvConfig.__dataclass_fields__:
            setattr(cfg, k, v)
        elif k in EnvConfig.__dataclass_fields__:
            env_over[k] = v
        elif k in TrainerConfig.__dataclass_fields__:
            trainer_cfg = replace(trainer_cfg, **{k: v})
        else:
            raise TypeError(f"ludic.train: unknown setting {k!r} (fields of TrainEnvConfig, EnvConfig, TrainerConfig)")
    cfg.env, cfg.trainer = replace(env_cfg, **env_over), trainer_cfg
    if model is not None:
        cfg.model = model
    if callable(format_demos):  # config.json names the teacher (it recorded "" for a function)
        cfg.format_demos = tool_spec(format_demos).replace("python:", "python function ", 1)
    return _run_train(cfg, format_demos if format_demos is not None else (cfg.format_demos or None))


def train_env(cfg: TrainEnvConfig) -> dict[str, Any]:
    """``ludic train env``."""
    result = _run_train(cfg, cfg.format_demos or None)
    return {**result.results, "run_dir": str(result.run_dir)}


def _run_train(cfg: TrainEnvConfig, teacher: Any) -> TrainResult:
    """The run, under ``cfg.trainer.fast_path`` throughout: every evaluation and the format demos too, not only
    the trainer's steps (``ludic.train(fast_path=False)`` has no CLI parsing to turn the process off)."""
    from ludic import fastpath

    with fastpath.scoped(cfg.trainer.fast_path):
        return asyncio.run(_train(cfg, teacher))


async def _train(cfg: TrainEnvConfig, teacher: Any = None) -> TrainResult:
    from ludic.config import dump_config
    from ludic.inference.client import SamplingParams
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.algorithms import algorithm_for
    from ludic.training.loggers import logger_names, make_logger
    from ludic.training.trainer import Trainer

    logger_names(cfg.logger)
    if not cfg.budget_minutes and not cfg.train_steps:
        raise UsageError("give --budget-minutes (the run's time budget) or --train-steps (a step count)")
    env = probe_env(cfg.env)
    run_dir = cfg.resolve_run_dir("env")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    model, tok = load_policy_for(cfg)
    engine = TransformersEngine(model, tok)
    train_protos, eval_protos, frozen = play_protocols(cfg, env, engine, model, tok)
    results: dict[str, Any] = {"env": cfg.env.env, "metric": "success_rate"}
    wall: dict[str, float] = {}
    """Seconds per part of this process's run (a resumed run counts from its resume)."""
    start = time.monotonic()
    held = held_out_for(cfg.env, cfg.eval_episodes, cfg.val_episodes if cfg.eval_every else 0, cfg.seed)
    print(f"[env] instances: {held.note()}", flush=True)
    if not held.held_out:
        print(f"[env] WARNING: results on this env are on TRAINED instances, not held out: {held.note()}", flush=True)
    held_out = eval_requests(cfg.env, env, [seed for seed, _ in held.test])
    validation = eval_requests(cfg.env, env, [seed for seed, _ in held.val])

    budget = StepBudget(cfg.budget_minutes, run_dir / "budget.json") if cfg.budget_minutes else None
    by_clock = budget is not None and not cfg.train_steps  # validation by the clock; a step count keeps --eval-every
    print(f"[env] {run_length(cfg)}", flush=True)
    curve: list[dict[str, Any]] = []
    """Validation success against minutes (and steps): the report's learning curve."""
    paces: list[float] = []
    """Each step's training seconds per 1,000 train tokens: the summary's ``machine.train_s_per_1k_tokens``."""
    test_evals = [0]
    """Test evaluations run so far (each of the held-out episodes, one opponent): the budget paces the closing ones."""

    async def evaluate(stage: str = "val") -> dict[str, Any]:
        """A test stage on the held-out episodes, or ``val``: the validation ones (``eval_val.jsonl`` holds the
        latest)."""
        reqs, t0 = validation if stage == "val" else held_out, time.monotonic()
        with _timed(wall, "validation" if stage == "val" else "eval"):
            m = await evaluate_episodes(eval_protos, reqs, run_dir / f"eval_{stage}.jsonl", desc=f"eval {stage}")
        if stage == "val" and budget is not None:  # the next one waits for training time after this one
            budget.eval_done(time.monotonic() - t0)
        m["minutes"] = (budget.spent() if budget else time.monotonic() - start) / 60.0
        if stage == "val":
            curve.append({"step": trainer.step, "minutes": m["minutes"], "success_rate": m["success_rate"]})
        else:
            results[stage] = m
            test_evals[0] += 1
            print(format_summary(f"[env] {stage}" + (" vs frozen start" if frozen else ""), m), flush=True)
            (run_dir / PARTIAL_FILE).write_text(json.dumps(results))  # a resumed run keeps its earlier stages
        return m

    league = HalfwaySnapshot(run_dir) if frozen is not None else None
    """Two-player envs: the policy's snapshot halfway through training (an opponent it never faced)."""

    async def versus(stage: str, policy: Any, only: str = "") -> None:
        """A test stage of ``policy`` against every opponent but the frozen start (``opponent_suite``):
        ``results["opponents"][name][stage]``."""
        greedy = SamplingParams(temperature=0.0, max_tokens=cfg.env.max_completion_tokens)
        suite = opponent_suite(cfg.env, env, policy, tok, [seed for seed, _ in held.test], greedy,
                               league=league.opponent(model, tok) if league is not None else None, seed=cfg.seed)
        for name, (protos, reqs) in suite.items():
            if only and name != only:
                continue
            with _timed(wall, "eval"):
                m = await evaluate_episodes(protos, reqs, run_dir / f"eval_{stage}_vs_{name}.jsonl",
                                            desc=f"eval {stage} vs {name}")
            results.setdefault("opponents", {}).setdefault(name, {})[stage] = m
            test_evals[0] += 1
            print(format_summary(f"[env] {stage} vs {name}", m), flush=True)

    async def on_step(step: int, metrics: dict[str, Any]) -> None:
        """The league snapshot halfway through; under a budget, validation by the clock and the stop."""
        if metrics.get("train_tokens"):  # the machine's pace (a slowed machine fits fewer steps into a budget)
            paces.append(1000.0 * metrics["train_s"] / metrics["train_tokens"])
        if league is not None:  # half the budget or half the steps, whichever ends the run first
            by_time = budget is not None and budget.spent() >= budget.budget_s / 2
            by_steps = 0 < cfg.train_steps and step >= max(1, cfg.train_steps // 2)
            league.on_step(model, step, f"half the {cfg.budget_minutes:g}-minute budget" if by_time
                           else f"half the {cfg.train_steps} steps" if by_steps else "")
        if budget is None:
            return
        if validation and by_clock and budget.eval_due():
            metrics.update(await trainer.evaluate())
        if not budget.after_step():
            raise TrainingStopped("budget", f"the {cfg.budget_minutes:g}-minute budget holds no further step and the "
                                  f"closing evaluation ({budget.spent() / 60:.1f} min spent, step {step})", failed=False)

    algo = algorithm_for(cfg)
    source = rollout_source(cfg, env, train_protos, run_dir, algo, held)
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    keep = "success_rate" if cfg.keep_best and validation else ""
    if cfg.keep_best and not validation:  # on by default: --eval-every 0 turns it off, and says so
        print("[env] keep-best is off: no evaluations during training (--eval-every 0 or --val-episodes 0)", flush=True)
    trainer = Trainer(
        model, algo, source, trainer_config(cfg),
        publisher=InProcessPublisher(engine), logger=logger, checkpoint_dir=run_dir / "checkpoints", tokenizer=tok,
        evaluator=evaluate if validation else None, eval_every=0 if by_clock else cfg.eval_every, keep_best=keep)
    try:
        if cfg.resume and trainer.resume():
            results.update(_resumed_stages(run_dir))
            print(f"[env] resumed from step {trainer.step} in {run_dir}"
                  + (f" ({budget.spent() / 60:.1f} of its {cfg.budget_minutes:g} minutes spent)" if budget else "")
                  + "; --no-resume starts over (the earlier run is moved aside)", flush=True)
        if trainer.step == 0:
            if held_out:
                await evaluate("base")
                if frozen is not None:
                    await versus("base", engine)
            if teacher:
                from ludic.recipes.sft import demo_batch, demo_sft

                with _timed(wall, "format_demos"):
                    items = await format_demo_items(cfg, env, tok, teacher, held, run_dir / "format_demos.jsonl")
                    steps = max(1, cfg.format_demo_steps)
                    batch = demo_batch(len(items), steps, cfg.format_demo_epochs)
                    print(f"[env] format demos: {len(items)} teacher turns, {steps} SFT steps of {batch} "
                          f"({steps * batch / len(items):.1f} passes)", flush=True)
                    await demo_sft(model, tok, items, steps=steps, batch=batch,
                                   lr=cfg.format_demo_lr, trainer=cfg.trainer, logger=cfg.logger, desc="format demos",
                                   seed=cfg.seed, publisher=InProcessPublisher(engine))
                if held_out:
                    await evaluate("format_demos")
        rl_start = results.get("format_demos") or results.get("base")  # the start of RL on the test instances
        if rl_start and (warning := constant_answer_warning(rl_start)):
            results["start_warning"] = warning  # printed with that stage's summary (format_summary); a resumed
            # run printed it in its first process's log
        if budget is not None:
            # the end repeats the base's test evaluations for the trained policy (not the cold start's), and a
            # two-player run adds two against the league snapshot (trained and base)
            opening = max(1, test_evals[0] - ("format_demos" in results))
            budget.plan_closing(wall.get("eval", 0.0), test_evals[0], opening + (2 if frozen is not None else 0),
                                len(held_out) / max(1, len(validation)))
            budget.start_training()
        with _timed(wall, "train"):  # the validation evaluations in it are counted apart (wall["validation"])
            _, failure = await train_until_stop(trainer, cfg.train_steps or 10**9, on_step)
        wall["train"] -= wall.get("validation", 0.0)
        results["curve"] = curve
        results["stopped"] = trainer.stopped  # None: it ran every step
        results["instances"] = held.report()
        write_instances(run_dir / INSTANCES_FILE, held)
        print(f"[env] instances: {results['instances']['label']}: {results['instances']['test_trained']} of "
              f"{results['instances']['test_distinct']} test instances trained on; {held.note()}", flush=True)
        if keep and trainer.best:
            results["kept"], results["last_val"] = kept_summary(trainer.best, len(validation)), trainer.best["last_eval"]
        if held_out and may_evaluate(failure):
            await evaluate("trained")
            if league is not None:
                league.at_stop(trainer.step)  # a run that stopped before its halfway snapshot
                results["league_snapshot"] = league.record
                await versus("trained", engine)
                if league.taken():  # the start against the same snapshot
                    await versus("base", frozen, only="league")
        if cfg.final_save or failure is not None:  # a stopped run keeps a loadable final (its best weights)
            trainer.save()
            model.save_pretrained(str(run_dir / "final"))
            tok.save_pretrained(str(run_dir / "final"))
        if "base" in results and "trained" in results:
            results["success_gain"] = results["trained"]["success_rate"] - results["base"]["success_rate"]
        results["headline"] = _headline(results)
        total = time.monotonic() - start
        results["wall_s"] = {"total": total, **wall, "other": max(0.0, total - sum(wall.values()))}  # parts sum to total
        # what the times and scores were measured on: CPU flags, kernels, and the dtype the policy was served in
        results["machine"] = {**machine(), "dtype": str(model.get_input_embeddings().weight.dtype).removeprefix("torch."),
                              "train_s_per_1k_tokens": round(statistics.median(paces), 3) if paces else None}
        (run_dir / "summary.json").write_text(json.dumps(results, indent=2))
    finally:
        logger.close()  # writes report.html, with summary.json
    if failure is not None:
        raise failure
    return TrainResult(model, tok, run_dir, results)


def play_protocols(cfg: TrainEnvConfig, env: Any, engine: Any, model: Any, tok: Any) -> tuple[dict, dict, Any]:
    """(training protocols sampling at ``cfg.temperature``, greedy evaluation protocols, the frozen opponent) on
    ``engine``; on a multi-player env the frozen opponent is an engine on a copy of ``model`` as it is now (the
    starting policy; None for one player). Used by ``ludic train env`` and by the env pipeline's actors."""
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.reference import frozen_copy

    multi = len(env.agent_ids) > 1
    if multi and cfg.env.opponent not in ("self", "frozen"):
        raise UsageError(f"--opponent must be self or frozen, got {cfg.env.opponent!r}")
    frozen = TransformersEngine(frozen_copy(model, share_frozen=True), tok) if multi else None  # the base shared
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.env.max_completion_tokens)
    greedy = SamplingParams(temperature=0.0, max_tokens=cfg.env.max_completion_tokens)
    return (protocols(engine, cfg.env, env, sampling, frozen, greedy),
            protocols(engine, cfg.env, env, greedy, frozen, greedy), frozen)


def rollout_source(cfg: TrainEnvConfig, env: Any, protos: dict[str, Any], run_dir: Path, algo: Any,
                   held: Any = None) -> Any:
    """The training rollouts of ``ludic train env`` (and of its pipeline actors): GRPO groups of
    ``group_size`` episodes on ``prompts_per_step`` training seeds a step, played through ``protos``, none of
    them on a held-out instance (``held``; default: the test set ``ludic eval env`` builds)."""
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine

    if held is None:
        held = held_out_for(cfg.env, cfg.eval_episodes, cfg.val_episodes if cfg.eval_every else 0, cfg.seed)
    requests_fn = TrainingSeeds(cfg, n_seats=len(env.agent_ids), multi=len(env.agent_ids) > 1, held=held)
    return RolloutBatchSource(
        RolloutEngine(protos, concurrency=64, jsonl_path=run_dir / "rollouts.jsonl"), requests_fn,
        algo.credit, strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed), sample_filter=algo.sample_filter,
        metrics_fn=env_metrics)


def trainer_config(cfg: TrainEnvConfig) -> Any:
    """The step's TrainerConfig: the schedule's length and the Dr.GRPO normaliser filled in from the run (a
    decaying schedule under a budget needs ``--total-steps``: the step count is not known before the run)."""
    if cfg.trainer.lr_schedule != "constant" and not (cfg.trainer.total_steps or cfg.train_steps):
        raise UsageError(f"--lr-schedule {cfg.trainer.lr_schedule} decays over --total-steps: give it (or "
                         "--train-steps) when --budget-minutes decides the run's length")
    return replace(cfg.trainer, total_steps=cfg.trainer.total_steps or cfg.train_steps,
                   norm_max_tokens=cfg.trainer.norm_max_tokens or cfg.env.max_completion_tokens)


@contextlib.contextmanager
def _timed(wall: dict[str, float], key: str) -> Any:
    """Add the block's wall-clock seconds to ``wall[key]``."""
    t0 = time.monotonic()
    try:
        yield
    finally:
        wall[key] = wall.get(key, 0.0) + time.monotonic() - t0


def _resumed_stages(run_dir: Path) -> dict[str, Any]:
    """The test stages a resumed run measured before it stopped (``PARTIAL_FILE``)."""
    try:
        earlier = json.loads((run_dir / PARTIAL_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return {k: v for k, v in earlier.items() if isinstance(v, dict)}


def _headline(results: dict[str, Any]) -> dict[str, Any]:
    """``{stage: {value, low, high, n}}`` of the success rate on the test episodes, for the report's first table
    (the last step's validation score goes in the keep-best note below it)."""
    return {"metric": "success_rate", "stages": {
        stage: {"value": m["success_rate"], "low": m["success_ci95_low"], "high": m["success_ci95_high"],
                "n": m["episodes"], "reward_mean": m["reward_mean"]}
        for stage, m in results.items() if isinstance(m, dict) and "success_ci95_low" in m and stage != "last_val"}}


# --------------------------------------------------------------------------------------------- eval


def eval_env(cfg: EvalEnvConfig) -> dict[str, Any]:
    return asyncio.run(_eval_env(cfg))


async def _eval_env(cfg: EvalEnvConfig) -> dict[str, Any]:
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine

    env = probe_env(cfg.env)
    model, tok = load_policy_for(cfg)
    model.eval()
    engine = TransformersEngine(model, tok)
    sampling = SamplingParams(temperature=cfg.temperature, max_tokens=cfg.env.max_completion_tokens)
    frozen = None
    if len(env.agent_ids) > 1:  # the fixed opponent: the base model
        base, _ = load_policy_for(cfg, adapter=None)
        base.eval()
        frozen = TransformersEngine(base, tok)
    protos = protocols(engine, cfg.env, env, sampling, frozen, SamplingParams(temperature=0.0,
                                                                               max_tokens=cfg.env.max_completion_tokens))
    held = held_out_for(cfg.env, cfg.episodes, 0, cfg.seed)  # the test set ``ludic train env`` builds
    if cfg.samples > 1 and cfg.temperature <= 0:
        print(f"WARNING: --samples {cfg.samples} at --temperature 0: greedy samples of one instance are identical "
              "(pass@k = pass@1); sample at a temperature above 0", flush=True)
    out = Path(cfg.out) if cfg.out else default_run_dir("eval") / "samples.jsonl"
    m = await evaluate_episodes(protos, expand_samples(eval_requests(cfg.env, env, [seed for seed, _ in held.test]),
                                                       cfg.samples), out, desc="eval env")
    m["instances"] = trained_overlap(held, cfg.adapter)
    # with the screen's question: would GRPO from here rather learn one answer? (constant_answer_warning)
    print(format_summary(f"{cfg.env.env}" + (" vs the base model" if frozen else ""), m))
    if frozen is not None:  # the opponents it may never have trained against (eval.opponents)
        suite = opponent_suite(cfg.env, env, engine, tok, [seed for seed, _ in held.test], sampling, seed=cfg.seed)
        for name, (opp_protos, reqs) in suite.items():
            opp_out = out.with_name(f"{out.stem}_vs_{name}.jsonl")
            m.setdefault("opponents", {})[name] = vs = await evaluate_episodes(
                opp_protos, expand_samples(reqs, cfg.samples), opp_out, desc=f"vs {name}")
            print(format_summary(f"{cfg.env.env} vs {name}", vs))
    summary = out.parent / "summary.json" if not cfg.out else out.with_name(f"{out.stem}.summary.json")
    summary.write_text(json.dumps({"env": cfg.env.env, "temperature": cfg.temperature, **m, "config": asdict(cfg)},
                                  indent=2, default=str))
    print(f"instances: {m['instances']['note']}")
    print(f"episodes written to {out}, summary to {summary}")
    return m
