"""OpenSpiel games: PPO + LoRA training and evaluation, read top to bottom.

    ludic train games   ->  train_games(TrainGamesConfig)
    ludic eval games    ->  eval_games(EvalGamesConfig)

The spine: OpenSpielEnv (a game by name or task id; bots in the other seats, or every seat an
agent for self-play) -> Agent(engine, context, identity parser: the env parses action ids the
suite's way) -> SingleAgentProtocol / MultiAgentProtocol -> RolloutEngine -> GAE over per-turn
rewards with the learner's value pass -> clipped policy + value losses, KL to the adapter-off
reference with an adaptive coefficient -> Trainer. On kuhn_poker and leduc_poker the policy's
exploitability (NashConv, exact, from the model's action probabilities) is logged as a curve.
The game side (which games, episodes, agents and protocols, metrics, NashConv): ``recipes.games_setup``.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import re
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

from ludic.config import dump_config
from ludic.inference.client import ChatClient
from ludic.interaction.multi_agent import MultiAgentProtocol
from ludic.recipes.blocks import EvalInferenceBlock, ModelBlock, TrainRunBlock, load_policy_for
from ludic.recipes.common import train_until_stop
from ludic.rollouts.batch import RolloutBatchSource
from ludic.rollouts.engine import RolloutEngine
from ludic.training.config import TrainerConfig
from ludic.recipes.games_setup import (EXPLOITABILITY_GAMES, GamesBlock, env_spec, episode_score, exploitability,
                                      game_metrics, game_name, make_agent, parse_games, protocols)
from ludic.types import EnvSpec, Rollout, RolloutRequest


@dataclass
class TrainGamesConfig(ModelBlock, GamesBlock, TrainRunBlock):
    """PPO + LoRA on OpenSpiel games (a value head, GAE, clipped losses, adaptive KL)."""

    league_size: int = 4
    """--opponent league: snapshots kept (in <run_dir>/league; the oldest is dropped)."""
    league_every: int = 5
    """--opponent league: snapshot the policy every N steps (step 0, the starting policy, included)."""
    episodes_per_update: int = 16
    train_steps: int = 30
    format_demos: int = 0
    """SFT steps of a format cold start before PPO (0: none). A teacher answers every turn with a
    uniformly random legal id, through the real agent, env and chat template, so the model learns
    to answer with a bare id and nothing about the game. The result is merged into the base (saved in
    <run_dir>/format_sft, the PPO's KL reference); NashConv is measured before and after it."""
    format_demo_lr: float = 5e-4
    temperature: float = 1.0
    algorithm: str = "ppo"
    """ppo (a value head, GAE, the clipped objective) or mmd (magnetic mirror descent on information
    states: per-state targets from the batch's returns, fitted by a balanced cross-entropy; no critic;
    for small games, where the batch visits each state often: kuhn_poker, leduc_poker)."""
    mmd_eta: float = 10.0
    """mmd: step size (per unit of return; scores are in [0, 1])."""
    mmd_alpha: float = 0.05
    """mmd: pull toward the uniform policy (the fixed point is a quantal response equilibrium at this
    temperature; 0: none)."""
    gamma: float = 1.0
    lam: float = 0.95
    baseline: str = "value"
    """Advantage baseline: value (the critic, GAE) or state (the batch's leave-one-out mean return of the same
    information state where it recurs, the critic elsewhere; suits small games)."""
    vf_coef: float = 0.1
    kl_coef: float = 0.2
    """Initial KL coefficient to the reference (the adapter disabled)."""
    lora_rank: int = 16
    lora_alpha_mult: float = 2.0
    """LoRA alpha = rank * this (r16 / alpha 32 on every projection by default)."""
    lora_layer_share: float = 1.0
    """Share of the decoder layers, from the top, that carry the adapter (the backward pass stops
    below them: 0.5 costs about a third less per step)."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(
        lr=1e-4, ppo_epochs=2, num_minibatches=2, kl_target=0.05, kl_horizon=1000, checkpoint_every=10))
    """Optimisation (--lr, --ppo-epochs, --num-minibatches, --kl-target, ...)."""
    eval_every: int = 5
    """Exploitability (kuhn_poker, leduc_poker) every N steps (0: only at the start and the end)."""
    keep_best: bool = False
    """End on the weights of the lowest mean NashConv measured (at the start, every --eval-every steps and at
    the last); the summary's ``kept`` gives that step beside the last one."""
    concurrency: int = 32
    curriculum: bool = False
    """Opponent ladder easy (random) -> medium (MCTS at a tenth of its strength) -> hard (MCTS), moving on
    at 70% success over the last 100 episodes, with 30% of tasks replayed from past failures
    (weighted by 1 - score); stage and replay share are logged, the state is checkpointed."""
    clip: float = 0.2
    """PPO clip range of the policy ratio."""
    value_clip: float = 0.2
    """Clip range of the value prediction around its value at collection."""
    config: str = ""
    """The original trainer's train_config.json (fields mapped onto these flags; flags given on the
    command line win): see ``original_config_argv``."""
    env_config: str = ""
    """The original trainer's env_config.json or trace_config.json."""


CURRICULUM_STAGES = (("easy", {"opponent": "random"}), ("medium", {"opponent": "mcts", "mcts_scale": 0.1}),
                     ("hard", {"opponent": "mcts", "mcts_scale": 1.0}))
"""The opponent ladder of ``--curriculum`` (MCTS strength as a share of the game's preset or of
--mcts-simulations / --mcts-rollouts)."""


class GameRequests:
    """Episodes of the configured games, uniformly, each with a fresh env seed (the seat and the
    chance outcomes come from it); with ``cfg.curriculum`` the stage's opponent and the failure
    replay of ``Curriculum``. Its state (RNG, curriculum) travels in checkpoints."""

    def __init__(self, cfg: Any, seed: int, league: Any = None, engine: RolloutEngine | None = None,
                 client: ChatClient | None = None) -> None:
        from ludic.rollouts.curriculum import Curriculum, Stage
        from ludic.training.league import OpponentSampler

        self.cfg, self.games = cfg, parse_games(cfg.games)
        self.rng = random.Random(seed)
        self.league, self.engine, self.client = league, engine, client
        self.sampler = OpponentSampler({"league": 1.0}, league, seats=2, seed=seed + 2) if league is not None else None
        self.curriculum = None
        if getattr(cfg, "curriculum", False):
            if cfg.opponent == "self":
                raise ValueError("--curriculum is an opponent ladder of bots: it does not combine with --opponent self")
            self.curriculum = Curriculum([Stage(n, o) for n, o in CURRICULUM_STAGES], seed=seed + 1)

    def _task(self, rng: random.Random) -> dict[str, Any]:
        """A concrete task (env kwargs without the opponent): a game, its config variant drawn."""
        spec = env_spec(self.cfg, rng.choice(self.games), rng)
        return {k: v for k, v in spec.kwargs.items() if k not in ("opponent", "mcts")} | {"kind": spec.kind}

    def _staged(self, task: dict[str, Any]) -> EnvSpec:
        from ludic.envs.openspiel_suite import MCTS_PRESETS, decode_task

        kwargs = {k: v for k, v in task.items() if k != "kind"}
        if task["kind"] != "openspiel" or self.curriculum is None:
            return EnvSpec(task["kind"], kwargs)
        over = self.curriculum.stage.overrides
        kwargs["opponent"] = over["opponent"]
        if over["opponent"] == "mcts":
            name = kwargs.get("game") or decode_task(kwargs["task_id"]).game
            base = ((self.cfg.mcts_simulations, self.cfg.mcts_rollouts or 1) if self.cfg.mcts_simulations
                    else MCTS_PRESETS.get(name))
            if base is None:
                kwargs["opponent"] = "random"
            else:
                scale = over.get("mcts_scale", 1.0)
                kwargs["mcts"] = (max(1, round(base[0] * scale)), max(1, round(base[1] * scale)))
        return EnvSpec("openspiel", kwargs)

    def __call__(self) -> list[RolloutRequest]:
        out = []
        for _ in range(self.cfg.episodes_per_update):
            if self.curriculum is not None:
                task, replayed = self.curriculum.draw(self._task)
                spec = self._staged(task)
                meta = {"task": task, "replayed": replayed}
            else:
                spec, meta = env_spec(self.cfg, self.rng.choice(self.games), self.rng), {}
            name = spec.kwargs.get("game") or ("trace" if spec.kind == "trace" else game_name(spec.kwargs))
            protocol = "selfplay" if spec.kwargs.get("seats") else "single_agent"
            if self.sampler is not None:
                protocol, extra = self._league_protocol()
                meta.update(extra)
            out.append(RolloutRequest(spec, protocol=protocol,
                                      env_seed=self.rng.randrange(2**31), sampling_seed=self.rng.randrange(2**31),
                                      max_steps=self.cfg.max_turns, meta={"game": name, **meta}))
        return out

    def _league_protocol(self) -> tuple[str, dict[str, Any]]:
        """A league draw: the protocol whose other seat plays a frozen snapshot (registered once per
        snapshot and seat; dropped snapshots' protocols are removed)."""
        assert self.sampler is not None and self.engine is not None and self.client is not None
        live = {s.name for s in self.league.snapshots}
        for key in [k for k in self.engine.protocols if k.startswith("league:") and k.split(":")[1] not in live]:
            del self.engine.protocols[key]
        draw = self.sampler.draw()
        snap, frozen = draw.snapshot, f"player_{1 - draw.seat}"
        assert snap is not None
        key = f"league:{snap.name}:{frozen}"
        if key not in self.engine.protocols:
            cfg, client, league = self.cfg, self.client, self.league

            def factory() -> MultiAgentProtocol:
                agents = {f"player_{k}": make_agent(league.client(snap) if f"player_{k}" == frozen else client,
                                                    cfg.ctx, cfg.temperature, cfg.max_completion_tokens)
                          for k in range(2)}
                return MultiAgentProtocol(agents, frozen=(frozen,))
            self.engine.protocols[key] = factory
        return key, {"opponent": "league", "opponent_snapshot": snap.name, "trained_seat": f"player_{draw.seat}"}

    def observe(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        """Feed the batch's outcomes to the curriculum; its metrics (stage, replay share)."""
        if self.curriculum is None:
            return {}
        for r in rollouts:
            if "task" in r.meta and r.meta.get("trainable", True) is not False:
                self.curriculum.update(r.meta["task"], episode_score(r) or 0.0)
        return self.curriculum.metrics()

    def metrics(self, rollouts: Sequence[Rollout]) -> dict[str, float]:
        return {**game_metrics(rollouts), **self.observe(rollouts)}

    def state_dict(self) -> dict[str, Any]:
        from ludic.rollouts.engine import rng_state

        state: dict[str, Any] = {"rng": rng_state(self.rng)}
        if self.curriculum is not None:
            state["curriculum"] = self.curriculum.state_dict()
        if self.sampler is not None:
            state["opponents"] = self.sampler.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from ludic.rollouts.engine import set_rng_state

        set_rng_state(self.rng, state["rng"])
        if self.curriculum is not None and "curriculum" in state:
            self.curriculum.load_state_dict(state["curriculum"])
        if self.sampler is not None and "opponents" in state:
            self.sampler.load_state_dict(state["opponents"])


LEGAL_LINE = re.compile(r"^(\d+) -> ", re.M)
"""One ``id -> action`` line of the turn text (``OpenSpielEnv.turn_text``)."""


async def format_demo_items(cfg: Any, tok: Any, episodes: int, seed: int) -> list[Any]:
    """SFT items of the format cold start: ``episodes`` games in which a teacher answers each turn
    with a uniformly random legal id (read from the turn text's ``id -> action`` lines). They go
    through the real agent, env, protocol and chat template, so the trained tokens are exactly a
    bare-id reply to the prompts PPO will show; every seat of a self-play game is a demo. The
    opponent is the uniform bot unless the run plays itself (the demos teach no game)."""
    from dataclasses import replace

    from ludic.inference.client import FunctionClient
    from ludic.types import SAWItem

    rng = random.Random(seed)

    def teacher(messages: list[dict]) -> str:
        text = messages[-1]["content"]
        ids = LEGAL_LINE.findall(text.rsplit("Legal Actions:", 1)[-1])
        if not ids:
            raise ValueError(f"--format-demos: the turn text lists no 'id -> action' line: {text[-200:]!r}")
        return rng.choice(ids)

    games = [g for g in parse_games(cfg.games) if "trace" not in g]
    if not games:
        raise ValueError("--format-demos teaches the games' action-id answers: --games has only the trace task")
    demo_cfg = replace(cfg, opponent="self" if cfg.opponent in ("self", "league") else "random", mcts_simulations=0)
    engine = RolloutEngine(protocols(FunctionClient(tok, teacher), demo_cfg, 0.0), concurrency=cfg.concurrency)
    specs = [env_spec(demo_cfg, rng.choice(games), rng) for _ in range(episodes)]
    reqs = [RolloutRequest(spec, protocol="selfplay" if spec.kwargs.get("seats") else "single_agent",
                           env_seed=rng.randrange(2**31), max_steps=cfg.max_turns) for spec in specs]
    rollouts = await engine.generate_rollouts(reqs, progress="format demos")
    return [SAWItem(prompt_ids=s.trace.prompt_ids, completion_ids=s.trace.completion_ids, weight=1.0)
            for r in rollouts for s in r.steps if s.trace is not None]


FORMAT_DEMO_EPISODES = 16
"""Episodes per format-demo SFT step (a kuhn_poker self-play episode gives about 2.2 turns)."""


async def run_format_demos(cfg: Any, model: Any, tok: Any, run_dir: Path) -> Path:
    """``cfg.format_demos`` SFT steps on the format demos (``FORMAT_DEMO_EPISODES`` episodes' turns
    each), then the merged weights saved to ``<run_dir>/format_sft`` (returned)."""
    import shutil

    from ludic.recipes.sft import demo_batch, demo_sft
    from ludic.training.lora import save_merged_base

    items = await format_demo_items(cfg, tok, cfg.format_demos * FORMAT_DEMO_EPISODES, cfg.seed + 7)
    batch = demo_batch(len(items), cfg.format_demos)
    print(f"[games] format demos: {len(items)} teacher turns, {cfg.format_demos} SFT steps of {batch}", flush=True)
    await demo_sft(model, tok, items, steps=cfg.format_demos, batch=batch, lr=cfg.format_demo_lr, trainer=cfg.trainer,
                   logger=cfg.logger, desc="format demos", seed=cfg.seed)

    final, tmp = run_dir / "format_sft", run_dir / "format_sft.tmp"
    shutil.rmtree(tmp, ignore_errors=True)  # a crash mid-save leaves it
    save_merged_base(model, tok, tmp)
    shutil.rmtree(final, ignore_errors=True)  # --no-resume in the same run dir: the demos are redone
    tmp.rename(final)
    return final


def train_games(cfg: TrainGamesConfig) -> dict[str, Any]:
    """Run PPO; returns the last step's metrics with the exploitability curve's ends."""
    return asyncio.run(_train_games(cfg))


async def _train_games(cfg: TrainGamesConfig) -> dict[str, Any]:
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.algorithms import make_mmd, make_ppo
    from ludic.training.loggers import logger_names, make_logger
    from ludic.training.lora import LoraSettings, apply_lora, decoder_layers, top_layer_count
    from ludic.training.trainer import Trainer
    from ludic.training.value import ValueFunction, attach_value_head

    logger_names(cfg.logger)
    games = parse_games(cfg.games)
    names = sorted({game_name(g) for g in games})
    if cfg.algorithm not in ("ppo", "mmd"):
        raise ValueError(f"--algorithm must be ppo or mmd, got {cfg.algorithm!r}")
    if cfg.opponent not in ("random", "mcts", "self", "league"):
        raise ValueError(f"--opponent must be random, mcts, self or league, got {cfg.opponent!r}")
    if cfg.opponent == "league":
        from ludic.envs.openspiel import OpenSpielEnv
        from ludic.envs.openspiel_suite import TASK_BLOCK

        def players(g: dict[str, Any]) -> int:
            kw = {"task_id": g["index"] * TASK_BLOCK} if "index" in g else g
            return 0 if "trace" in g else OpenSpielEnv(**kw).num_players

        many = [g for g in games if players(g) != 2]
        if many:
            raise ValueError(f"--opponent league plays two-player games; not: {[game_name(g) for g in many]}")
    if cfg.keep_best and not set(names) & set(EXPLOITABILITY_GAMES):
        raise ValueError(f"--keep-best keeps the lowest NashConv, which is measured on {sorted(EXPLOITABILITY_GAMES)}; "
                         f"--games has none of them: {names}")
    run_dir = cfg.resolve_run_dir(f"games-{'-'.join(names)}")
    run_dir.mkdir(parents=True, exist_ok=True)
    dump_config(cfg, run_dir / "config.json")
    curve: list[dict[str, Any]] = []
    formatted = run_dir / "format_sft"
    if cfg.format_demos and not (cfg.resume and (formatted / "config.json").exists()):
        model, tok = load_policy_for(cfg, lora=LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_rank * cfg.lora_alpha_mult))
        before = exploitability(model, tok, names, cfg.temperature)
        if before:
            curve.append({"step": 0, "stage": "base", **before})
            print("[games] base model: " + ", ".join(f"{k} {v:.4f}" for k, v in before.items()), flush=True)
        await run_format_demos(cfg, model, tok, run_dir)
        del model
    if cfg.format_demos:  # PPO starts from the merged format SFT: its KL reference is that policy
        model, tok = load_policy_for(cfg, model=str(formatted), adapter=None)
    else:
        model, tok = load_policy_for(cfg)
    n_layers = len(decoder_layers(model))
    top = top_layer_count(cfg.lora_layer_share, n_layers)
    model = apply_lora(model, LoraSettings(rank=cfg.lora_rank, alpha=cfg.lora_rank * cfg.lora_alpha_mult,
                                           top_layers=0 if top == n_layers else top))
    if cfg.algorithm == "mmd":
        algo = make_mmd(cfg.mmd_eta, cfg.mmd_alpha, gamma=cfg.gamma, kl_coef=cfg.kl_coef)
    else:
        attach_value_head(model)
        algo = make_ppo(ValueFunction(model, tok.pad_token_id), gamma=cfg.gamma, lam=cfg.lam, vf_coef=cfg.vf_coef,
                        kl_coef=cfg.kl_coef, baseline=cfg.baseline, clip_low=cfg.clip, clip_high=cfg.clip,
                        value_clip=cfg.value_clip)
    engine = TransformersEngine(model, tok)
    rollouts = RolloutEngine(protocols(engine, cfg, cfg.temperature), concurrency=cfg.concurrency,
                             jsonl_path=run_dir / "rollouts.jsonl")
    league = None
    if cfg.opponent == "league":
        from ludic.training.league import League, frozen_copy_clients

        league = League(run_dir / "league", max_size=cfg.league_size, every=cfg.league_every,
                        make_client=frozen_copy_clients(model, tok))
    requests = GameRequests(cfg, cfg.seed, league=league, engine=rollouts, client=engine)
    source = RolloutBatchSource(rollouts, requests, algo.credit, metrics_fn=requests.metrics, merge_turns=False,
                                sample_filter=algo.sample_filter)
    logger = make_logger(cfg.logger, run_dir, asdict(cfg), total_steps=cfg.train_steps)
    tcfg = cfg.trainer
    trainer = Trainer(model, algo, source, tcfg, logger=logger, checkpoint_dir=run_dir / "checkpoints",
                      tokenizer=tok, pad_token_id=tok.pad_token_id)
    resumed = cfg.resume and trainer.resume()
    if resumed:
        print(f"[ludic] resumed from step {trainer.step} in {run_dir}", flush=True)
    if league is not None:
        if not resumed:
            league.load_state_dict({"snapshots": []})  # a fresh run starts with an empty league
        league.maybe_snapshot(model, trainer.step)

    def measure(step: int) -> dict[str, float]:
        tables: dict[str, Any] = {}
        ex = exploitability(model, tok, names, cfg.temperature, tables)
        if ex:
            with (run_dir / "policy_tables.jsonl").open("a") as f:  # what the NashConv was computed from
                f.write(json.dumps({"step": step, "tables": tables}) + "\n")
            curve.append({"step": step, **ex})
            logger.log(step, ex)
            print(f"[games] step {step}: " + ", ".join(f"{k} {v:.4f}" for k, v in ex.items()), flush=True)
        return ex

    async def evaluator() -> dict[str, float]:  # the trainer's: every eval_every steps and at the last
        ex = measure(trainer.step)
        return {**ex, "nash_conv": statistics.fmean(ex.values())} if ex else ex

    trainer.evaluator, trainer.eval_every = evaluator, cfg.eval_every
    trainer.keep_best = "-nash_conv" if cfg.keep_best else ""
    if not (trainer.keep_best and trainer.step == 0):  # else the trainer measures the start, a keep-best candidate
        measure(trainer.step)

    def on_step(step: int, metrics: dict[str, Any]) -> None:
        if league is not None:
            league.maybe_snapshot(model, step)

    try:
        last, failure = await train_until_stop(trainer, cfg.train_steps, on_step)
        if cfg.final_save or failure is not None:  # a stopped run keeps its best weights
            trainer.save()
    finally:
        logger.close()
    summary = {**{k: v for k, v in last.items() if isinstance(v, (int, float))}, "exploitability": curve,
               "stopped": trainer.stopped}
    if b := trainer.best:
        summary["kept"] = {"step": b["step"], "nash_conv": b["value"], "last_step": b["last_step"],
                           "last_nash_conv": b["last_eval"]["nash_conv"]}
        print(f"[games] kept step {b['step']} (mean NashConv {b['value']:.4f}); the last step, {b['last_step']}, "
              f"measured {b['last_eval']['nash_conv']:.4f}", flush=True)
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    if failure is not None:
        raise failure
    return summary


@dataclass
class EvalGamesConfig(ModelBlock, GamesBlock, EvalInferenceBlock):
    """Evaluate a model (or LoRA adapter) on OpenSpiel games."""

    episodes: int = 100
    """Episodes per game (sampled evaluation; the seat and chance come from fixed seeds)."""
    temperature: float = 0.0
    exploitability: bool = False
    """Also compute the exact NashConv (kuhn_poker, leduc_poker) and, on tic_tac_toe, the share of
    value-preserving moves over every position (from the model's action probabilities)."""
    concurrency: int = 64
    seed: int = 0
    out: str | None = None
    """Write the results JSON here too."""


def mean_ci(xs: Sequence[float]) -> tuple[float, float, float]:
    """Mean and its normal-approximation 95% interval (clipped to [0, 1])."""
    if not xs:
        return 0.0, 0.0, 1.0
    m = statistics.fmean(xs)
    half = 1.959963984540054 * statistics.stdev(xs) / math.sqrt(len(xs)) if len(xs) > 1 else 1.0
    return m, max(0.0, m - half), min(1.0, m + half)


def eval_games(cfg: EvalGamesConfig) -> dict[str, Any]:
    return asyncio.run(_eval_games(cfg))


async def _eval_games(cfg: EvalGamesConfig) -> dict[str, Any]:
    from ludic.eval.stats import wilson_interval
    from ludic.recipes.backends import make_eval_client

    client, close = await make_eval_client(cfg)
    results: dict[str, Any] = {}
    try:
        engine = RolloutEngine(protocols(client, cfg, cfg.temperature), concurrency=cfg.concurrency)
        for game in parse_games(cfg.games):
            name = game_name(game)
            rng = random.Random(cfg.seed)
            specs = [env_spec(cfg, game, rng) for _ in range(cfg.episodes)]
            reqs = [RolloutRequest(spec, protocol="selfplay" if spec.kwargs.get("seats") else "single_agent",
                                   env_seed=1_000_000 + i, sampling_seed=1_000_000 + i, max_steps=cfg.max_turns,
                                   meta={"game": name}) for i, spec in enumerate(specs)]
            rollouts = await engine.generate_rollouts(reqs, progress=f"eval {name}")
            scores = [episode_score(r) for r in rollouts]
            done = [s for s in scores if s is not None]
            wins = sum(s > 0.5 for s in done)
            steps = [s for r in rollouts for s in r.steps]
            invalid = sum(1 for s in steps if s.info.get("invalid"))
            m, lo, hi = mean_ci([s if s is not None else 0.0 for s in scores])
            row = {"episodes": len(rollouts), "mean_score": m, "mean_score_ci95": [lo, hi],
                   "success_rate": wins / max(len(rollouts), 1),
                   "success_rate_ci95": list(wilson_interval(wins, len(rollouts))),
                   "invalid_answer_rate": invalid / max(len(steps), 1),
                   "invalid_answer_rate_ci95": list(wilson_interval(invalid, len(steps))),
                   "unfinished_rate": 1 - len(done) / max(len(rollouts), 1)}
            if cfg.exploitability:
                row.update(_exact(client, name, cfg.temperature))
            results[name] = row
    finally:
        await close()
    if cfg.out:
        Path(cfg.out).write_text(json.dumps(results, indent=2))
    return results


def _exact(client: Any, name: str, temperature: float) -> dict[str, float]:
    """NashConv (poker) or value-preserving moves (tic_tac_toe) of the in-process model."""
    from ludic.envs.openspiel import OpenSpielEnv
    from ludic.eval.games import board_key, policy_table, value_preserving_rate

    model, tok = getattr(client, "model", None), getattr(client, "tokenizer", None)
    if model is None:
        raise ValueError("--exploitability reads the model's probabilities: use --inference transformers")
    temp = temperature or 1.0
    if name in EXPLOITABILITY_GAMES:
        return {"nash_conv": exploitability(model, tok, [name], temp)[f"nash_conv/{name}"]}
    if name == "tic_tac_toe":
        env = OpenSpielEnv(game=name)
        return value_preserving_rate(env.game, policy_table(env, model, tok, temperature=temp, key=board_key))
    return {}
