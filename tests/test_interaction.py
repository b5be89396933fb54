"""Agent + protocols against the real TicTacToe env, with a scripted client (contract tests)."""

import pytest

from ludic.agents.agent import Agent
from ludic.context import FullDialog, TruncatedThinkingContext
from ludic.tictactoe.env import TicTacToeEnv, TicTacToeGame
from ludic.tokenization import render_ids
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import think_move_parser
from ludic.types import FinishReason


def _agent(client, ctx=None):
    return Agent(client, ctx or FullDialog("Play well."), think_move_parser())


async def test_single_agent_episode_records_steps_and_tokens(scripted, tokenizer):
    # agent moves first; the opponent picks the lowest free cell (deterministic)
    env = TicTacToeEnv(agent_starts=True, opponent=lambda board, rng: min(i for i, c in enumerate(board) if c == " "))
    replies = [f"<think>t{i}</think><move>{m}</move>" for i, m in enumerate(["B2", "C1", "C3", "B3"])]
    client = scripted(replies, tokenizer)
    [r] = await SingleAgentProtocol(_agent(client)).run(env, max_steps=5, env_seed=1, sampling_seed=7)
    # X: B2, O: A1, X: C1, O: A2, X: C3, O: A3 wins the top row -> a loss after three agent moves
    assert [s.parsed_action for s in r.steps] == ["B2", "C1", "C3"] and r.steps[-1].info["result"] == "loss"
    assert r.steps[-1].terminated and "result" in r.steps[-1].info
    assert all(s.trace is not None and s.trace.finish_reason == FinishReason.STOP for s in r.steps)
    # token-in: every prompt extends the previous prompt + completion exactly
    for a, b in zip(r.steps, r.steps[1:]):
        prefix = a.trace.prompt_ids + a.trace.completion_ids
        assert b.trace.prompt_ids[: len(prefix)] == prefix
    # and decodes to the same text as re-rendering the conversation
    last_req = client.requests[len(r.steps) - 1]
    assert tokenizer.decode(last_req.prompt_ids) == tokenizer.decode(render_ids(tokenizer, last_req.messages))
    assert r.total_reward == sum(s.reward for s in r.steps)
    assert [s.index for s in r.steps] == list(range(len(r.steps)))


async def test_parse_failure_is_a_recorded_step_and_env_not_stepped(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True, opponent="random")
    client = scripted(["I will play B2", "<think>ok</think><move>B2</move>"], tokenizer)
    [r] = await SingleAgentProtocol(_agent(client)).run(env, max_steps=2, env_seed=3, sampling_seed=0)
    bad, good = r.steps
    assert bad.parse_error and bad.reward == -1.0 and bad.parsed_action is None
    assert "Invalid" in bad.next_obs and not bad.terminated
    assert good.parsed_action == "B2" and good.info["agent_move"] == "B2"  # the env saw only the good move
    assert client.requests[1].messages[-1]["content"] == bad.next_obs  # feedback went to the agent


async def test_stop_on_parse_error_ends_episode(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True)
    client = scripted(["no tags at all"], tokenizer)
    [r] = await SingleAgentProtocol(_agent(client), stop_on_parse_error=True).run(env, max_steps=5, env_seed=0)
    assert len(r.steps) == 1 and r.steps[0].terminated and r.meta["truncation_reason"] is None


async def test_length_cut_is_a_format_failure(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True)
    client = scripted(["<think>very long"], tokenizer, finish=FinishReason.LENGTH)
    [r] = await SingleAgentProtocol(_agent(client), stop_on_parse_error=True).run(env, max_steps=5, env_seed=0)
    assert r.steps[0].info["incomplete_completion"] and r.steps[0].parse_error


async def test_max_steps_truncates(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True)
    client = scripted(["garbage"], tokenizer)
    [r] = await SingleAgentProtocol(_agent(client)).run(env, max_steps=3, env_seed=0)
    assert len(r.steps) == 3 and r.steps[-1].truncated and r.meta["truncation_reason"] == "max_steps"
    assert r.steps[-1].info["truncation_reason"] == "max_steps"


async def test_failed_request_becomes_failed_rollout(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True)
    client = scripted(["<think>a</think><move>B2</move>"], tokenizer, fail_at={1})
    [r] = await SingleAgentProtocol(_agent(client)).run(env, max_steps=5, env_seed=0)
    assert r.meta["failed"] and r.meta["truncation_reason"] == "inference_error"
    assert r.steps[-1].info["inference_error"] and r.steps[-1].truncated


async def test_truncated_context_rerenders_prompt(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True, opponent="random")
    client = scripted(["<think>long thoughts here</think><move>B2</move>", "<think>x</think><move>A1</move>"], tokenizer)
    agent = _agent(client, TruncatedThinkingContext("Play well."))
    await SingleAgentProtocol(agent).run(env, max_steps=2, env_seed=5)
    text = tokenizer.decode(client.requests[1].prompt_ids)
    assert "[TRUNCATED]" in text and "long thoughts here" not in text


async def test_self_play_gives_both_seats_the_outcome(scripted, tokenizer):
    # X plays A1, A2, A3 (wins on its third move); O plays B1, B2
    x = _agent(scripted([f"<think>x</think><move>{m}</move>" for m in ["A1", "A2", "A3"]], tokenizer))
    o = _agent(scripted([f"<think>o</think><move>{m}</move>" for m in ["B1", "B2"]], tokenizer))
    rx, ro = await MultiAgentProtocol({"X": x, "O": o}).run(TicTacToeGame(), max_steps=5, env_seed=0)
    assert len(rx.steps) == 3 and len(ro.steps) == 2
    assert rx.steps[-1].terminated and rx.steps[-1].info["result"] == "win" and rx.total_reward == 1.0
    assert ro.steps[-1].terminated and ro.steps[-1].info["result"] == "loss" and ro.total_reward == 0.0
    assert rx.meta["agent_id"] == "X" and ro.meta["agent_id"] == "O"


async def test_self_play_illegal_move_gives_the_other_seat_the_win(scripted, tokenizer):
    # X plays B2, O answers B2 (taken): O is penalised, X wins by forfeit on its last step
    x = _agent(scripted(["<think>x</think><move>B2</move>"], tokenizer))
    o = _agent(scripted(["<think>o</think><move>B2</move>"], tokenizer))
    rx, ro = await MultiAgentProtocol({"X": x, "O": o}).run(TicTacToeGame(), max_steps=5, env_seed=0)
    assert ro.total_reward == -1.0 and ro.steps[-1].info["result"] == "illegal"
    assert len(rx.steps) == 1 and rx.steps[-1].terminated and rx.total_reward == 1.0
    assert rx.steps[-1].info["result"] == "win" and rx.steps[-1].info["opponent_illegal"] is True


async def test_frozen_seat_rollout_is_marked_untrainable(scripted, tokenizer):
    x = _agent(scripted([f"<think>x</think><move>{m}</move>" for m in ["A1", "A2", "A3"]], tokenizer))
    o = _agent(scripted([f"<think>o</think><move>{m}</move>" for m in ["B1", "B2"]], tokenizer))
    rx, ro = await MultiAgentProtocol({"X": x, "O": o}, frozen=("O",)).run(TicTacToeGame(), max_steps=5)
    assert ro.meta["trainable"] is False and "trainable" not in rx.meta
    assert ro.total_reward == 0.0 and len(ro.steps) == 2  # recorded like any other rollout
    with pytest.raises(ValueError, match="frozen roles"):
        MultiAgentProtocol({"X": x}, frozen=("O",))
