"""Any environment, one command: ``ludic train env`` / ``ludic eval env``, and ``ludic.train(env)`` in Python.

    ludic train env --env reasoning_gym:leg_counting
    ludic train env --env textarena:GuessTheNumber-v0 --max-completion-tokens 32
    ludic train env --env textarena:TicTacToe-v0 --opponent frozen     two players: vs the starting policy
    ludic train env --env gem:game:Mastermind-v0-easy
    ludic train env --env my_package.envs:MyEnv --env-kwargs '{"size": 5}'
    ludic eval env --env reasoning_gym:leg_counting --adapter runs/env-.../final

``--env`` takes every env kind ``ludic.envs.registry`` knows: a registered name, an adapter prefix
(``textarena:``, ``reasoning_gym:``, ``gem:``, ``gym:``) or an import path to a ``LudicEnv`` factory.

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
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from ludic.envs.registry import import_attr
from ludic.errors import UsageError
from ludic.recipes.blocks import GRPOBlock, LoraBlock, ModelBlock, TrainRunBlock, kept_summary, load_policy_for
from ludic.recipes.env_setup import (EVAL_SEED_BASE, VAL_SEED_FIRST, EnvConfig, env_metrics, eval_requests,
                                     evaluate_episodes, format_summary, probe_env, protocols, register_python_env)
from ludic.training.config import TrainerConfig
from ludic.types import EnvSpec, RolloutRequest

FORMAT_DEMO_EPISODES = 32


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
    the default keeps full steps and guards a good start with ``keep_best`` on validation episodes (README)."""
    eval_episodes: int = 64
    """Held-out episodes (greedy) before and after training; 0: no evaluation."""
    eval_every: int = 5
    """Also evaluate every N steps on the validation episodes (logged as eval/*; 0: before and after only)."""
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
    format_demo_lr: float = 2e-4


@dataclass
class EvalEnvConfig(ModelBlock):
    """Success rate and mean reward of a policy on held-out episodes of any environment."""

    env: EnvConfig = field(default_factory=EnvConfig)
    episodes: int = 64
    temperature: float = 0.0
    out: str = "env_eval.jsonl"
    seed: int = 0


# ---------------------------------------------------------------------------------- format cold start


def demo_teacher(spec: str | Callable[[str], str], seed: int = 0) -> Callable[[list[dict]], str]:
    """The teacher of a format cold start, ``messages -> reply``: from example replies (a .jsonl of
    ``{"reply": ...}``, a .txt one per line) or a function of the last observation."""
    if callable(spec):
        fn = spec
    elif spec.endswith((".jsonl", ".txt")):
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(f"--format-demos: {path} does not exist")
        if spec.endswith(".jsonl"):
            from ludic.data.jsonl import read_jsonl

            replies = [r["reply"] for r in read_jsonl(path, {"reply": str})]
        else:
            replies = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if not replies:
            raise ValueError(f"--format-demos: {path} holds no example reply")
        rng = random.Random(seed)
        fn = lambda obs: rng.choice(replies)  # noqa: E731
    elif ":" in spec:
        fn = import_attr(spec)
    else:
        raise ValueError(f"--format-demos {spec!r}: give a .jsonl / .txt of example replies or module:function")

    def reply(messages: list[dict]) -> str:
        last = next((m["content"] for m in reversed(messages) if m["role"] == "user"), "")
        return str(fn(last))

    return reply


async def format_demo_items(cfg: TrainEnvConfig, env: Any, tok: Any, teacher_spec: Any) -> list[Any]:
    """SFT items from the teacher playing ``FORMAT_DEMO_EPISODES`` training episodes (every seat) through
    the same agent, context and chat template as the policy."""
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import SAWItem

    teacher = FunctionClient(tok, demo_teacher(teacher_spec, cfg.seed))
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.env.max_completion_tokens)
    protos = protocols(teacher, cfg.env, env, sampling)
    key = "single_agent" if "single_agent" in protos else "self"
    rng, spec = random.Random(cfg.seed + 7), EnvSpec(cfg.env.env, cfg.env.kwargs())
    reqs = [RolloutRequest(spec, protocol=key, env_seed=rng.randrange(EVAL_SEED_BASE), max_steps=cfg.env.max_turns or None)
            for _ in range(FORMAT_DEMO_EPISODES)]
    rollouts = await RolloutEngine(protos).generate_rollouts(reqs, progress="format demos")
    return [SAWItem(prompt_ids=s.trace.prompt_ids, completion_ids=s.trace.completion_ids, weight=1.0)
            for r in rollouts if not r.meta.get("failed") for s in r.steps if s.trace is not None]


# -------------------------------------------------------------------------------------------- train


class TrainingSeeds:
    """Each step's requests: ``prompts_per_step`` training seeds (below ``EVAL_SEED_BASE``, so disjoint from
    the held-out ones), and for a frozen opponent the trained seat alternating. Its state goes into the
    checkpoints (the batch source saves a ``requests_fn``'s ``state_dict``): a resumed run draws the seeds
    the uninterrupted run would have."""

    def __init__(self, cfg: "TrainEnvConfig", *, n_seats: int, multi: bool) -> None:
        self.cfg, self.n_seats, self.multi = cfg, n_seats, multi
        self.spec = EnvSpec(cfg.env.env, cfg.env.kwargs())
        self.rng = random.Random(cfg.seed)
        self.drawn = 0

    def __call__(self) -> list[RolloutRequest]:
        cfg, reqs = self.cfg, []
        for _ in range(cfg.prompts_per_step):
            key = ("single_agent" if not self.multi else "self" if cfg.env.opponent == "self"
                   else f"seat{self.drawn % self.n_seats}")
            reqs.append(RolloutRequest(self.spec, protocol=key,
                                       env_seed=self.rng.randrange(EVAL_SEED_BASE), max_steps=cfg.env.max_turns or None))
            self.drawn += 1
        return reqs

    def state_dict(self) -> dict[str, Any]:
        from ludic.rollouts.engine import rng_state

        return {"rng": rng_state(self.rng), "drawn": self.drawn}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from ludic.rollouts.engine import set_rng_state

        set_rng_state(self.rng, state["rng"])
        self.drawn = int(state["drawn"])


@dataclass
class TrainResult:
    """What ``ludic.train`` returns: the trained policy and where its run lives."""

    model: Any
    tokenizer: Any
    run_dir: Path
    results: dict[str, Any]


def train(env: Any, *, model: str | None = None, format_demos: Any = None, **overrides: Any) -> TrainResult:
    """Train a policy on ``env`` with the defaults of ``ludic train env``, from Python.

    ``env``: an env kind string, a ``LudicEnv`` class or a factory. ``overrides`` set fields of
    ``TrainEnvConfig``, of its ``env`` section (``max_completion_tokens=``, ``env_kwargs=`` as a dict)
    or of its ``trainer`` section (``lr=``). ``format_demos``: example replies' file, or a function
    ``observation -> reply`` (a format cold start).

        result = ludic.train(GuessEnv, train_steps=20, max_completion_tokens=24)
        result.results["after"]["success_rate"], result.run_dir
    """
    cfg = TrainEnvConfig()
    env_cfg, trainer_cfg = cfg.env, cfg.trainer
    kind = env if isinstance(env, str) else register_python_env(env)
    env_over = {"env": kind}
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
    return asyncio.run(_train(cfg, format_demos if format_demos is not None else (cfg.format_demos or None)))


def train_env(cfg: TrainEnvConfig) -> dict[str, Any]:
    """``ludic train env``."""
    result = asyncio.run(_train(cfg, cfg.format_demos or None))
    return {**result.results, "run_dir": str(result.run_dir)}


async def _train(cfg: TrainEnvConfig, teacher: Any = None) -> TrainResult:
    from ludic.config import dump_config
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.algorithms import algorithm_for
    from ludic.training.loggers import logger_names, make_logger
    from ludic.training.trainer import Trainer

    logger_names(cfg.logger)
    env = probe_env(cfg.env)
    run_dir = cfg.resolve_run_dir("env")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    model, tok = load_policy_for(cfg)
    engine = TransformersEngine(model, tok)
    train_protos, eval_protos = play_protocols(cfg, env, engine, model, tok)
    results: dict[str, Any] = {"env": cfg.env.env, "metric": "success_rate"}
    wall: dict[str, float] = {}
    """Seconds per part of this process's run (a resumed run counts from its resume)."""
    start = time.monotonic()
    held_out = eval_requests(cfg.env, env, cfg.eval_episodes) if cfg.eval_episodes else []
    validation = eval_requests(cfg.env, env, cfg.val_episodes, first=VAL_SEED_FIRST) if cfg.eval_every else []

    async def evaluate(stage: str = "val") -> dict[str, Any]:
        """A test stage on the held-out episodes, or ``val``: the validation ones (``eval_val.jsonl`` holds the
        latest)."""
        reqs = validation if stage == "val" else held_out
        with _timed(wall, "eval"):
            m = await evaluate_episodes(eval_protos, reqs, run_dir / f"eval_{stage}.jsonl", desc=f"eval {stage}")
        if stage != "val":
            results[stage] = m
            print(format_summary(f"[env] {stage}", m), flush=True)
        return m

    algo = algorithm_for(cfg)
    source = rollout_source(cfg, env, train_protos, run_dir, algo)
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    keep = "success_rate" if cfg.keep_best and validation else ""
    if cfg.keep_best and not validation:  # on by default: --eval-every 0 turns it off, and says so
        print("[env] keep-best is off: no evaluations during training (--eval-every 0 or --val-episodes 0)", flush=True)
    trainer = Trainer(
        model, algo, source, trainer_config(cfg),
        publisher=InProcessPublisher(engine), logger=logger, checkpoint_dir=run_dir / "checkpoints", tokenizer=tok,
        evaluator=evaluate if validation else None, eval_every=cfg.eval_every, keep_best=keep)
    try:
        if cfg.resume:
            trainer.resume()
        if trainer.step == 0:
            if held_out:
                await evaluate("base")
            if teacher:
                from ludic.recipes.sft import demo_sft

                with _timed(wall, "format_demos"):
                    items = await format_demo_items(cfg, env, tok, teacher)
                    steps = max(1, cfg.format_demo_steps)
                    print(f"[env] format demos: {len(items)} teacher turns, {steps} SFT steps", flush=True)
                    await demo_sft(model, tok, items, steps=steps, batch=max(1, len(items) // steps),
                                   lr=cfg.format_demo_lr, trainer=cfg.trainer, logger=cfg.logger, desc="format demos",
                                   seed=cfg.seed, publisher=InProcessPublisher(engine))
                if held_out:
                    await evaluate("format_demos")
        with _timed(wall, "train"):  # its in-training evaluations included
            await trainer.train(cfg.train_steps)
        if keep and trainer.best:
            results["kept"], results["last_val"] = kept_summary(trainer.best, len(validation)), trainer.best["last_eval"]
        if held_out:
            await evaluate("trained")
        if cfg.final_save:
            trainer.save()
            model.save_pretrained(str(run_dir / "final"))
            tok.save_pretrained(str(run_dir / "final"))
        if "base" in results and "trained" in results:
            results["success_gain"] = results["trained"]["success_rate"] - results["base"]["success_rate"]
        results["headline"] = _headline(results)
        results["wall_s"] = {"total": time.monotonic() - start, **wall}
        (run_dir / "summary.json").write_text(json.dumps(results, indent=2))
    finally:
        logger.close()  # writes report.html, with summary.json
    return TrainResult(model, tok, run_dir, results)


def play_protocols(cfg: TrainEnvConfig, env: Any, engine: Any, model: Any, tok: Any) -> tuple[dict, dict]:
    """(training protocols sampling at ``cfg.temperature``, greedy evaluation protocols) on ``engine``; on a
    multi-player env the frozen opponent is a copy of ``model`` as it is now (the starting policy). Used by
    ``ludic train env`` and by the env pipeline's actors."""
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
            protocols(engine, cfg.env, env, greedy, frozen, greedy))


def rollout_source(cfg: TrainEnvConfig, env: Any, protos: dict[str, Any], run_dir: Path, algo: Any) -> Any:
    """The training rollouts of ``ludic train env`` (and of its pipeline actors): GRPO groups of
    ``group_size`` episodes on ``prompts_per_step`` training seeds a step, played through ``protos``."""
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine

    requests_fn = TrainingSeeds(cfg, n_seats=len(env.agent_ids), multi=len(env.agent_ids) > 1)
    return RolloutBatchSource(
        RolloutEngine(protos, concurrency=64, jsonl_path=run_dir / "rollouts.jsonl"), requests_fn,
        algo.credit, strategy=GRPORequestStrategy(cfg.group_size, seed=cfg.seed), sample_filter=algo.sample_filter,
        metrics_fn=env_metrics)


def trainer_config(cfg: TrainEnvConfig) -> Any:
    """The step's TrainerConfig: the schedule's length and the Dr.GRPO normaliser filled in from the run."""
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
    m = await evaluate_episodes(protos, eval_requests(cfg.env, env, cfg.episodes), Path(cfg.out), desc="eval env")
    print(format_summary(f"{cfg.env.env}", m))
    print(f"episodes written to {cfg.out}")
    return m
