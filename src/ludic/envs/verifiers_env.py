"""verifiers environments, unchanged, as Ludic envs: ``EnvSpec("verifiers:<taskset id | module | module:function>")``.

verifiers 0.4 (``verifiers.v1``) splits an environment into a ``Taskset`` (the rows: each a ``Task`` whose
``TaskData`` holds the prompt, the system prompt and the row's own fields such as an answer), the task's rubric
(``@vf.reward`` methods with weights and ``@vf.metric`` methods, called with what their signature names: ``task``,
``trace``), its tools (``Toolset`` servers with ``@vf.tool`` methods), ``@vf.stop`` conditions, and an ``Env``
whose ``run(task, agents)`` drives the agents (a multi-turn env talks to its agent through
``agent.interaction(task)``: ``await interaction.turn(feedback)``). A *harness* program normally plays the agent
seat. Here Ludic's agent plays it: the env's own code runs as written, on a private event loop, and each model
call of the seat is one Ludic turn with its exact tokens.

- ``<spec>``: a verifiers taskset id (a top-level module exporting its ``Taskset``, and optionally an ``Env``,
  via ``__all__``, verifiers' own convention; hub ids ``owner/name@version`` load the installed ``name``), a
  module exposing ``load_environment(**kwargs)``, or ``module:function``; the latter two return a verifiers
  ``Env`` or ``Taskset``. ``env_args`` go to the loader (or become the taskset's config fields).
- Reset renders the task as the harness would: the system prompt is the env's ``suggested_sysprompt``, a prompt
  given as messages opens the dialog (``opening_messages``: few-shot turns before the question), and the last user
  message is the observation. ``info["instance"]`` is the prompt text (with the row's content hash when rows share
  a prompt but differ in hidden fields, as seeded games do).
- Step hands the reply to the env's ``run`` (the seat's segment ends: ``interaction.turn`` returns it); the env's
  next user turn is the next observation. ``@vf.stop`` conditions on the trace and the seat's ``max_turns`` end
  the exchange. At the end the task's rubric scores the verifiers trace (``Task.score``: every reward with its
  weight, every metric), then ``Env.finalize``; the step's reward is the trace's weighted sum, and the last step's
  info holds each reward function's score and each metric by name (``env/<name>`` in the run's metrics).
- Tools: the taskset's and the tasks' ``Toolset`` methods are the env's ``tools``, which ``ludic train env``
  hands to Ludic's ``ToolAgent`` (its call format, schemas from the signatures, results as tool messages, errors
  as data). A call runs the toolset's own method with the episode's state and is recorded in the trace.
- Turn limit: the seat's ``max_turns`` (its agent config, or ``max_turns`` in the env kwargs; default 10) ends the
  exchange and scores it, as verifiers' limit does; Ludic's own limit is set to match (``--max-turns`` would cut an
  episode short of its scoring).
- Splits: seed ``s`` picks training row ``s % n_train`` (``split="train"``) or held-out row ``s % n_eval``
  (``split="eval"``, what ``ludic train env`` / ``eval env`` use for held-out episodes). The held-out rows are a
  fixed random ``eval_fraction`` of the taskset, or, with ``eval_args``, the taskset loaded with those arguments
  (its own eval split). An infinite taskset trains on its first ``train_size`` rows and holds out the next
  ``eval_size``.

Not supported: envs with several agent seats, a second agent run in one episode, signals that need a sandbox
runtime (verifiers skips them when scoring offline, and so does this adapter), ``Request``/``Response`` stops.
Needs ``pip install 'ludic[envs]'`` (or ``verifiers``).
"""

from __future__ import annotations

import asyncio
import contextvars
import functools
import importlib
import json
import queue
import random
import threading
import weakref
from typing import Any, Iterator

from ludic.envs.base import SingleAgentEnv
from ludic.types import JSON, Message, StepOutcome

_EPISODE: contextvars.ContextVar["_Episode | None"] = contextvars.ContextVar("ludic_verifiers_episode", default=None)
"""The episode whose env was reset in this task's context: where a tool call (run by the agent) belongs."""
_LOOP: asyncio.AbstractEventLoop | None = None
_LOCK = threading.Lock()
_SOURCES: dict[str, "_Source"] = {}


def _loop() -> asyncio.AbstractEventLoop:
    """The private event loop (a daemon thread) every verifiers coroutine runs on: Ludic steps envs synchronously
    inside its own loop."""
    global _LOOP
    with _LOCK:
        if _LOOP is None:
            _LOOP = asyncio.new_event_loop()
            threading.Thread(target=_LOOP.run_forever, name="ludic-verifiers", daemon=True).start()
    return _LOOP


def _run(coro: Any, timeout: float | None = None) -> Any:
    """Run a coroutine on the private loop and wait for its result."""
    return asyncio.run_coroutine_threadsafe(coro, _loop()).result(timeout)


def _vf() -> Any:
    try:
        import verifiers.v1 as vf
    except ImportError as e:
        raise ImportError("the verifiers adapter needs verifiers>=0.4: pip install 'ludic[envs]'") from e
    return vf


def _load(spec: str, args: dict[str, Any]) -> Any:
    """The verifiers ``Env`` or ``Taskset`` a spec names (see the module docstring)."""
    from ludic.envs.registry import cwd_importable, import_attr

    vf = _vf()
    dotted = "." in spec and "/" not in spec and "@" not in spec  # a module path, not a hub id (owner/name@1.0)
    cwd_importable()
    try:
        target = (import_attr(spec) if ":" in spec else importlib.import_module(spec) if dotted
                  else vf.import_taskset(spec))
    except ModuleNotFoundError as e:  # the registry's contract: an unknown kind is a KeyError (a usage error)
        raise KeyError(f"env kind verifiers:{spec}: {e}") from e
    loader = target if ":" in spec else getattr(target, "load_environment", None)
    if callable(loader):
        obj = loader(**args)
    elif dotted:
        raise ValueError(f"verifiers:{spec}: verifiers loads a taskset id as a top-level module; put its folder on "
                         "PYTHONPATH and name the module alone, or give module:function")
    else:
        obj = vf.load_environment(vf.resolve_env_config({"taskset": {"id": spec, **args}}))
    if not isinstance(obj, (vf.Env, vf.Taskset)):
        raise TypeError(f"verifiers:{spec} gave a {type(obj).__name__}, not a verifiers Env or Taskset")
    return obj


class _Source:
    """One loaded verifiers env: its rows (materialised once, more on demand for an infinite taskset), seat, turn
    limit and shared tool servers; cached per spec and arguments (the engine builds an env per episode)."""

    def __init__(self, spec: str, args: dict[str, Any]) -> None:
        from verifiers.v1.configs.agent import agent_config_fields

        from ludic.envs.verifiers_bridge import tools_of

        obj = _load(spec, args)
        self.spec = spec
        self.env = obj if isinstance(obj, _vf().Env) else None
        self.taskset = obj.taskset if self.env is not None else obj
        seats = agent_config_fields(self.env.config) if self.env is not None else {"agent": None}
        if len(seats) != 1:
            raise ValueError(f"verifiers:{spec} declares {len(seats)} agent seats ({sorted(seats)}); the adapter "
                             "plays single-seat envs")
        (self.seat, seat_cfg), = seats.items()
        self.max_turns = getattr(seat_cfg, "max_turns", None)
        self.bounded = self.taskset.bounded
        self._iter: Iterator[Any] = iter(self.taskset)
        self.rows: list[Any] = list(self._iter) if self.bounded else []
        self.shared = list(type(self.taskset).toolsets(self.taskset.config))
        for server in self.shared:
            _run(server.setup())
        task_cls = type(self.taskset).task_type()
        self.tools = {**tools_of(self.shared), **tools_of(task_cls.toolsets(self.taskset.config.task))}
        sample = self.rows if self.bounded else [self.row(i) for i in range(8)]
        self.hidden = _shares_prompts(sample)

    def row(self, i: int) -> Any:
        while len(self.rows) <= i:
            self.rows.append(next(self._iter))
        return self.rows[i]

    def instance(self, task: Any) -> str:
        """The instance key: the prompt text, with the content hash when rows share prompts (hidden fields)."""
        text = task.data.prompt_text
        return f"{text}\n#{_content_key(task)}" if self.hidden or not text else text


def _content_key(task: Any) -> str:
    from verifiers.v1.task import task_key

    return task_key(task.data.model_dump(mode="json", exclude_none=True, exclude={"idx", "id", "name"}))[:16]


def _shares_prompts(tasks: list[Any]) -> bool:
    """Whether two rows show the same prompt but differ in content (a seeded game, a duplicated question)."""
    seen: dict[str, str] = {}
    return any(seen.setdefault(t.data.prompt_text, _content_key(t)) != _content_key(t) for t in tasks)


def source(spec: str, args: dict[str, Any] | None = None) -> _Source:
    key = f"{spec}\0{json.dumps(args or {}, sort_keys=True, default=str)}"
    if key not in _SOURCES:
        _SOURCES[key] = _Source(spec, dict(args or {}))
    return _SOURCES[key]


class VerifiersEnv(SingleAgentEnv):
    """A verifiers environment played by a Ludic agent (see the module docstring).

    Args:
        spec: a taskset id, a module with ``load_environment``, or ``module:function``.
        split: ``"train"`` or ``"eval"`` (held-out rows).
        env_args: keyword arguments of the loader (the taskset's config fields for a taskset id).
        eval_args: arguments merged into ``env_args`` for the eval split (the env's own eval rows); default: a
            fixed random ``eval_fraction`` of the rows is held out.
        eval_fraction, eval_size: the held-out share, or count, of a finite taskset's rows.
        train_size: an infinite taskset's training rows (the next ``eval_size``, default 100, are held out).
        max_turns: the seat's reply limit (default: the env's agent config, else 10).
        timeout_s: how long a step waits for the env's code.
    """

    def __init__(self, spec: str, *, split: str = "train", env_args: dict[str, Any] | None = None,
                 eval_args: dict[str, Any] | None = None, eval_fraction: float = 0.2, eval_size: int | None = None,
                 train_size: int = 1000, max_turns: int | None = None, timeout_s: float = 600.0) -> None:
        super().__init__()
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        self.split, self.timeout_s = split, timeout_s
        self.source = source(spec, env_args)
        self.eval_source = source(spec, {**(env_args or {}), **eval_args}) if eval_args else None
        self.max_turns = max_turns or self.source.max_turns or 10
        self._rows = self._split_rows(eval_fraction, eval_size, train_size)
        self.episode: _Episode | None = None
        self._finalizer = weakref.finalize(self, _Episode.cancel_ref, [None])

    def _split_rows(self, fraction: float, size: int | None, train_size: int) -> tuple[Any, list[int] | None]:
        """(source, row indices of this split; None: an infinite taskset's range)."""
        if self.eval_source is not None:
            src = self.eval_source if self.split == "eval" else self.source
            return src, (list(range(len(src.rows))) if src.bounded else None)
        src = self.source
        if not src.bounded:
            self._infinite = (train_size, size or 100)
            return src, None
        n = len(src.rows)
        n_eval = min(n - 1, size if size is not None else max(1, round(n * fraction))) if n > 1 else 0
        order = list(range(n))
        random.Random(0).shuffle(order)
        if n_eval <= 0:  # one row: both splits are it (the held-out machinery labels the run "trained instances")
            return src, order
        return src, sorted(order[:n_eval] if self.split == "eval" else order[n_eval:])

    def _task(self, seed: int) -> tuple[Any, int]:
        src, rows = self._rows
        if rows is None:
            if src is self.eval_source:
                return src.row(seed % 1000), seed % 1000
            n_train, n_eval = self._infinite
            i = seed % n_train if self.split == "train" else n_train + seed % n_eval
            return src.row(i), i
        i = rows[seed % len(rows)]
        return src.rows[i], i

    @property
    def tools(self) -> list[Any]:
        """The env's tools (its toolsets' ``@vf.tool`` methods) as Ludic ``Tool`` objects for a ``ToolAgent``."""
        from ludic.agents.tools import Tool, function_schema

        def call(_tool: str, /, **args: Any) -> Any:
            episode = _EPISODE.get()
            if episode is None:
                raise RuntimeError(f"{_tool}: no verifiers episode in this context (reset the env first)")
            return episode.call_tool(_tool, args)

        return [Tool(functools.partial(call, name), name=name, schema=function_schema(fn, name))
                for name, (_, fn) in self.source.tools.items()]

    @property
    def suggested_sysprompt(self) -> str | None:
        if self.episode is not None:
            return self.episode.system_prompt
        task, _ = self._task(0)
        return task.data.system_prompt

    @property
    def opening_messages(self) -> list[Message]:
        return list(self.episode.opening) if self.episode is not None else []

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        self._close()
        task, index = self._task(0 if seed is None else int(seed))
        self.episode = _Episode(self._rows[0], task, self.max_turns, self.timeout_s)  # the split's source
        self._finalizer.detach()
        self._finalizer = weakref.finalize(self, _Episode.cancel_ref, [self.episode])
        _EPISODE.set(self.episode)
        kind, payload = self.episode.start()
        if kind != "ask":
            raise ValueError(f"verifiers:{self.source.spec}: the env's run() ended before the agent's first turn")
        info = {"split": self.split, "index": index, "instance": self._rows[0].instance(task), "task_key": task.key}
        if task.data.name:
            info["name"] = task.data.name
        return payload, info

    def env_step(self, action: str) -> StepOutcome:
        assert self.episode is not None
        kind, payload = self.episode.reply(action)
        if kind == "ask":
            return StepOutcome(payload, 0.0)
        trace = payload
        info: dict[str, Any] = {"stop_condition": trace.stop_condition, "model_turns": trace.num_turns,
                                "reward_weights": {k: r.weight for k, r in trace.rewards.items() if r is not None}}
        for name, value in trace.metrics.items():
            if value is not None:
                info[name] = float(value)
        for name, r in trace.rewards.items():  # each reward function's (unweighted) score
            if r is not None:
                info[name] = r.score
        if trace.info:
            info["trace_info"] = json.loads(json.dumps(trace.info, default=str))
        limit = trace.stop_condition in ("max_turns", "max_input_tokens", "max_output_tokens", "max_total_tokens")
        return StepOutcome("", float(trace.reward), terminated=not limit, truncated=limit, info=info)

    def _close(self) -> None:
        if self.episode is not None:
            self.episode.cancel()
            self.episode = None


class _Episode:
    """One verifiers episode on the private loop, handing each model turn to Ludic's ``step``: the env's ``run``
    asks (``("ask", observation)``) and waits for the reply; it ends with ``("done", trace)`` or an error."""

    def __init__(self, src: _Source, task: Any, max_turns: int, timeout_s: float) -> None:
        self.src, self.task, self.max_turns, self.timeout_s = src, task, max_turns, timeout_s
        self.events: queue.Queue = queue.Queue()
        self.waiting: asyncio.Future | None = None
        self.trace: Any = None
        self.system_prompt: str | None = task.data.system_prompt
        self.opening: list[Message] = []
        self.servers: dict[str, tuple[Any, Any]] = {}
        self.future: Any = None

    def start(self) -> tuple[str, Any]:
        self.future = asyncio.run_coroutine_threadsafe(self._main(), _loop())
        return self._next()

    def reply(self, action: str) -> tuple[str, Any]:
        _loop().call_soon_threadsafe(self._deliver, action)
        return self._next()

    def _deliver(self, action: str) -> None:
        if self.waiting is not None and not self.waiting.done():
            self.waiting.set_result(action)

    def _next(self) -> tuple[str, Any]:
        try:
            kind, payload = self.events.get(timeout=self.timeout_s)
        except queue.Empty:
            raise TimeoutError(f"verifiers:{self.src.spec}: no answer from the env in {self.timeout_s}s") from None
        if kind == "error":
            raise payload
        return kind, payload

    def cancel(self) -> None:
        if self.future is not None and not self.future.done():
            self.future.cancel()

    @staticmethod
    def cancel_ref(box: list) -> None:
        if box and box[0] is not None:
            box[0].cancel()

    async def ask(self, observation: str) -> str:
        """The seat's next reply to ``observation`` (called by the bridge on the private loop)."""
        self.waiting = asyncio.get_running_loop().create_future()
        self.events.put(("ask", observation))
        return await self.waiting

    async def _main(self) -> None:
        try:
            self.events.put(("done", await self._play()))
        except asyncio.CancelledError:
            raise
        except BaseException as e:  # noqa: BLE001 - handed to the step that waits, which raises it
            self.events.put(("error", e))

    async def _play(self) -> Any:
        from verifiers.v1.agent import Agents

        from ludic.envs.verifiers_bridge import BridgeAgent

        env, task = self.src.env, self.task
        if env is None:  # a bare taskset plays as verifiers' SingleAgentEnv does: one run of the seat
            await BridgeAgent("agent", self).run(task)
        else:
            agents = Agents(env.config, lambda name, _: BridgeAgent(name, self))
            await env.setup(agents)
            await env.run(task, agents)
        if self.trace is None:
            raise ValueError(f"verifiers:{self.src.spec}: run() ran no agent")
        if env is not None:
            await env.finalize(task, _episode_record(env, task, self.trace))
        return self.trace

    def call_tool(self, name: str, args: dict[str, Any]) -> Any:
        """Run one tool call (from the agent's thread) on the private loop, with the episode's state."""
        return _run(self._call_tool(name, args), self.timeout_s)

    async def _call_tool(self, name: str, args: dict[str, Any]) -> Any:
        from ludic.envs.verifiers_bridge import call_with_state

        if name not in self.servers:
            raise KeyError(f"unknown tool {name!r}; this env's tools: {', '.join(self.servers) or 'none'}")
        server, fn = self.servers[name]
        return await call_with_state(self, name, server, fn, args)


def _episode_record(env: Any, task: Any, trace: Any) -> Any:
    """The verifiers ``Episode`` that ``Env.finalize`` judges."""
    vf = _vf()
    return vf.Episode(env=vf.EnvInfo(id=env.config.env_id), traces=[trace],
                      task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash))
