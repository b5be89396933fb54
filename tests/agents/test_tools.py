"""ToolAgent / ReActAgent: schemas from callables, call formats, every tool failure as a tool message,
and masking (only sampled tokens train; tool results are context)."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from ludic.agents.tools import (
    FORMATS, ReActAgent, Tool, ToolAgent, check_arguments, detect_format, function_schema,
)
from ludic.envs.qa import QAEnv, make_answer_parser
from ludic.interaction import SingleAgentProtocol
from ludic.rollouts.batch import build_saw_items
from ludic.rollouts.credit import MonteCarloReturn


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: the first term.
        b: the second term,
            on two lines.
    """
    return a + b


def boom(x: str) -> str:
    """Always fails."""
    raise RuntimeError(f"boom on {x}")


def slow() -> str:
    """Sleeps too long."""
    time.sleep(2.0)
    return "late"


def test_schema_from_signature_and_docstring():
    s = function_schema(add)["function"]
    assert s["name"] == "add" and s["description"] == "Add two integers."
    assert s["parameters"]["required"] == ["a", "b"]
    assert s["parameters"]["properties"]["a"] == {"type": "integer", "description": "the first term."}
    assert s["parameters"]["properties"]["b"]["description"] == "the second term, on two lines."

    def opt(q: str, n: int | None = None, mode: str = "x", xs: list[float] = ()) -> None:
        """Q."""
    p = function_schema(opt)["function"]["parameters"]
    assert p["required"] == ["q"] and p["properties"]["n"] == {"type": "integer"}
    assert p["properties"]["xs"] == {"type": "array", "items": {"type": "number"}}


def test_check_arguments():
    schema = function_schema(add)
    assert check_arguments(schema, {"a": 1, "b": 2}) is None
    assert "missing" in check_arguments(schema, {"a": 1})
    assert "unknown" in check_arguments(schema, {"a": 1, "b": 2, "c": 3})
    assert "'b' must be integer" in check_arguments(schema, {"a": 1, "b": "2"})
    assert "must be integer" in check_arguments(schema, {"a": True, "b": 2})  # bool is not an int
    assert "JSON object" in check_arguments(schema, [1, 2])


class _Tok:
    def __init__(self, template):
        self.chat_template = template


def test_format_detection_and_parsing():
    assert detect_format(_Tok("{% if tools %}<tool_call>{% endif %}")).name == "hermes"
    assert detect_format(_Tok("[TOOL_CALLS] {{ x }}")).name == "mistral"
    assert detect_format(_Tok("<|python_tag|>{{ x }}")).name == "llama3"
    assert detect_format(_Tok("{{ messages }}")).name == "tagged"
    h = FORMATS["hermes"].parse('ok <tool_call>\n{"name": "add", "arguments": {"a": 1, "b": 2}}\n</tool_call>')
    assert [(c.name, c.arguments) for c in h] == [("add", {"a": 1, "b": 2})]
    m = FORMATS["mistral"].parse('[TOOL_CALLS][{"name": "add", "arguments": {"a": 1, "b": 2}}, '
                                 '{"name": "add", "arguments": "{\\"a\\": 3, \\"b\\": 4}"}]')
    assert [c.arguments for c in m] == [{"a": 1, "b": 2}, {"a": 3, "b": 4}]
    ll = FORMATS["llama3"].parse('<|python_tag|>{"name": "add", "parameters": {"a": 5, "b": 6}}<|eom_id|>')
    assert ll[0].arguments == {"a": 5, "b": 6}
    assert FORMATS["llama3"].parse('<tool_call>{"name": "add", "arguments": {}}</tool_call>')[0].name == "add"
    bad = FORMATS["tagged"].parse('<tool_call>{"name": "add", "arguments": {"a": 1,}}</tool_call>')
    assert bad[0].name == "add" and bad[0].arguments is None and "not valid JSON" in bad[0].error
    assert FORMATS["tagged"].parse("The answer is 3.") == []


def _call(name, args) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"


def _run(agent, env, max_steps=8):
    return asyncio.run(SingleAgentProtocol(agent).run(env, max_steps=max_steps, env_seed=0))[0]


def test_tool_loop_masks_tool_results(scripted, tokenizer):
    client = scripted([_call("add", {"a": 20, "b": 22}), "42"], tokenizer)
    agent = ToolAgent(client, [add], parser=make_answer_parser("number"))
    r = _run(agent, QAEnv("What is 20 + 22?", "42", grader="numeric"))
    assert [s.info.get("tool_step", False) for s in r.steps] == [True, False]
    assert r.steps[0].next_obs == "42" and r.steps[0].info["tool_calls"][0]["name"] == "add"
    assert r.steps[1].reward == 1.0 and r.steps[1].info["correct"]
    # the tools are described in the system prompt; the second call's prompt carries the tool message
    assert '"name": "add"' in client.requests[0].messages[0]["content"]
    assert client.requests[1].messages[-1] == {"role": "tool", "content": "42"}

    [item] = build_saw_items([r], MonteCarloReturn())
    ids, mask = item.completion_ids, item.action_mask
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    context = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    assert '"add"' in trained and trained.rstrip().endswith("42<|im_end|>")
    assert "tool\n42" in context and "add" not in context  # the tool result is context, never trained
    assert len(ids) == len(r.steps[0].trace.completion_ids) + len(r.steps[1].trace.prompt_ids) \
        - len(r.steps[0].trace.prompt_ids) - len(r.steps[0].trace.completion_ids) + len(r.steps[1].trace.completion_ids)


@pytest.mark.parametrize("reply, expect", [
    (_call("mul", {"a": 1}), "unknown tool 'mul'; available tools: add, boom, slow"),
    ('<tool_call>{"name": "add", "arguments": {"a": 1, }}</tool_call>', "not valid JSON"),
    (_call("add", {"a": 1, "b": "two"}), "argument 'b' must be integer"),
    (_call("add", {"a": 1}), "missing required argument(s): b"),
    (_call("boom", {"x": "y"}), "boom raised RuntimeError: boom on y"),
    (_call("slow", {}), "slow timed out after 0.2s"),
])
def test_tool_failures_become_messages_and_the_loop_goes_on(scripted, tokenizer, reply, expect):
    client = scripted([reply, "7"], tokenizer)
    agent = ToolAgent(client, [add, boom, Tool(slow, timeout_s=0.2)], parser=make_answer_parser("number"),
                      tool_error_reward=-0.5)
    r = _run(agent, QAEnv("?", "7", grader="numeric"))
    assert len(r.steps) == 2 and not r.meta["failed"]
    first = r.steps[0]
    assert first.info["tool_step"] and first.reward == -0.5
    assert expect in first.next_obs and first.next_obs.startswith("Error: ")
    assert client.requests[1].messages[-1]["role"] == "tool"
    assert r.steps[1].reward == 1.0


def test_a_refused_calculator_call_is_a_message_the_model_reads(scripted, tokenizer):
    """The power tower a sampled call could send is refused before any arithmetic; the model reads why."""
    from ludic.envs.qa import calculator

    client = scripted([_call("calculator", {"expression": "9**9**9**9"}), "7"], tokenizer)
    agent = ToolAgent(client, [calculator], parser=make_answer_parser("number"), tool_error_reward=-0.5)
    r = _run(agent, QAEnv("?", "7", grader="numeric"))
    assert r.steps[0].next_obs == ("Error: calculator raised ValueError: operator Pow is not allowed: only numbers "
                                   "and + - * / ( ) are allowed")
    assert r.steps[0].reward == -0.5 and r.steps[1].reward == 1.0


def test_tool_call_limit(scripted, tokenizer):
    client = scripted([_call("add", {"a": 1, "b": 1})] * 3 + ["2"], tokenizer)
    agent = ToolAgent(client, [add], parser=make_answer_parser("number"), max_tool_calls=2)
    r = _run(agent, QAEnv("?", "2", grader="numeric"))
    assert [s.next_obs for s in r.steps[:3]] == ["2", "2", "Error: tool call limit of 2 reached; answer now without tools"]
    assert r.steps[-1].reward == 1.0


def test_history_free_context_is_refused(scripted, tokenizer):
    from ludic.context import LastObservationContext

    with pytest.raises(ValueError, match="keeps tool results"):
        ToolAgent(scripted(["x"], tokenizer), [add], LastObservationContext())


def test_react_agent_thinks_acts_observes(scripted, tokenizer):
    client = scripted([
        "Thought: I should add.\n" + _call("add", {"a": 2, "b": 3}),
        "Thought: the tool says 5.",  # neither a call nor an answer: a parse-error step with feedback
        "Thought: done.\nFinal Answer: 5",
    ], tokenizer)
    agent = ReActAgent(client, [add], answer_parser=make_answer_parser("number"))
    r = _run(agent, QAEnv("2+3?", "5", grader="numeric"))
    assert [bool(s.info.get("tool_step")) for s in r.steps] == [True, False, False]
    assert r.steps[1].parse_error and "Final Answer" in r.steps[1].next_obs
    assert r.steps[2].parsed_action == "5" and r.steps[2].reward == 1.0
    system = client.requests[0].messages[0]["content"]
    assert system.startswith("Solve the task step by step") and '"name": "add"' in system


def test_react_step_limit_ends_at_max_steps(scripted, tokenizer):
    client = scripted(["Thought: again.\n" + _call("add", {"a": 1, "b": 1})], tokenizer)
    agent = ReActAgent(client, [add], max_tool_calls=1)
    r = _run(agent, QAEnv("?", "2", grader="numeric"), max_steps=3)
    assert len(r.steps) == 3 and r.steps[-1].truncated and r.meta["truncation_reason"] == "max_steps"
    assert "limit of 1 reached" in r.steps[1].next_obs
