"""A bad rollout is data: an exception in one episode ends that episode as a failed rollout.

Each test raises from one place (env reset / step, reward function, chat
template, context strategy, parser, env construction, protocol factory) and
checks that the episode comes back failed with the error and its stage in
``meta``, with the steps recorded before the error, while the other episodes
of the batch finish normally.
"""

from __future__ import annotations

import asyncio

import pytest

from ludic.agents.agent import Agent
from ludic.context import FullDialog
from ludic.envs.prompt_env import PromptEnv, register_reward
from ludic.envs.registry import register_env
from ludic.tictactoe.board import legal_moves
from ludic.tictactoe.env import TicTacToeEnv, TicTacToeGame
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import think_move_parser, xml_tag_parser
from ludic.rollouts.batch import build_saw_items
from ludic.rollouts.credit import MonteCarloReturn
from ludic.rollouts.engine import RolloutEngine, outcome_counts
from ludic.types import EnvSpec, RolloutRequest

MOVES = [f"<think>t</think><move>{m}</move>" for m in ("B2", "C3", "A3", "C1", "A2")]


def crashing_bot(after: int):
    """An opponent that plays the lowest free cell, and raises on its call number ``after``."""
    calls = []

    def bot(board, rng):
        calls.append(board)
        if len(calls) == after:
            raise RuntimeError("opponent crashed")
        return legal_moves(board)[0]

    return bot


def _agent(client, ctx=None, parser=None):
    return Agent(client, ctx or FullDialog("Play well."), parser or think_move_parser())


def _assert_failed(r, error: str, stage: str):
    assert r.meta["failed"] is True
    assert r.meta["error"] == error and r.meta["error_stage"] == stage
    assert build_saw_items([r], MonteCarloReturn()) == []  # never trained on


async def test_env_step_error_fails_the_episode_and_keeps_earlier_steps(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True, opponent=crashing_bot(after=2))
    [r] = await SingleAgentProtocol(_agent(scripted(MOVES, tokenizer))).run(env, max_steps=5, env_seed=0)
    _assert_failed(r, "RuntimeError: opponent crashed", "env.step")
    first, crashed = r.steps
    assert first.parsed_action == "B2" and not first.info.get("error")
    # the action that crashed the env stays in the log, with its tokens
    assert crashed.parsed_action == "C3" and crashed.trace is not None and crashed.truncated
    assert crashed.info["error"] == "RuntimeError: opponent crashed" and crashed.reward == 0.0


async def test_env_reset_error_fails_the_episode(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=False, opponent=crashing_bot(after=1))
    client = scripted(MOVES, tokenizer)
    [r] = await SingleAgentProtocol(_agent(client)).run(env, max_steps=5, env_seed=0)
    _assert_failed(r, "RuntimeError: opponent crashed", "env.reset")
    assert r.steps == [] and client.requests == []


async def test_reward_function_error_fails_the_episode(scripted, tokenizer):
    def reward(prompt, completion):
        return {"B2": 1.0}[completion]

    register_reward("test_robustness_lookup", reward)
    env = PromptEnv("Name a cell.", "test_robustness_lookup")
    agent = _agent(scripted(["<move>A1</move>"], tokenizer), parser=xml_tag_parser("move"))
    [r] = await SingleAgentProtocol(agent).run(env, max_steps=1)
    _assert_failed(r, "KeyError: 'A1'", "reward")


async def test_chat_template_error_fails_the_episode(scripted, packaged_dir):
    # Some templates (Gemma's, for one) raise on a system message.
    from ludic.inference.models import load_tokenizer

    strict = load_tokenizer(str(packaged_dir))
    strict.chat_template = (
        "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
        + strict.chat_template
    )
    env = TicTacToeEnv(agent_starts=True, opponent="random")
    client = scripted(MOVES, strict)
    [r] = await SingleAgentProtocol(_agent(client)).run(env, max_steps=5, env_seed=0)
    _assert_failed(r, "TemplateError: System role not supported", "chat_template")
    assert r.steps == [] and client.requests == []


async def test_context_strategy_error_fails_the_episode(scripted, tokenizer):
    class ForgetsOpponent(FullDialog):
        def add_observation(self, obs):
            if "Opponent" in obs:
                raise KeyError("opponent")
            super().add_observation(obs)

    env = TicTacToeEnv(agent_starts=True, opponent="random")
    [r] = await SingleAgentProtocol(_agent(scripted(MOVES, tokenizer), ForgetsOpponent("Play."))).run(
        env, max_steps=5, env_seed=0
    )
    _assert_failed(r, "KeyError: 'opponent'", "context")
    assert [s.parsed_action for s in r.steps] == ["B2"]  # the step before the error stays


async def test_parser_error_fails_the_episode(scripted, tokenizer):
    def parser(raw):
        raise ValueError("parser bug")

    env = TicTacToeEnv(agent_starts=True)
    [r] = await SingleAgentProtocol(_agent(scripted(MOVES, tokenizer), parser=parser)).run(env, max_steps=5)
    _assert_failed(r, "ValueError: parser bug", "parser")


async def test_multi_agent_error_fails_every_managed_agent(scripted, tokenizer):
    class CrashesOnThirdMove(TicTacToeGame):
        def step(self, actions):
            if self.board.count(" ") == 7:
                raise RuntimeError("engine crashed")
            return super().step(actions)

    x = _agent(scripted(["<think>x</think><move>A1</move>", "<think>x</think><move>A2</move>"], tokenizer))
    o = _agent(scripted(["<think>o</think><move>B1</move>"], tokenizer))
    rx, ro = await MultiAgentProtocol({"X": x, "O": o}).run(CrashesOnThirdMove(), max_steps=5, env_seed=0)
    for r in (rx, ro):
        _assert_failed(r, "RuntimeError: engine crashed", "env.step")
    assert [s.parsed_action for s in rx.steps] == ["A1", "A2"] and rx.steps[-1].info["error"]
    assert [s.parsed_action for s in ro.steps] == ["B1"]
    assert rx.meta["agent_id"] == "X" and ro.meta["agent_id"] == "O"


async def test_multi_agent_agent_error_fails_every_managed_agent(scripted, tokenizer):
    def parser(raw):
        raise ValueError("parser bug")

    x = _agent(scripted(["<think>x</think><move>A1</move>"], tokenizer))
    o = _agent(scripted(["<think>o</think><move>B1</move>"], tokenizer), parser=parser)
    rx, ro = await MultiAgentProtocol({"X": x, "O": o}).run(TicTacToeGame(), max_steps=5, env_seed=0)
    for r in (rx, ro):
        _assert_failed(r, "ValueError: parser bug", "parser")
    assert [s.parsed_action for s in rx.steps] == ["A1"] and ro.steps == []


def _explode(**kwargs):
    raise ValueError("no such board size")


async def test_engine_keeps_the_batch_when_episodes_fail(scripted, tokenizer):
    register_env("test_robustness_explodes", _explode)

    def protocol():
        return SingleAgentProtocol(_agent(scripted(MOVES, tokenizer)))

    def broken_factory():
        raise RuntimeError("factory bug")

    engine = RolloutEngine({"ok": protocol, "broken": broken_factory, "selfplay": protocol})
    ttt = EnvSpec("tictactoe", {"agent_starts": True})
    requests = [
        RolloutRequest(ttt, "ok", env_seed=1, group_id="g"),
        RolloutRequest(EnvSpec("test_robustness_explodes", {"size": 4}), "ok", group_id="g"),
        RolloutRequest(ttt, "broken", group_id="g"),
        RolloutRequest(ttt, "missing", group_id="g"),
        RolloutRequest(EnvSpec("tictactoe_selfplay"), "selfplay", group_id="g"),  # wrong protocol for the env
        RolloutRequest(EnvSpec("no_such_env"), "ok", group_id="g"),
        RolloutRequest(ttt, "ok", env_seed=2, group_id="g"),
    ]
    rollouts = await engine.generate_rollouts(requests)
    assert len(rollouts) == len(requests)
    ok, env_err, factory_err, missing, wrong, unknown, ok2 = rollouts
    assert not ok.meta["failed"] and not ok2.meta["failed"] and ok.steps and ok2.steps
    _assert_failed(env_err, "ValueError: no such board size", "env.make")
    _assert_failed(factory_err, "RuntimeError: factory bug", "protocol.make")
    assert missing.meta["error_stage"] == "protocol.make" and "unknown protocol 'missing'" in missing.meta["error"]
    assert wrong.meta["error_stage"] == "protocol" and "single-agent env" in wrong.meta["error"]
    assert unknown.meta["error_stage"] == "env.make" and "no_such_env" in unknown.meta["error"]
    for i, r in enumerate(rollouts):  # every rollout carries its request
        assert r.meta["episode_idx"] == i and r.meta["group_id"] == "g" and r.meta["env_kind"] == requests[i].env.kind
    counts = outcome_counts(rollouts)
    assert counts["failed_rate"] == pytest.approx(5 / 7)
    assert counts["error_count"] == 5 and counts["error_rate"] == pytest.approx(5 / 7)


def test_outcome_counts_tell_errors_from_failed_requests():
    from ludic.types import Rollout

    rollouts = [
        Rollout(meta={"failed": True, "error": "ValueError: x", "error_stage": "env.step"}),
        Rollout(meta={"failed": True, "truncation_reason": "inference_error"}),
        Rollout(meta={"failed": False}),
        Rollout(meta={}),
    ]
    counts = outcome_counts(rollouts)
    assert counts["failed_rate"] == 0.5 and counts["error_count"] == 1 and counts["error_rate"] == 0.25


async def test_cancellation_and_keyboard_interrupt_are_not_swallowed(scripted, tokenizer):
    class Interrupted(TicTacToeEnv):
        def env_step(self, action):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        await SingleAgentProtocol(_agent(scripted(MOVES, tokenizer))).run(Interrupted(agent_starts=True), max_steps=3)

    class Cancelled:
        async def run(self, env, **kwargs):
            raise asyncio.CancelledError

    engine = RolloutEngine({"c": Cancelled})
    with pytest.raises(asyncio.CancelledError):
        await engine.generate_rollouts([RolloutRequest(EnvSpec("tictactoe"), "c")])


def test_a_missing_model_folder_is_named_not_taken_for_a_hub_id(tmp_path):
    """``--model /path/typo`` used to surface as huggingface_hub's "Repo id must be in the form
    'repo_name' or 'namespace/repo_name'"."""
    from ludic.inference.models import load_model, load_tokenizer

    missing = str(tmp_path / "no-such-model")
    for load in (load_model, load_tokenizer):
        with pytest.raises(FileNotFoundError, match="no-such-model.*no such folder"):
            load(missing)
