"""Your own tools in one call: ``ludic.train(env, tools=[lookup])`` and ``ludic train env / eval env --tools
module:function``: the env is played by Ludic's ``ToolAgent`` (schemas from the signature and docstring, results as
tool messages, errors as data), the config records the tools by name, and a format cold start's teacher can call
them (``tests/tool_envs.py``: the value of a key readable only through ``lookup(key)``)."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import tool_envs
from ludic.errors import UsageError
from ludic.recipes.env_setup import EnvConfig, protocols, resolve_tools, tool_spec

TESTS = Path(__file__).resolve().parent


def test_tools_are_recorded_by_importable_name_and_resolved_back():
    assert tool_spec(tool_envs.lookup) == "tool_envs:lookup"
    assert resolve_tools("tool_envs:lookup, tool_envs:demo") == [tool_envs.lookup, tool_envs.demo]

    def local(x: int) -> int:
        """Twice x."""
        return 2 * x

    name = tool_spec(local)  # not importable back: registered for this process under a name the config records
    assert name.startswith("python:") and "local" in name and resolve_tools(name) == [local]
    with pytest.raises(UsageError, match="does not import"):
        resolve_tools("tool_envs:no_such_tool")
    with pytest.raises(UsageError, match="module:function"):
        resolve_tools("lookup")
    with pytest.raises(UsageError, match="serves one process only"):
        resolve_tools("python:__main__.elsewhere")


def test_the_tool_agent_plays_the_env_with_tool_messages_and_errors_as_data(tokenizer):
    from ludic.envs.registry import register_env
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.recipes.format_demos import demo_teacher
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import EnvSpec, RolloutRequest

    register_env("test_keys", tool_envs.KeyEnv)
    opts = EnvConfig(env="test_keys", tools="tool_envs:lookup")

    def rollouts(reply):
        protos = protocols(FunctionClient(tokenizer, reply), opts, tool_envs.KeyEnv(), SamplingParams(max_tokens=48))
        reqs = [RolloutRequest(EnvSpec("test_keys", {}), protocol="single_agent", env_seed=s) for s in range(2)]
        return asyncio.run(RolloutEngine(protos).generate_rollouts(reqs))

    for r in rollouts(demo_teacher(tool_envs.demo)):  # one env turn (max_turns 1), the tool call on top of it
        call, answer = r.steps
        assert call.info["tool_step"] and call.next_obs == tool_envs.TABLE[r.meta["reset_info"]["instance"]]
        assert answer.terminated and answer.reward == 1.0
        prompt = tokenizer.decode(answer.trace.prompt_ids)
        assert '"name": "lookup"' in prompt and "the key to look up." in prompt  # schema from signature + docstring
        assert "<|im_start|>tool\n" + call.next_obs in prompt  # the result, as a tool message

    def bad(messages):
        if messages[-1]["role"] == "tool":
            return "No idea."
        return '<tool_call>{"name": "lookup", "arguments": {"key": "nope"}}</tool_call>'

    for r in rollouts(bad):
        assert not r.meta.get("failed") and "KeyError" in r.steps[0].next_obs and r.steps[-1].reward == 0.0


def test_a_tool_agent_that_repeats_a_failing_call_ends_its_episode(tokenizer):
    """The calculator run of docs/study.md: a policy that repeats one failing tool call looped 18 turns (every
    call an error) and made steps take 190-435 s. Three tool turns in a row that all fail end the episode,
    truncated with the reason ``tool_errors``; a failed call followed by a good one does not."""
    from ludic.envs.registry import register_env
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import EnvSpec, RolloutRequest

    register_env("test_keys", tool_envs.KeyEnv)
    opts = EnvConfig(env="test_keys", tools="tool_envs:lookup")

    def rollout(reply):
        protos = protocols(FunctionClient(tokenizer, reply), opts, tool_envs.KeyEnv(), SamplingParams(max_tokens=48))
        req = RolloutRequest(EnvSpec("test_keys", {}), protocol="single_agent", env_seed=0)
        return asyncio.run(RolloutEngine(protos).generate_rollouts([req]))[0]

    r = rollout(lambda messages: '<tool_call>{"name": "lookup", "arguments": {"key": "nope"}}</tool_call>')
    assert len(r.steps) == 3 and all(s.info["tool_errors"] for s in r.steps)
    assert r.steps[-1].truncated and r.meta["truncation_reason"] == "tool_errors"

    def recovers(messages):  # two failing calls, then the right one, then the answer
        tools = [m for m in messages if m["role"] == "tool"]
        if len(tools) < 2:
            return '<tool_call>{"name": "lookup", "arguments": {"key": "nope"}}</tool_call>'
        if len(tools) == 2:
            question = next(m["content"] for m in messages if m["role"] == "user")
            return tool_envs.demo(question)
        return tools[-1]["content"]

    r = rollout(recovers)
    assert [bool(s.info.get("tool_errors")) for s in r.steps[:2]] == [True, True]
    assert r.meta["truncation_reason"] != "tool_errors" and len(r.steps) == 4


def ludic_cli(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ludic", *args], capture_output=True, text=True, timeout=1200, env=env)


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_ludic_train_with_tools_and_a_tool_calling_cold_start_then_the_command_line(tiny_model_dir, tokenizer,
                                                                                    tmp_path):
    import ludic

    out = ludic.train(tool_envs.KeyEnv, tools=[tool_envs.lookup], format_demos=tool_envs.demo, format_demo_steps=1,
                      model=str(tiny_model_dir), run_dir=str(tmp_path / "run"), train_steps=1, group_size=2,
                      prompts_per_step=2, eval_episodes=2, eval_every=0, max_completion_tokens=24, logger="none",
                      dtype="float32", max_no_signal_steps=0)
    assert json.loads((out.run_dir / "config.json").read_text())["env"]["tools"] == "tool_envs:lookup"
    demos = lines(out.run_dir / "format_demos.jsonl")
    assert demos and all(r["steps"][0]["info"]["tool_results"] == [tool_envs.TABLE[r["meta"]["reset_info"]["instance"]]]
                         and r["total_reward"] == 1.0 for r in demos)
    for r in lines(out.run_dir / "rollouts.jsonl"):
        prompt = tokenizer.decode(r["steps"][0]["trace"]["prompt_ids"])
        assert '"name": "lookup"' in prompt
        for s in r["steps"]:
            reply = tokenizer.decode(s["trace"]["completion_ids"], skip_special_tokens=True)
            assert reply.strip() == s["action"].strip()

    run = tmp_path / "cli"
    proc = ludic_cli("train", "env", "--env", "tool_envs:KeyEnv", "--tools", "tool_envs:lookup", "--model",
                     str(tiny_model_dir), "--run-dir", str(run), "--train-steps", "1", "--group-size", "2",
                     "--prompts-per-step", "2", "--eval-episodes", "2", "--eval-every", "0",
                     "--max-completion-tokens", "8", "--max-no-signal-steps", "0", "--logger", "none",
                     "--dtype", "float32")
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert json.loads((run / "config.json").read_text())["env"]["tools"] == "tool_envs:lookup"
    evald = tmp_path / "eval.jsonl"
    proc = ludic_cli("eval", "env", "--env", "tool_envs:KeyEnv", "--tools", "tool_envs:lookup", "--model",
                     str(tiny_model_dir), "--episodes", "2", "--max-completion-tokens", "8", "--dtype", "float32",
                     "--out", str(evald))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert all('"name": "lookup"' in tokenizer.decode(r["steps"][0]["trace"]["prompt_ids"]) for r in lines(evald))
