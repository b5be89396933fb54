"""Tool-using agents: ``ToolAgent`` (call tools until an answer) and ``ReActAgent`` (think, act, observe).

Tools are plain Python callables. Their JSON schema comes from the signature
and the docstring (Google style ``Args:``)::

    def add(a: int, b: int) -> int:
        '''Add two integers.

        Args:
            a: the first term.
            b: the second term.
        '''
        return a + b

    agent = ToolAgent(client, [add], parser=boxed_parser)

One model call is one ``Step``. When the model calls tools, the agent runs
them and appends one ``tool`` message per call; the protocol records the call
as a *tool step* (the env is not stepped, ``info["tool_calls"]``) and asks the
agent again. A missing tool, invalid JSON arguments, a wrong argument type, an
exception or a timeout each become a tool message the model reads: the loop
goes on and the run never dies of a bad call.

Only sampled tokens are trained: the tool results enter the next prompt, which
``ludic.rollouts.batch`` lays out between completions with action mask 0.

Call formats (``ToolCallFormat``): the model's own chat-template format where the
template has one (Hermes/Qwen ``<tool_call>{json}</tool_call>``, Mistral
``[TOOL_CALLS][...]``, Llama 3 ``<|python_tag|>{json}``), detected from the
template text, with the tagged-JSON ``<tool_call>`` form as the fallback for
templates that have none (SmolLM2). Every format also reads the fallback tags.
The same parser object serves training and evaluation (``ToolAgent.call_parser``).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import re
import types
import typing
from dataclasses import dataclass, field
from typing import Any, Callable

from ludic.agents.agent import Agent, AgentTurn
from ludic.context import ContextStrategy, FullDialog
from ludic.inference.client import ChatClient, SamplingParams
from ludic.parsers import ParseResult, Parser, compose_parsers, identity_parser
from ludic.types import JSON, Message

# ---------------------------------------------------------------------------------------------
# Tools and their schemas
# ---------------------------------------------------------------------------------------------

_JSON_TYPES: dict[Any, str] = {int: "integer", float: "number", str: "string", bool: "boolean",
                               dict: "object", list: "array", type(None): "null"}


def _type_schema(hint: Any, where: str) -> JSON:
    """JSON schema of one annotation (int, float, str, bool, list[X], dict, Literal, Optional)."""
    origin = typing.get_origin(hint)
    if hint in _JSON_TYPES:
        return {"type": _JSON_TYPES[hint]}
    if origin is typing.Literal:
        values = list(typing.get_args(hint))
        return {"type": _JSON_TYPES[type(values[0])], "enum": values}
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) == 1:
            return _type_schema(args[0], where)
        return {"anyOf": [_type_schema(a, where) for a in args]}
    if origin in (list, tuple, set):
        args = typing.get_args(hint)
        return {"type": "array", **({"items": _type_schema(args[0], where)} if args else {})}
    if origin is dict:
        return {"type": "object"}
    if hint is Any or hint is inspect.Parameter.empty:
        return {}
    raise TypeError(f"{where}: cannot describe the type {hint!r} in JSON schema")


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """(description, {arg: description}) from a Google-style docstring."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    desc: list[str] = []
    args: dict[str, str] = {}
    section, current = "desc", None
    for line in lines:
        stripped = line.strip()
        if re.fullmatch(r"(Args|Arguments|Parameters):", stripped):
            section = "args"
            continue
        if re.fullmatch(r"(Returns|Return|Raises|Yields|Examples?|Notes?):", stripped):
            section = "other"
            continue
        if section == "desc":
            if not stripped and desc:
                section = "desc_done"
            elif stripped:
                desc.append(stripped)
        elif section == "args" and stripped:
            m = re.match(r"(\*{0,2}\w+)\s*(\([^)]*\))?\s*:\s*(.*)", stripped)
            if m and not line.startswith(" " * 8):
                current = m.group(1).lstrip("*")
                args[current] = m.group(3)
            elif current:
                args[current] = (args[current] + " " + stripped).strip()
    return " ".join(desc), args


def function_schema(fn: Callable[..., Any], name: str | None = None) -> JSON:
    """OpenAI-style function schema of ``fn`` from its signature and docstring."""
    name = name or fn.__name__
    hints = typing.get_type_hints(fn)
    desc, arg_docs = _docstring_parts(fn.__doc__)
    props: JSON = {}
    required: list[str] = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            raise TypeError(f"tool {name!r}: *args/**kwargs cannot be described in a schema")
        schema = _type_schema(hints.get(p.name, inspect.Parameter.empty), f"tool {name!r} argument {p.name!r}")
        if p.name in arg_docs:
            schema["description"] = arg_docs[p.name]
        props[p.name] = schema
        if p.default is inspect.Parameter.empty:
            required.append(p.name)
    return {"type": "function", "function": {
        "name": name, "description": desc,
        "parameters": {"type": "object", "properties": props, "required": required},
    }}


def _type_ok(value: Any, schema: JSON) -> bool:
    if "anyOf" in schema:
        return any(_type_ok(value, s) for s in schema["anyOf"])
    if "enum" in schema and value not in schema["enum"]:
        return False
    t = schema.get("type")
    if t is None:
        return True
    if t == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if t == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if t == "array":
        return isinstance(value, list) and all(_type_ok(v, schema.get("items", {})) for v in value)
    return isinstance(value, {"string": str, "boolean": bool, "object": dict, "null": type(None)}[t])


def check_arguments(schema: JSON, args: Any) -> str | None:
    """Why ``args`` does not fit the function schema (None when it fits)."""
    params = schema["function"]["parameters"]
    if not isinstance(args, dict):
        return f"arguments must be a JSON object, got {type(args).__name__}"
    missing = [k for k in params["required"] if k not in args]
    if missing:
        return f"missing required argument(s): {', '.join(missing)}"
    unknown = [k for k in args if k not in params["properties"]]
    if unknown:
        return f"unknown argument(s): {', '.join(unknown)}; expected: {', '.join(params['properties'])}"
    for k, v in args.items():
        prop = params["properties"][k]
        if not _type_ok(v, prop):
            want = prop.get("type") or prop.get("anyOf") or prop.get("enum")
            return f"argument {k!r} must be {want}, got {json.dumps(v)} ({type(v).__name__})"
    return None


@dataclass
class Tool:
    """A callable the model may call, with its schema and a timeout."""

    fn: Callable[..., Any]
    name: str = ""
    timeout_s: float = 10.0
    schema: JSON = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.name = self.name or self.fn.__name__
        self.schema = self.schema or function_schema(self.fn, self.name)

    @classmethod
    def of(cls, obj: "Tool | Callable[..., Any]") -> "Tool":
        return obj if isinstance(obj, Tool) else cls(obj)

    async def run(self, args: JSON) -> str:
        """Call the tool; the result as text (JSON for dicts and lists). Raises on failure or timeout."""
        if inspect.iscoroutinefunction(self.fn):
            out = await asyncio.wait_for(self.fn(**args), self.timeout_s)
        else:  # a timed-out sync tool keeps its worker thread until it returns (threads cannot be killed)
            out = await asyncio.wait_for(asyncio.to_thread(self.fn, **args), self.timeout_s)
        return out if isinstance(out, str) else json.dumps(out)


# ---------------------------------------------------------------------------------------------
# Tool-call formats and the call parser
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolCall:
    """One parsed call: ``arguments`` is None when they were not valid JSON (``error`` says why)."""

    name: str
    arguments: JSON | None
    error: str | None = None

    def to_dict(self) -> JSON:
        return {"name": self.name, "arguments": self.arguments, "error": self.error}


_TAGGED = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def _call_from_obj(obj: Any, raw: str) -> ToolCall:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", None, f'a tool call must be a JSON object with a "name", got: {raw[:200]}')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI-style arguments given as a JSON string
        try:
            args = json.loads(args)
        except json.JSONDecodeError as e:
            return ToolCall(obj["name"], None, f"arguments are not valid JSON ({e.msg}): {args[:200]}")
    return ToolCall(obj["name"], args)


def _calls_from_json(raw: str) -> list[ToolCall]:
    try:
        obj = json.loads(raw)
    except json.JSONDecodeError as e:
        m = re.search(r'"name"\s*:\s*"([^"]+)"', raw)
        return [ToolCall(m.group(1) if m else "", None, f"tool call is not valid JSON ({e.msg}): {raw[:200]}")]
    objs = obj if isinstance(obj, list) else [obj]
    return [_call_from_obj(o, raw) for o in objs]


@dataclass(frozen=True)
class ToolCallFormat:
    """How one model family writes tool calls, and how to tell it about the tools."""

    name: str
    marker: str
    """Text that starts a call in this format ('' for the fallback)."""
    example: str
    """How to write a call, as shown in the system prompt."""

    def parse(self, text: str) -> list[ToolCall]:
        """Every call in ``text`` (the fallback's tagged form is always read)."""
        calls = [c for m in _TAGGED.finditer(text) for c in _calls_from_json(m.group(1))]
        if calls or not self.marker or self.marker not in text:
            return calls
        body = text.split(self.marker, 1)[1].strip()
        return _calls_from_json(body.split("<|eom_id|>")[0].split("<|eot_id|>")[0].strip())

    def instructions(self, tools: list[Tool]) -> str:
        specs = "\n".join(json.dumps(t.schema["function"]) for t in tools)
        return (f"You can call these tools:\n{specs}\n"
                f"To call a tool, write {self.example}. The result comes back in the next message.")


FORMATS: dict[str, ToolCallFormat] = {
    "hermes": ToolCallFormat("hermes", "<tool_call>",
                             '<tool_call>{"name": TOOL, "arguments": {...}}</tool_call>'),
    "mistral": ToolCallFormat("mistral", "[TOOL_CALLS]", '[TOOL_CALLS][{"name": TOOL, "arguments": {...}}]'),
    "llama3": ToolCallFormat("llama3", "<|python_tag|>", '<|python_tag|>{"name": TOOL, "parameters": {...}}'),
    "tagged": ToolCallFormat("tagged", "", '<tool_call>{"name": TOOL, "arguments": {...}}</tool_call>'),
}


def detect_format(tokenizer: Any) -> ToolCallFormat:
    """The tool-call format the tokenizer's chat template speaks (``tagged`` when it has none)."""
    template = getattr(tokenizer, "chat_template", None) or ""
    if isinstance(template, dict):
        template = " ".join(template.values())
    for fmt in ("hermes", "mistral", "llama3"):
        if FORMATS[fmt].marker in template:
            return FORMATS[fmt]
    return FORMATS["tagged"]


@dataclass(frozen=True)
class ToolCallParse:
    """The action of a turn that called tools (``ParseResult.action`` stays a str for the env)."""

    calls: list[ToolCall]


class ToolCallParser:
    """Model text -> tool calls or a final answer. One object serves training and evaluation.

    ``parse(text)`` returns ``(calls, answer)``: the calls when the text has
    any, otherwise the answer parser's result.
    """

    def __init__(self, fmt: ToolCallFormat, answer_parser: Parser = identity_parser) -> None:
        self.format = fmt
        self.answer_parser = answer_parser

    def __call__(self, text: str) -> tuple[list[ToolCall], ParseResult | None]:
        calls = self.format.parse(text)
        return (calls, None) if calls else ([], self.answer_parser(text))


# ---------------------------------------------------------------------------------------------
# Agents
# ---------------------------------------------------------------------------------------------


class ToolAgent(Agent):
    """An agent that may call tools before it answers.

    Args:
        client, context, sampling, model, reject_incomplete, timeout_s: as for ``Agent``.
        tools: callables or ``Tool`` objects.
        parser: the final-answer parser (what the env receives).
        call_format: a ``FORMATS`` name; default: detected from the client's tokenizer.
        max_tool_calls: calls allowed per episode; later calls get a "limit reached" tool message.
        tool_error_reward: reward of a model call whose tool calls failed (bad JSON, unknown tool, ...).
        describe_tools: put the tool schemas and the call syntax into the system prompt.
    """

    def __init__(
        self,
        client: ChatClient,
        tools: list[Tool | Callable[..., Any]],
        context: ContextStrategy | None = None,
        parser: Parser = identity_parser,
        sampling: SamplingParams | None = None,
        *,
        call_format: str | None = None,
        max_tool_calls: int = 8,
        tool_error_reward: float = 0.0,
        describe_tools: bool = True,
        **kw: Any,
    ) -> None:
        context = context if context is not None else FullDialog()
        if context.history_free:
            raise ValueError(f"{type(self).__name__} needs a context that keeps tool results "
                             f"(full or truncated), not {type(context).__name__}")
        super().__init__(client, context, parser, sampling, **kw)
        self.tools = {t.name: t for t in map(Tool.of, tools)}
        fmt = FORMATS[call_format] if call_format else detect_format(client.tokenizer)
        self.call_parser = ToolCallParser(fmt, parser)
        self.parser = self._parse  # Agent.act parses with this
        self.max_tool_calls = max_tool_calls
        self.tool_error_reward = tool_error_reward
        self.describe_tools = describe_tools
        self.calls_made = 0
        self._calls: list[ToolCall] = []

    def system_prompt(self, base: str | None) -> str:
        """The system prompt with the tool descriptions appended."""
        tools = self.call_parser.format.instructions(list(self.tools.values()))
        return f"{base}\n\n{tools}" if base else tools

    def reset(self, system_prompt: str | None = None) -> None:
        super().reset(system_prompt)
        if self.describe_tools:
            h = self.ctx.history
            if h and h[0]["role"] == "system":
                h[0]["content"] = self.system_prompt(h[0]["content"])
            else:
                h.insert(0, {"role": "system", "content": self.system_prompt(None)})
        self.calls_made = 0

    def _parse(self, text: str) -> ParseResult:
        calls, answer = self.call_parser(text)
        self._calls = calls
        if calls:  # a placeholder: act() turns it into a tool turn
            return ParseResult(None, 0.0, None)
        assert answer is not None
        return answer

    async def call_tool(self, call: ToolCall) -> tuple[str, str | None]:
        """(tool message text, error or None) for one call; never raises."""
        if call.arguments is None:
            return f"Error: {call.error}", call.error
        tool = self.tools.get(call.name)
        if tool is None:
            err = f"unknown tool {call.name!r}; available tools: {', '.join(self.tools) or 'none'}"
            return f"Error: {err}", err
        if self.calls_made >= self.max_tool_calls:
            err = f"tool call limit of {self.max_tool_calls} reached; answer now without tools"
            return f"Error: {err}", err
        self.calls_made += 1
        bad = check_arguments(tool.schema, call.arguments)
        if bad:
            return f"Error: {call.name}: {bad}", bad
        try:
            return await tool.run(call.arguments), None
        except asyncio.TimeoutError:
            err = f"{call.name} timed out after {tool.timeout_s}s"
        except Exception as e:  # the model sees the failure; the run goes on
            err = f"{call.name} raised {type(e).__name__}: {e}"
        return f"Error: {err}", err

    async def act(self, sampling_seed: int | None = None) -> AgentTurn:
        self._calls = []
        turn = await super().act(sampling_seed)
        calls = self._calls
        if not calls or turn.failed_request or turn.info.get("incomplete_completion"):
            return turn
        results = [await self.call_tool(c) for c in calls]
        messages: list[Message] = [{"role": "tool", "content": text} for text, _ in results]
        for text, _ in results:
            self.ctx.add_tool_result(text)
        errors = [e for _, e in results if e]
        turn.tool_messages = messages
        turn.parse = ParseResult(None, self.tool_error_reward if errors else 0.0, None)
        turn.info.update(parse_error=False, tool_calls=[c.to_dict() for c in calls],
                         tool_errors=errors, tool_results=[t for t, _ in results])
        return turn


REACT_PROMPT = (
    "Solve the task step by step. In each reply, first write 'Thought:' and your reasoning, then either "
    "call one tool, or write 'Final Answer:' followed by the answer."
)


def final_answer_parser(raw: str) -> ParseResult:
    """The text after the last ``Final Answer:``."""
    m = list(re.finditer(r"Final Answer:\s*(.+)", raw, re.IGNORECASE | re.DOTALL))
    if not m or not m[-1].group(1).strip():
        return ParseResult(None, -1.0, "Call a tool, or end with 'Final Answer: <answer>'.")
    return ParseResult(m[-1].group(1).strip(), 0.0, None)


class ReActAgent(ToolAgent):
    """Think, act, observe: a ``ToolAgent`` with the ReAct prompt, a step limit and a final-answer action.

    Each reply is ``Thought: ...`` and then one tool call or ``Final Answer: ...``;
    the answer is what the env receives (``answer_parser`` refines it, e.g. a number).
    After ``max_tool_calls`` calls every further call is answered with the limit
    message, so the episode ends at the protocol's ``max_steps`` at the latest.
    """

    def __init__(self, client: ChatClient, tools: list[Tool | Callable[..., Any]],
                 context: ContextStrategy | None = None, answer_parser: Parser | None = None,
                 sampling: SamplingParams | None = None, *, max_tool_calls: int = 5, **kw: Any) -> None:
        parser = final_answer_parser if answer_parser is None else compose_parsers(final_answer_parser, answer_parser)
        ctx = context if context is not None else FullDialog(REACT_PROMPT)
        if ctx.default_system_prompt is None:
            ctx.default_system_prompt = REACT_PROMPT
        super().__init__(client, tools, ctx, parser, sampling, max_tool_calls=max_tool_calls, **kw)


__all__ = [
    "FORMATS", "REACT_PROMPT", "ReActAgent", "Tool", "ToolAgent", "ToolCall", "ToolCallFormat",
    "ToolCallParser", "check_arguments", "detect_format", "final_answer_parser", "function_schema",
]
