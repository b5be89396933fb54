"""verifiers environments, unchanged (``verifiers:<taskset | module | module:function>``): environments written
with verifiers' own classes (``tests/verifiers_envs``: a single-turn taskset with two weighted rewards and a metric,
a multi-turn env that answers with feedback, a taskset with a tool server) played by Ludic agents, scored by their
own rubric, split into train and held-out rows, and trained and evaluated on the tiny model."""

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

require("verifiers", "the verifiers adapter")

ENVS = Path(__file__).resolve().parents[1] / "verifiers_envs"
if str(ENVS) not in sys.path:
    sys.path.insert(0, str(ENVS))  # verifiers loads a taskset id as a top-level module


def play(tokenizer, spec, reply, seeds=range(3), **env_kwargs):
    """Episodes of ``verifiers:<spec>`` played by a teacher ``reply(messages)`` through train env's protocols."""
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.recipes.env_setup import EnvConfig, probe_env, protocols
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import EnvSpec, RolloutRequest

    opts = EnvConfig(env=f"verifiers:{spec}", env_kwargs=json.dumps(env_kwargs))
    env = probe_env(opts)
    protos = protocols(FunctionClient(tokenizer, reply), opts, env, SamplingParams(max_tokens=48))
    reqs = [RolloutRequest(EnvSpec(opts.env, env_kwargs), protocol="single_agent", env_seed=s) for s in seeds]
    rollouts = asyncio.run(RolloutEngine(protos).generate_rollouts(reqs))
    assert not any(r.meta.get("failed") for r in rollouts), [r.meta.get("error") for r in rollouts]
    return rollouts


def assert_token_exact(tokenizer, rollout):
    """Each step's completion ids decode to its reply, and each prompt extends the previous prompt and completion."""
    prev = None
    for step in rollout.steps:
        assert tokenizer.decode(step.trace.completion_ids, skip_special_tokens=True).strip() == step.action.strip()
        if prev is not None:
            assert step.trace.prompt_ids[:len(prev)] == prev
        prev = step.trace.prompt_ids + step.trace.completion_ids


def sums(messages):
    """Right for even first terms, a long wrong answer otherwise."""
    a, b = messages[-1]["content"].removeprefix("What is ").removesuffix("?").split(" + ")
    return str(int(a) + int(b)) if int(a) % 2 == 0 else "I do not know the answer"


def test_a_single_turn_env_is_scored_by_its_rubric_every_function_and_weight(tokenizer):
    from ludic.recipes.env_setup import env_metrics

    rollouts = play(tokenizer, "vf_qa", sums, seeds=range(8))
    for r in rollouts:
        (step,) = r.steps
        info = step.info
        assert info["reward_weights"] == {"correct": 1.0, "short": 0.5}
        assert step.reward == pytest.approx(info["correct"] * 1.0 + info["short"] * 0.5)
        assert info["reply_chars"] == len(step.action)
        assert info["correct"] == (step.action != "I do not know the answer")
        assert r.meta["reset_info"]["instance"] == r.steps[0].prev_obs and r.meta["reset_info"]["split"] == "train"
        prompt = tokenizer.decode(step.trace.prompt_ids)
        assert "Answer with the number only." in prompt and step.prev_obs in prompt  # the task's system prompt
        assert_token_exact(tokenizer, r)
    assert {0.0, 1.5} <= {r.total_reward for r in rollouts}
    metrics = env_metrics(rollouts)
    assert {"env/correct", "env/short", "env/reply_chars"} <= set(metrics)


def test_train_and_eval_rows_are_disjoint_and_an_env_s_own_split_can_be_named():
    from ludic.envs.verifiers_env import VerifiersEnv

    def questions(env, n=200):
        return {env.reset(seed)[env.agent_id][1]["instance"] for seed in range(n)}

    train, held = questions(VerifiersEnv("vf_qa")), questions(VerifiersEnv("vf_qa", split="eval"))
    assert len(held) == 4 and len(train) == 16 and not train & held  # a fixed random fifth held out
    assert len(questions(VerifiersEnv("vf_qa", split="eval", eval_size=6))) == 6
    own = VerifiersEnv("vf_qa", split="eval", env_args={"part": "train"}, eval_args={"part": "test"})
    assert questions(own) == {"What is 4 + 9?", "What is 7 + 7?", "What is 6 + 6?", "What is 3 + 8?"}
    assert len(questions(VerifiersEnv("vf_qa", env_args={"part": "train"}, eval_args={"part": "test"}))) == 16


def test_a_few_shot_prompt_opens_the_dialog_and_loaders_by_function_and_load_environment(tokenizer):
    (r,) = play(tokenizer, "vf_qa:few_shot", sums, seeds=[1])
    history = tokenizer.decode(r.steps[0].trace.prompt_ids)
    assert history.index("Answer with the number only.") < history.index("What is 1 + 1?") < history.index(
        "2<|im_end|>") < history.index(r.steps[0].prev_obs)  # system, the worked example, then the question
    assert "assistant\n2<|im_end|>" in history and r.steps[0].prev_obs.startswith("What is")
    (r,) = play(tokenizer, "vf_loader", sums, seeds=[2], env_args={"part": "test"})
    assert r.meta["reset_info"]["instance"] in {"What is 4 + 9?", "What is 7 + 7?", "What is 6 + 6?", "What is 3 + 8?"}


def test_a_multi_turn_env_answers_each_reply_with_feedback(tokenizer):
    def reply(messages):
        last = messages[-1]["content"]
        return last.split("'")[1] if last.startswith("Not yet") else "hmm"

    for r in play(tokenizer, "vf_feedback", reply):
        first, last = r.steps
        assert first.next_obs.startswith("Not yet: your reply must contain") and first.reward == 0.0
        assert last.terminated and last.info["mentioned"] == 0.5 and last.info["solved"] == 1.0
        assert last.reward == pytest.approx(0.5 * 1.0 + 1.0 * 0.5) and last.info["trace_info"] == {"turns": 2}
        assert_token_exact(tokenizer, r)

    (r,) = play(tokenizer, "vf_feedback", lambda messages: "I give up", seeds=[0])  # the task's @vf.stop
    (step,) = r.steps
    assert step.terminated and step.info["stop_condition"] == "gave_up" and step.info["mentioned"] == 0.0
    (r,) = play(tokenizer, "vf_feedback", lambda messages: "hmm", seeds=[0], max_turns=2)  # the seat's limit
    assert len(r.steps) == 2 and r.steps[-1].truncated and r.steps[-1].info["stop_condition"] == "max_turns"
    assert "mentioned" in r.steps[-1].info  # a stopped exchange is scored, as in verifiers


def lookup_teacher(messages):
    last = messages[-1]
    if last["role"] == "tool":
        return f"The value is {last['content']}."
    key = last["content"].split("'")[1]
    return '<tool_call>{"name": "table_lookup", "arguments": {"key": "%s"}}</tool_call>' % key


def test_a_tool_env_s_toolset_runs_through_the_tool_agent_and_the_rubric_sees_the_calls(tokenizer):
    import vf_lookup

    for r in play(tokenizer, "vf_lookup", lookup_teacher):
        call, answer = r.steps
        key = r.meta["reset_info"]["instance"].split("'")[1]
        assert call.info["tool_step"] and call.info["tool_results"] == [vf_lookup.TABLE[key]]
        assert "table_lookup" in tokenizer.decode(call.trace.prompt_ids)  # the schema, in the system prompt
        assert answer.info["looked_up"] == 1.0 and answer.info["correct"] == 1.0 and answer.reward == pytest.approx(1.2)
        assert_token_exact(tokenizer, r)

    def no_tool(messages):
        return "I would guess 7."

    (r,) = play(tokenizer, "vf_lookup", no_tool, seeds=[0])
    assert r.steps[-1].info["looked_up"] == 0.0  # the rubric reads the trace's tool messages


TINY = ("--train-steps", "1", "--group-size", "2", "--prompts-per-step", "2", "--eval-episodes", "4",
        "--max-completion-tokens", "8", "--max-no-signal-steps", "0", "--logger", "none", "--dtype", "float32",
        "--val-episodes", "2")


def ludic(*args):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ENVS), os.environ.get("PYTHONPATH", "")])}
    return subprocess.run([sys.executable, "-m", "ludic", *args], capture_output=True, text=True, timeout=1200, env=env)


def lines(path):
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


@pytest.mark.slow
def test_train_env_and_eval_env_on_a_verifiers_env_from_the_command_line(tiny_model_dir, tokenizer, tmp_path):
    run, kw = tmp_path / "run", '{"eval_size": 6}'
    proc = ludic("train", "env", "--env", "verifiers:vf_qa", "--env-kwargs", kw, "--model", str(tiny_model_dir),
                 "--run-dir", str(run), *TINY)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["base"]["episodes"] == summary["trained"]["episodes"] == 4
    trained = lines(run / "rollouts.jsonl")
    assert len(trained) == 4 and all(r["meta"]["reset_info"]["split"] == "train" for r in trained)
    for r in trained:
        (step,) = r["steps"]
        reply = tokenizer.decode(step["trace"]["completion_ids"], skip_special_tokens=True)
        assert reply.strip() == step["action"].strip()  # token-exact: the sampled ids are the reply
        info = step["info"]
        assert step["reward"] == pytest.approx(info["correct"] + 0.5 * info["short"]) and "reply_chars" in info
    logged = lines(run / "metrics.jsonl")
    assert any({"env/correct", "env/short", "env/reply_chars"} <= set(row) for row in logged)
    held = lines(run / "eval_base.jsonl")
    assert all(r["meta"]["reset_info"]["split"] == "eval" for r in held)
    instances = [{r["meta"]["reset_info"]["instance"] for r in rows} for rows in (held, trained)]
    assert not instances[0] & instances[1]

    out = tmp_path / "eval.jsonl"
    proc = ludic("eval", "env", "--env", "verifiers:vf_qa", "--env-kwargs", kw, "--model", str(tiny_model_dir),
                 "--adapter", str(run / "final"), "--episodes", "4", "--max-completion-tokens", "8", "--dtype",
                 "float32", "--out", str(out))
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "success" in proc.stdout and len(lines(out)) == 4
    assert all("correct" in r["steps"][-1]["info"] for r in lines(out))


@pytest.mark.slow
def test_ludic_train_on_a_multi_turn_verifiers_env_and_on_a_tool_env_with_a_tool_calling_cold_start(
        tiny_model_dir, tokenizer, tmp_path):
    import ludic as lib

    common = dict(model=str(tiny_model_dir), train_steps=1, group_size=2, prompts_per_step=2, eval_episodes=2,
                  eval_every=0, max_completion_tokens=8, logger="none", dtype="float32", max_no_signal_steps=0)
    out = lib.train("verifiers:vf_feedback", run_dir=str(tmp_path / "feedback"), **common)
    assert out.results["trained"]["episodes"] == 2
    for r in lines(out.run_dir / "rollouts.jsonl"):
        steps = r["steps"]
        assert steps[-1]["terminated"] or steps[-1]["truncated"]
        assert all(s["next_obs"].startswith("Not yet") for s in steps[:-1]) and "mentioned" in steps[-1]["info"]
        for a, b in zip(steps, steps[1:]):  # token-in: each prompt extends the last prompt and completion
            prefix = a["trace"]["prompt_ids"] + a["trace"]["completion_ids"]
            assert b["trace"]["prompt_ids"][:len(prefix)] == prefix

    def teacher(observation):
        if observation.startswith("What is the value"):
            key = observation.split("'")[1]
            return '<tool_call>{"name": "table_lookup", "arguments": {"key": "%s"}}</tool_call>' % key
        return f"It is {observation}."

    out = lib.train("verifiers:vf_lookup", run_dir=str(tmp_path / "lookup"), format_demos=teacher,
                    format_demo_steps=1, **{**common, "max_completion_tokens": 24})
    demos = lines(out.run_dir / "format_demos.jsonl")
    assert demos and all(r["steps"][0]["info"]["tool_step"] and r["steps"][-1]["info"]["looked_up"] == 1.0
                         and r["steps"][-1]["info"]["correct"] == 1.0 for r in demos)
    prompt = tokenizer.decode(lines(out.run_dir / "rollouts.jsonl")[0]["steps"][0]["trace"]["prompt_ids"])
    assert "table_lookup" in prompt and "<tool_call>" in prompt  # the policy is told the env's tools
