"""The environment side of ``ludic train env``, ``ludic eval env`` and the env pipeline: which env (``EnvConfig``, built
from a spec by ``probe_env``), the agent and protocols that play it (every seat the policy, or one seat against a
frozen opponent), the metrics of a batch of episodes and the held-out evaluation with its intervals."""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from ludic.errors import UsageError
from ludic.rollouts.engine import episode_success
from ludic.types import EnvSpec, Rollout, RolloutRequest

EVAL_SEED_BASE = 1_000_000_000
"""Evaluation episodes use env seeds from here up; training seeds are drawn below it."""
VAL_SEED_FIRST = 500
"""Test episodes draw their seeds from ``EVAL_SEED_BASE`` up, validation ones (the evaluations during training that
``--keep-best`` chooses on) from ``EVAL_SEED_BASE + VAL_SEED_FIRST`` up; both sets keep distinct instances only,
the validation set none of the test set's (``held_out_for``: disjoint by content, not by seed arithmetic)."""


@dataclass
class EnvConfig:
    """Env: which environment, and how the agent sees and answers it (train env and eval env)."""

    env: str = ""
    """An env kind: registered name | textarena:ID | reasoning_gym:NAME | verifiers:ID | gem:ID | gym:ID |
    module:factory."""
    env_kwargs: str = ""
    """JSON object of keyword arguments for the env factory, e.g. '{"config": {"min_animals": 2}}'."""
    system_prompt: str | None = None
    """Default: the env's ``suggested_sysprompt`` (none for most)."""
    context: str = "auto"
    """full | last | truncated | auto (the env's ``preferred_context``, else full)."""
    max_turns: int = 0
    """Turn limit per episode; 0: the env's own (``LudicEnv.max_turns``, else 10)."""
    max_completion_tokens: int = 64
    opponent: str = "self"
    """Multi-player envs: self (self-play, every seat trains) | frozen (the starting policy, frozen)."""
    incomplete_penalty: float | None = None
    """A reply cut by --max-completion-tokens: None (default) hands it to the env as it is (many envs read a
    cut reply's answer; ``cut_reply_rate`` counts them); a number makes it a format failure (a parse error,
    the env not stepped) with that reward."""
    tools: str = ""
    """Python functions the agent may call (Ludic's ToolAgent), as module:function,module:function (``ludic.train``
    takes the callables); an env's own tools (a verifiers toolset) join them."""

    def kwargs(self) -> dict[str, Any]:
        if not self.env_kwargs:
            return {}
        try:
            out = json.loads(self.env_kwargs)
        except json.JSONDecodeError as e:
            raise UsageError(f"--env-kwargs is not JSON ({e}): {self.env_kwargs!r}") from e
        if not isinstance(out, dict):
            raise UsageError(f"--env-kwargs must be a JSON object, got {self.env_kwargs!r}")
        return out


def register_python_env(env: Any) -> str:
    """Register an env class, factory or instance's class under a kind of its own; returns the kind."""
    from ludic.envs.base import LudicEnv
    from ludic.envs.registry import register_env

    factory = type(env) if isinstance(env, LudicEnv) else env
    if not callable(factory):
        raise TypeError(f"env must be a kind string, a LudicEnv class or a factory; got {type(env).__name__}")
    kind = f"python:{getattr(factory, '__module__', '?')}.{getattr(factory, '__qualname__', id(factory))}"
    register_env(kind, factory)
    return kind


def probe_env(opts: EnvConfig) -> Any:
    """One env built from the spec (its agents, limits and preferred context); errors name the spec."""
    from ludic.envs.registry import make_env

    if not opts.env:
        raise UsageError("--env is required: a registered name, textarena:ID, reasoning_gym:NAME, verifiers:ID, "
                         "gem:ID or module:factory")
    try:
        return make_env(EnvSpec(opts.env, opts.kwargs()))
    except KeyError as e:
        raise UsageError(str(e.args[0]) if e.args else str(e)) from e


SPLIT_ADAPTERS = ("reasoning_gym:", "verifiers:")
"""Adapters with a split of their own: their held-out episodes take ``split="eval"``."""


def _eval_kwargs(opts: EnvConfig) -> dict[str, Any]:
    """Held-out episodes: an env with its own split (reasoning-gym, verifiers) takes split='eval', a QA dataset
    (``dataset_qa``) its split='test'."""
    kw = opts.kwargs()
    if opts.env.startswith(SPLIT_ADAPTERS):
        kw.setdefault("split", "eval")
    elif opts.env == "dataset_qa":  # a QA dataset's own test split
        kw.setdefault("split", "test")
    return kw


_TOOLS: dict[str, Callable[..., Any]] = {}
"""Tools given as callables (``ludic.train(tools=[...])``), by the name ``tool_spec`` records in the config."""


def tool_spec(fn: Any) -> str:
    """The config's name for a tool: ``module:function`` where that imports back to ``fn`` (a later
    ``--tools`` can use it), else ``python:module.qualname``, registered for this process."""
    from ludic.agents.tools import Tool

    if isinstance(fn, str):
        return fn
    target = fn.fn if isinstance(fn, Tool) else fn
    if not callable(target):
        raise TypeError(f"tools: {fn!r} is not a function")
    module, qualname = getattr(target, "__module__", "?"), getattr(target, "__qualname__", repr(target))
    importable = module != "__main__" and "<" not in qualname and "." not in qualname
    name = f"{module}:{qualname}" if importable else f"python:{module}.{qualname}"
    _TOOLS[name] = fn
    return name


def resolve_tools(spec: str) -> list[Any]:
    """``"module:function,..."`` (or names ``tool_spec`` registered) -> the callables; errors name the entry."""
    from ludic.envs.registry import import_attr

    out = []
    for name in (p.strip() for p in spec.split(",") if p.strip()):
        if name in _TOOLS:
            out.append(_TOOLS[name])
            continue
        if name.startswith("python:"):
            raise UsageError(f"--tools {name!r}: a function given to ludic.train(tools=...) that does not import "
                             "back (defined in __main__ or in a function) serves one process only: give "
                             "module:function")
        try:
            fn = import_attr(name) if ":" in name else None
        except (ImportError, AttributeError) as e:
            raise UsageError(f"--tools {name!r} does not import ({type(e).__name__}: {e})") from e
        if not callable(fn):
            raise UsageError(f"--tools {name!r}: give module:function (a Python function the agent may call)")
        out.append(fn)
    return out


def agent_tools(opts: EnvConfig, env: Any) -> list[Any]:
    """The agent's tools: the env's own (``env.tools``, e.g. a verifiers toolset's) and ``opts.tools``."""
    return [*getattr(env, "tools", []), *resolve_tools(opts.tools)]


def make_agent(client: Any, opts: EnvConfig, env: Any, sampling: Any) -> Any:
    """The policy's agent: a plain ``Agent`` (no parser: the env reads the raw reply), or Ludic's ``ToolAgent``
    when there are tools (``agent_tools``)."""
    from ludic.agents.agent import Agent
    from ludic.context import make_context

    ctx = opts.context if opts.context != "auto" else getattr(env, "preferred_context", "full")
    cut = opts.incomplete_penalty is not None  # a reply cut by the token limit: a format failure, or the env's to read
    cut_args = {"reject_incomplete": cut, "incomplete_penalty": opts.incomplete_penalty if cut else -1.0}
    tools = agent_tools(opts, env)
    if tools:
        from ludic.agents.tools import ToolAgent

        context = make_context(ctx, opts.system_prompt)
        if context.history_free:
            raise UsageError(f"tools need a context that keeps tool results (full or truncated), not {ctx!r}")
        return ToolAgent(client, tools, context, sampling=sampling, **cut_args)
    return Agent(client, make_context(ctx, opts.system_prompt), sampling=sampling, **cut_args)


def protocols(policy: Any, opts: EnvConfig, env: Any, sampling: Any, frozen: Any = None,
              frozen_sampling: Any = None) -> dict[str, Callable[[], Any]]:
    """Protocol factories by key: ``single_agent``; for multi-player envs ``self`` (every seat the policy)
    and ``seat<k>`` (the policy at seat k, the frozen client at the others)."""
    from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol

    ids = env.agent_ids
    if len(ids) == 1:
        def single() -> Any:
            agent = make_agent(policy, opts, env, sampling)  # a tool agent's calls come on top of the env's turns
            return SingleAgentProtocol(agent, extra_steps=getattr(agent, "max_tool_calls", 0))
        return {"single_agent": single}
    if agent_tools(opts, env):
        raise UsageError(f"tools: {opts.env} has {len(ids)} players; tools are for single-agent envs")
    out: dict[str, Callable[[], Any]] = {
        "self": lambda: MultiAgentProtocol({a: make_agent(policy, opts, env, sampling) for a in ids})}
    if frozen is not None:
        for k, seat in enumerate(ids):
            def factory(seat: str = seat) -> Any:
                agents = {a: make_agent(policy if a == seat else frozen, opts, env,
                                        sampling if a == seat else (frozen_sampling or sampling)) for a in ids}
                return MultiAgentProtocol(agents, frozen=[a for a in ids if a != seat])
            out[f"seat{k}"] = factory
    return out


def turns(r: Rollout) -> int:
    """The model's turns in an episode (not the no-turn step of a game that ended before its first)."""
    return sum(not s.no_turn for s in r.steps)


_NOT_ENV_INFO = {"success", "batch_size", "parse_error", "incomplete_completion", "inference_error"}
"""Step-info keys the agent and the engine add (not the env's own)."""


def env_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """The batch's reward and success, and every numeric key of the episodes' last-step info as ``env/<key>``."""
    done = [r for r in rollouts if not r.meta.get("failed") and r.steps]
    if not done:
        return {}
    out = {"reward_mean": statistics.fmean(r.total_reward for r in done),
           "reward_std": statistics.pstdev([r.total_reward for r in done]),
           "success_rate": statistics.fmean(episode_success(r) for r in done),
           "turns_mean": statistics.fmean(turns(r) for r in done)}
    keys: dict[str, list[float]] = {}
    for r in done:
        for k, v in r.steps[-1].info.items():
            if (isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
                    and k not in _NOT_ENV_INFO):
                keys.setdefault(k, []).append(float(v))
    out.update({f"env/{k}": statistics.fmean(v) for k, v in keys.items() if len(v) == len(done)})
    return out


def summarize(rollouts: Sequence[Rollout], seed: int = 0) -> dict[str, Any]:
    """The policy's episodes (its seat's, not a frozen opponent's) summarised by ``eval.samples.sample_summary``:
    success rate and pass@k with 95% intervals over problems (Wilson for one episode per problem; ``seed``: the
    bootstrap's where problems have several), mean reward with a normal one, majority vote where episodes are samples
    of one problem (``meta["problem"]``: ``eval.samples.expand_samples``; else each episode is a problem of its own),
    and the episodes' failure, parse-error and forfeit rates."""
    from ludic.eval.opponents import won_by_forfeit
    from ludic.eval.samples import outcome_of, sample_summary

    trained = [r for r in rollouts if r.meta.get("trainable", True)]
    ok = [r for r in trained if not r.meta.get("failed")]
    forfeits = sum(episode_success(r) >= 1.0 and won_by_forfeit(r) for r in ok)
    n = len(trained)
    out = sample_summary([outcome_of(r, r.meta.get("problem", ("episode", i))) for i, r in enumerate(trained)],
                         seed=seed)
    return {"episodes": n, **out, "failed_rate": (n - len(ok)) / n if n else 0.0,
            "parse_error_rate": statistics.fmean(any(s.parse_error for s in r.steps) for r in ok) if ok else 0.0,
            "turns_mean": statistics.fmean(turns(r) for r in ok) if ok else 0.0,
            "forfeit_win_rate": forfeits / n if n else 0.0,
            "play_win_rate": out["success_rate"] - forfeits / n if n else 0.0}


def eval_requests(opts: EnvConfig, env: Any, seeds: Sequence[int]) -> list[RolloutRequest]:
    """Held-out episodes on ``seeds`` (``held_out_for``'s test or validation seeds), the env's eval split;
    multi-player envs alternate the policy's seat against the frozen one (``seat<k>`` protocols)."""
    n_seats = len(env.agent_ids)
    spec = EnvSpec(opts.env, _eval_kwargs(opts))
    return [RolloutRequest(spec, protocol="single_agent" if n_seats == 1 else f"seat{i % n_seats}",
                           env_seed=seed, sampling_seed=seed - EVAL_SEED_BASE, max_steps=opts.max_turns or None)
            for i, seed in enumerate(seeds)]


def instance_key_fn(opts: EnvConfig, split: str) -> Callable[[int], str]:
    """``seed -> instance key`` (``eval.instances.instance_of``) on the env's training (``"train"``) or eval
    split: one env built once, reset per seed."""
    from ludic.envs.registry import make_env
    from ludic.eval.instances import instance_of

    env = make_env(EnvSpec(opts.env, _eval_kwargs(opts) if split == "eval" else opts.kwargs()))
    return lambda seed: instance_of(env.reset(seed))


def _seats(opts: EnvConfig) -> int:
    """The seats a held-out episode's policy alternates over (``eval_requests``): the env's agents."""
    return len(probe_env(opts).agent_ids)


def held_out_for(opts: EnvConfig, n_test: int, n_val: int, seed: int = 0) -> Any:
    """The run's held-out sets (``eval.instances.HeldOut``): ``n_test`` test and ``n_val`` validation instances,
    distinct and disjoint by content, from the eval seeds (test from ``EVAL_SEED_BASE``, validation from
    ``EVAL_SEED_BASE + VAL_SEED_FIRST``), and the instance space measured on training seeds (drawn with
    ``seed``): held out from training where it has room. ``ludic eval env`` builds the same test set."""
    import random

    from ludic.eval.instances import build_held_out

    key_of = instance_key_fn(opts, "eval")
    return build_held_out(key_of, instance_key_fn(opts, "train"), n_test=n_test, n_val=n_val, seats=_seats(opts),
                          test_seeds=range(EVAL_SEED_BASE, EVAL_SEED_BASE + VAL_SEED_FIRST),
                          val_seeds=range(EVAL_SEED_BASE + VAL_SEED_FIRST, EVAL_SEED_BASE + 100 * VAL_SEED_FIRST),
                          rng=random.Random(seed + 9176))


INSTANCES_FILE = "instances.json"
"""A ``train env`` run's instance keys: ``test``, ``val`` and ``trained`` (what ``ludic eval env --adapter`` reads to
count the test instances the adapter's run trained on)."""


def write_instances(path: Path, held: Any) -> None:
    path.write_text(json.dumps({"test": [k for _, k in held.test], "val": [k for _, k in held.val],
                                "trained": sorted(held.trained), "space": held.space}))


def trained_overlap(held: Any, adapter: str | None) -> dict[str, Any]:
    """The test set's instance report for a policy: how many of its instances the run that trained ``adapter``
    drew (from that run's ``instances.json``, found in the adapter's folder or up to three folders above it);
    unknown without one."""
    found = None
    if adapter:
        here = Path(adapter).resolve()
        found = next((p / INSTANCES_FILE for p in [here, *here.parents][:4] if (p / INSTANCES_FILE).exists()), None)
    test = {k for _, k in held.test}
    out: dict[str, Any] = {"test_distinct": len(test), "space": held.space}
    space = f"instance space {held.space['estimate']}{'' if held.space['exact'] else ' (estimated)'}"
    if found is None:
        out.update(test_trained=None, note=f"{len(test)} distinct test instances ({space}); "
                   + ("the base model: none trained on" if not adapter else "the adapter's run recorded no instances"))
        return out
    trained = set(json.loads(found.read_text()).get("trained", []))
    out.update(test_trained=len(test & trained), train_distinct=len(trained),
               note=f"{len(test)} distinct test instances ({space}), {len(test & trained)} of them trained on by the "
                    f"run in {found.parent}")
    return out


async def evaluate_episodes(protos: dict[str, Callable[[], Any]], reqs: list[RolloutRequest],
                            out: Path | None = None, desc: str = "eval") -> dict[str, Any]:
    from ludic.rollouts.engine import RolloutEngine

    engine = RolloutEngine(protos, concurrency=64, jsonl_path=out)
    if out is not None and out.exists():
        out.unlink()
    return summarize(await engine.generate_rollouts(reqs, progress=desc))


def format_summary(name: str, m: dict[str, Any]) -> str:
    """A summary (``summarize``) in a line; with several samples per problem, its pass@k and majority vote below."""
    from ludic.eval.samples import format_answer_spread, format_sample_metrics

    forfeit = (f" ({m['play_win_rate'] * 100:.1f}% in play, {m['forfeit_win_rate'] * 100:.1f}% by the opponent's "
               "invalid move or forfeit)" if m.get("forfeit_win_rate") else "")
    return (f"{name}: success {m['success_rate'] * 100:.1f}% (95% CI {m['success_ci95_low'] * 100:.1f}-"
            f"{m['success_ci95_high'] * 100:.1f}%){forfeit}, reward {m['reward_mean']:.3f} "
            f"({m['reward_ci95_low']:.3f} to {m['reward_ci95_high']:.3f}) on {m['episodes']} episodes, "
            f"{m['turns_mean']:.1f} turns, failed {m['failed_rate'] * 100:.1f}%"
            + (f"\n  {format_sample_metrics(m)}" if m.get("samples", 1) > 1 else "")
            + (f"\n  {spread}" if (spread := format_answer_spread(m)) else ""))


def opponent_suite(opts: EnvConfig, env: Any, policy: Any, tok: Any, seeds: Sequence[int], greedy: Any, *,
                   frozen: Any = None, league: Any = None, seed: int = 0) -> dict[str, tuple[dict, list]]:
    """The opponents a multi-player env is evaluated against (``eval.opponents``), each as (protocols, requests)
    on the test ``seeds``, the policy (``policy``, greedy) alternating its seat: ``frozen`` (the starting policy),
    ``random`` (a uniformly random legal player, where the observations list the legal moves), ``bot`` (the game
    package's own bot, where it has one) and ``league`` (a snapshot the policy never faced, when given)."""
    from ludic.envs.registry import make_env
    from ludic.eval.opponents import bot_spec, legal_moves, random_legal_reply
    from ludic.inference.client import FunctionClient

    out: dict[str, tuple[dict, list]] = {}
    requests = eval_requests(opts, env, seeds)
    if frozen is not None:
        out["frozen"] = (protocols(policy, opts, env, greedy, frozen, greedy), requests)
    probe = make_env(EnvSpec(opts.env, _eval_kwargs(opts))).reset(seeds[0] if seeds else EVAL_SEED_BASE)
    if any(legal_moves(obs) for obs, _ in probe.values()):
        rand = FunctionClient(tok, random_legal_reply(seed))
        out["random"] = (protocols(policy, opts, env, greedy, rand, greedy), requests)
    bot = bot_spec(opts.env, _eval_kwargs(opts))
    if bot is not None:
        spec = EnvSpec(opts.env, bot)
        out["bot"] = ({"single_agent": protocols(policy, opts, make_env(spec), greedy)["single_agent"]},
                      [RolloutRequest(spec, protocol="single_agent", env_seed=s, sampling_seed=s - EVAL_SEED_BASE,
                                      max_steps=opts.max_turns or None) for s in seeds])
    if league is not None:
        out["league"] = (protocols(policy, opts, env, greedy, league, greedy), requests)
    return out


LEAGUE_DIR = "league_snapshot"
"""Two-player envs: the adapter of the policy halfway through training, an evaluation opponent it never faced."""


class HalfwaySnapshot:
    """Two-player runs: the ``league`` opponent of the closing evaluation, the policy as it was halfway through
    training (a policy no training episode faced under ``--opponent frozen``), saved in ``<run>/league_snapshot/``.

    ``on_step`` takes it once half the budget or the steps have passed (``how`` says which); until then it keeps
    candidates at steps 1, 2, 4, 8, ... (``<run>/league_candidates/``, a ``League``), so a run that stops earlier
    (saturated, no signal) takes ``at_stop`` the candidate nearest half the steps it ran, and says so. ``record``
    (``{"step", "steps_run", "how"}``) goes into the summary; it is kept beside the weights, so a resumed run has it.
    """

    INFO = "ludic_snapshot.json"

    def __init__(self, run_dir: Path) -> None:
        from ludic.training.league import League

        self.dir, self.engine = run_dir / LEAGUE_DIR, None  # the engine: built on first use (``opponent``)
        self.record: dict[str, Any] = json.loads((self.dir / self.INFO).read_text()) if self.taken() else {}
        self.candidates = None if self.record else League(run_dir / "league_candidates", max_size=64, every=0)

    def taken(self) -> bool:  # the record is written last, with the weights
        return (self.dir / self.INFO).exists()

    def _keep(self, folder: Path, record: dict[str, Any]) -> None:
        """A candidate (written whole by ``League.add``) becomes the snapshot: moved, not copied; the rest go."""
        import shutil

        (folder / self.INFO).write_text(json.dumps(record))
        shutil.rmtree(self.dir, ignore_errors=True)
        folder.rename(self.dir)
        shutil.rmtree(self.candidates.root, ignore_errors=True)
        self.record = record

    def on_step(self, model: Any, step: int, half: str) -> None:
        """After optimizer step ``step``: ``half`` (why it is half way: "half the 30-minute budget", ...) or ""."""
        if self.taken():
            return
        if half or step & (step - 1) == 0:  # a power of two: a candidate
            snap = self.candidates.add(model, step)
            if half:
                self._keep(snap.path, {"step": step, "how": half})

    def at_stop(self, steps_run: int) -> None:
        """A run that ends before its halfway snapshot: the candidate nearest half of ``steps_run`` (ties: the
        later); none when it stopped before its first candidate."""
        if self.taken():
            self.record["steps_run"] = steps_run
        elif not self.candidates.snapshots:
            self.record = {"step": None, "steps_run": steps_run, "how": f"stopped after {steps_run} steps, before "
                           "its first snapshot (step 1): no league opponent"}
        else:
            snap = min(self.candidates.snapshots, key=lambda s: (abs(s.step - steps_run / 2), -s.step))
            self._keep(snap.path, {"step": snap.step, "steps_run": steps_run, "how": f"stopped after {steps_run} "
                                   "steps, before half its run: the snapshot nearest half the steps it ran"})
            print(f"[env] league snapshot: step {snap.step} of {steps_run} (the run stopped before half its run)",
                  flush=True)

    def opponent(self, model: Any, tok: Any) -> Any:
        """An engine playing the snapshot (None before it is taken): a frozen copy of ``model`` sharing its base
        weights, with the snapshot's loaded."""
        if self.engine is None and self.taken():
            from ludic.inference.transformers_engine import TransformersEngine
            from ludic.training.checkpoint import load_model_weights
            from ludic.training.reference import frozen_copy

            copy = frozen_copy(model, share_frozen=True)
            load_model_weights(copy, self.dir)
            self.engine = TransformersEngine(copy, tok)
        return self.engine


class TrainingSeeds:
    """Each step's requests: ``prompts_per_step`` training seeds (below ``EVAL_SEED_BASE``), none of whose instances
    is held out (``held.excludes``: the test and validation instances, where the space has room), and for a frozen
    opponent the trained seat alternating. Every instance drawn is recorded (``held.trained``: how many test
    instances the run trained on). Its state goes into the checkpoints (the batch source saves a ``requests_fn``'s
    ``state_dict``): a resumed run draws the seeds the uninterrupted run would have."""

    def __init__(self, cfg: Any, *, n_seats: int, multi: bool, held: Any = None) -> None:
        self.cfg, self.n_seats, self.multi = cfg, n_seats, multi
        import random

        self.spec = EnvSpec(cfg.env.env, cfg.env.kwargs())
        self.rng = random.Random(cfg.seed)
        self.drawn = 0
        self.key_of = instance_key_fn(cfg.env, "train")
        self.exclude: set[str] = held.excludes if held is not None else set()
        self.trained: set[str] = held.trained if held is not None else set()

    def _seed(self) -> int:
        """The next training seed whose instance is not held out (recorded as trained)."""
        for _ in range(100_000):
            seed = self.rng.randrange(EVAL_SEED_BASE)
            key = self.key_of(seed)
            if key not in self.exclude:
                self.trained.add(key)
                return seed
        raise RuntimeError(f"{self.cfg.env.env}: 100,000 training seeds in a row drew held-out instances")

    def __call__(self) -> list[RolloutRequest]:
        cfg, reqs = self.cfg, []
        for _ in range(cfg.prompts_per_step):
            key = ("single_agent" if not self.multi else "self" if cfg.env.opponent == "self"
                   else f"seat{self.drawn % self.n_seats}")
            reqs.append(RolloutRequest(self.spec, protocol=key, env_seed=self._seed(), max_steps=cfg.env.max_turns or None))
            self.drawn += 1
        return reqs

    def state_dict(self) -> dict[str, Any]:
        from ludic.rollouts.engine import rng_state

        return {"rng": rng_state(self.rng), "drawn": self.drawn, "trained": sorted(self.trained)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        from ludic.rollouts.engine import set_rng_state

        set_rng_state(self.rng, state["rng"])
        self.drawn = int(state["drawn"])
        self.trained.clear()
        self.trained.update(state.get("trained", []))
