"""The agent seat of a verifiers env, played by Ludic turns (``ludic.envs.verifiers_env``).

A verifiers ``Env.run(task, agents)`` calls ``agents.<seat>.run(task)`` (one segment on the task's prompt) or
``agents.<seat>.interaction(task)`` (``await interaction.turn(message)``: one segment per user turn). Here a segment
is one Ludic step: the bridge hands the observation to the Ludic env's ``step`` and waits for the reply (tool calls
happen in between, through Ludic's ``ToolAgent``, and are recorded in the trace by ``call_with_state``). The
bridge keeps the verifiers ``Trace`` the env and the rubric read: the system prompt, the prompt, each user turn,
each reply, each tool call and result, as message nodes (Ludic keeps the tokens). Closing it scores the trace with
the task's own rubric, as a verifiers rollout's close does.
"""

from __future__ import annotations

import contextlib
import inspect
import json
from typing import Any, AsyncIterator

from ludic.types import Message


def _vf() -> Any:
    import verifiers.v1 as vf

    return vf


def _text(content: Any) -> str:
    from verifiers.v1.types import content_text

    return content_text(content)


def add_node(trace: Any, message: Any, sampled: bool = False) -> None:
    """Append ``message`` to the trace's message graph (one linear branch)."""
    trace.nodes.append(_vf().MessageNode(parent=len(trace.nodes) - 1 if trace.nodes else None, message=message,
                                         sampled=sampled))


async def _call_hook(fn: Any, trace: Any) -> Any:
    """A task hook (``finalize``, ``setup``) that needs no sandbox runtime, called as verifiers does; skipped when it
    is the base class's no-op or needs a runtime (none runs here)."""
    from verifiers.v1.utils.decorators import invoke

    base = getattr(_vf().Task, fn.__name__, None)
    param = inspect.signature(fn).parameters.get("runtime")
    if getattr(fn, "__func__", None) is base or (param is not None and param.default is inspect.Parameter.empty):
        return None
    out = invoke(fn, {"trace": trace, "runtime": None})
    return await out if inspect.isawaitable(out) else out


def tool_name(server: Any, fn: Any) -> str:
    """The name verifiers advertises a toolset's tool under (``<server>_<tool>``, bare without a prefix)."""
    name = getattr(fn, "tool_name", None) or fn.__name__
    return f"{server.server_name}_{name}" if server.server_name else name


def tools_of(servers: list[Any]) -> dict[str, tuple[Any, Any]]:
    """``{tool name: (server, bound @vf.tool method)}`` of toolset instances."""
    from verifiers.v1.utils.decorators import discover_decorated

    return {tool_name(s, fn): (s, fn) for s in servers for fn in discover_decorated(s, "tool")}


class BridgeAgent:
    """Stands in for a verifiers ``Agent`` in the env's ``run``: ``run(task)`` and ``interaction(task)``, served by
    Ludic turns of ``episode`` (a ``verifiers_env._Episode``)."""

    trainable: bool = True

    def __init__(self, name: str, episode: Any) -> None:
        self.name, self.episode = name, episode

    async def run(self, task: Any, **_: Any) -> Any:
        """One segment on the task's prompt, then the trace, closed and scored."""
        if task.data.prompt is None:
            raise ValueError("agent.run(task) needs a prompted task (a prompt-less one takes interaction())")
        async with self.interaction(task) as interaction:
            await interaction.turn()
            interaction.trace.stop("agent_completed")
        return interaction.trace

    @contextlib.asynccontextmanager
    async def interaction(self, task: Any, **_: Any) -> AsyncIterator["BridgeInteraction"]:
        """The exchange turn by turn; leaving it closes the trace and scores it."""
        interaction = BridgeInteraction(self.name, self.episode, task)
        await interaction.open()
        try:
            yield interaction
        finally:
            await interaction.close()


class BridgeInteraction:
    """verifiers' ``Interaction`` over Ludic turns: ``turn(message)`` sends a user turn (a prompted task's first,
    bare turn sends its prompt) and returns the seat's ``Segment``; ``trace`` is live."""

    def __init__(self, name: str, episode: Any, task: Any) -> None:
        from verifiers.v1.session import hook_boundary
        from verifiers.v1.state import state_cls

        vf = _vf()
        if episode.trace is not None:
            raise ValueError("the verifiers adapter plays one agent run per episode; this env's run() started a second")
        self.trace = vf.Trace(task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
                              state=state_cls(type(task))(), agent=vf.AgentInfo(config=vf.AgentConfig(model="ludic"),
                                                                                name=name))
        episode.trace = self.trace
        self.episode, self.task = episode, task
        self.started = self.over = self.closed = False
        self.stops = [fn for fn in task.hooks("stop") if hook_boundary(fn, allow_trace=True) is vf.Trace]

    async def open(self) -> None:
        """The task's own tool servers (per rollout) and its ``setup``, as a rollout's open does."""
        servers = list(type(self.task).toolsets(self.task.config))
        for server in servers:
            await server.setup()
            await server.setup_task(self.task)
        self.episode.servers = {**tools_of(self.episode.src.shared), **tools_of(servers)}
        await _call_hook(self.task.setup, self.trace)

    def _first(self, message: Any) -> str:
        """Render the opening: system prompt(s), few-shot turns (``opening``) and the observation."""
        vf = _vf()
        data = self.task.data
        prompt = data.prompt if data.prompt is not None else message
        messages = _messages(prompt)
        if not messages or messages[-1].role != "user":
            raise ValueError("a verifiers prompt must end with a user message (the agent's first observation)")
        system = [data.system_prompt] if data.system_prompt else []
        opening: list[Message] = []
        for m in messages[:-1]:
            if m.role == "system":
                system.append(_text(m.content))
            elif m.role in ("user", "assistant"):
                opening.append({"role": m.role, "content": _text(m.content) if m.role == "user" else (m.content or "")})
            else:
                raise ValueError(f"a {m.role} message in a verifiers prompt cannot open a Ludic dialog")
        self.episode.system_prompt = "\n\n".join(system) or None
        self.episode.opening = opening
        if data.system_prompt:
            add_node(self.trace, vf.SystemMessage(content=data.system_prompt))
        for m in messages:
            add_node(self.trace, m)
        return _text(messages[-1].content)

    async def turn(self, message: Any = None) -> Any:
        """One user turn (``None``: a prompted task's opening) and the seat's reply as a verifiers ``Segment``."""
        vf = _vf()
        if self.over or self.closed:
            raise RuntimeError("the exchange is over (the run ended); read interaction.trace")
        prompted = not self.started and self.task.data.prompt is not None
        if message is None and not prompted:
            raise ValueError("nothing to run a turn on: a bare turn() takes a prompted task's opening reply")
        if message is not None and prompted:
            raise ValueError("the task's prompt opens this exchange: take its first reply with a bare turn()")
        if self.trace.stop_condition is not None:  # a stop or the turn limit ended it after the last segment
            self.over = True
            return vf.Segment(messages=[], terminated=True)
        if not self.started:
            observation = self._first(message)
        else:
            messages = _messages(message)
            for m in messages:
                add_node(self.trace, m)
            observation = "\n\n".join(_text(m.content) for m in messages)
        self.started = True
        start = len(self.trace.nodes)
        reply = await self.episode.ask(observation)
        add_node(self.trace, vf.AssistantMessage(content=reply), sampled=True)
        for fn in self.stops:
            from verifiers.v1.session import call_hook

            if await call_hook(fn, {vf.Trace: self.trace}):
                self.trace.stop(fn.__name__)
        if self.trace.num_turns >= self.episode.max_turns:
            self.trace.stop("max_turns")
        new = self.trace.nodes[start:]
        return vf.Segment(messages=[n.message for n in new if n.sampled or n.message.role == "tool"])

    async def send(self, message: str, **_: Any) -> dict:
        """A user message delivered as the next turn (verifiers' queue mode; steering has no meaning here)."""
        segment = await self.turn(message)
        return {"outcome": "promptRequired" if segment.terminated else "injected"}

    steer = send

    async def close(self) -> Any:
        """End the exchange: the task's ``finalize`` and its rubric (``Task.score``; signals that need a sandbox
        runtime are skipped, as in verifiers' offline scoring). Idempotent."""
        if self.closed:
            return self.trace
        self.closed = True
        self.trace.stop("user_closed")  # the first stop condition wins
        await _call_hook(self.task.finalize, self.trace)
        await self.task.score(self.trace)
        self.trace.is_completed, self.trace.ok = True, True
        return self.trace


def _messages(message: Any) -> list[Any]:
    """A user turn (text, or messages typed or as dicts) as verifiers messages."""
    vf = _vf()
    if isinstance(message, str):
        return [vf.UserMessage(content=message)]
    from verifiers.v1.dialects import parse_message

    return [parse_message(m) if isinstance(m, dict) else m for m in message]


async def call_with_state(episode: Any, name: str, server: Any, fn: Any, args: dict[str, Any]) -> Any:
    """Call a toolset's ``@vf.tool`` method with the episode's state (``server.state`` inside it, as verifiers'
    state channel gives a served tool), and record the call and its result in the trace."""
    from verifiers.v1.mcp.server import _call_state  # the tool's view of the rollout state (no public setter)

    vf = _vf()
    trace = episode.trace
    call_id = f"call_{len(trace.nodes)}"
    add_node(trace, vf.AssistantMessage(tool_calls=[vf.ToolCall(id=call_id, name=name, arguments=json.dumps(args))]),
             sampled=True)
    state = trace.state
    own = state if isinstance(state, server._state_cls) else server._state_cls.model_validate(
        {k: v for k, v in state.model_dump().items() if k in server._state_cls.model_fields})
    token = _call_state.set(own)
    try:
        result = fn(**args)
        if inspect.isawaitable(result):
            result = await result
    except Exception as e:
        add_node(trace, vf.ToolMessage(tool_call_id=call_id, name=name, content=f"Error: {type(e).__name__}: {e}"))
        raise
    finally:
        _call_state.reset(token)
    if own is not state:  # the toolset's own state class: its fields back into the trace's state
        for k in server._state_cls.model_fields:
            if k in type(state).model_fields:
                setattr(state, k, getattr(own, k))
    text = result if isinstance(result, str) else json.dumps(result, default=str)
    add_node(trace, vf.ToolMessage(tool_call_id=call_id, name=name, content=text))
    return result
