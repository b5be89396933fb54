"""Parser feedback after a malformed reply: every context still shows the latest env observation."""

from ludic.agents.agent import Agent
from ludic.context import FullDialog, LastObservationContext, RawPromptContext, TruncatedThinkingContext
from ludic.tictactoe.env import TicTacToeEnv, TicTacToeGame
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.parsers import think_move_parser

BAD, GOOD = "I play B2", "<think>centre</think><move>B2</move>"


async def _retry(scripted, tokenizer, ctx):
    """One malformed reply, then a valid one; returns (rollout, messages of the retry request, client)."""
    env = TicTacToeEnv(agent_starts=True, opponent="random")
    client = scripted([BAD, GOOD], tokenizer)
    [r] = await SingleAgentProtocol(Agent(client, ctx, think_move_parser())).run(env, max_steps=2, env_seed=3)
    return r, client.requests[1].messages, client


async def test_last_observation_context_keeps_the_board_after_a_parse_error(scripted, tokenizer):
    r, msgs, _ = await _retry(scripted, tokenizer, LastObservationContext("Play well."))
    board, feedback = r.steps[0].prev_obs, r.steps[0].next_obs
    assert "Board:" in board and feedback.startswith("Invalid")
    assert [m["role"] for m in msgs] == ["system", "user"]  # one user turn: templates need alternation
    assert board in msgs[1]["content"] and feedback in msgs[1]["content"]
    assert msgs[1]["content"].index(board) < msgs[1]["content"].index(feedback)


async def test_last_observation_context_after_a_good_move_shows_only_the_new_board(scripted, tokenizer):
    env = TicTacToeEnv(agent_starts=True, opponent="random")
    client = scripted([BAD, GOOD, "<think>t</think><move>A1</move>"], tokenizer)
    agent = Agent(client, LastObservationContext("Play well."), think_move_parser())
    [r] = await SingleAgentProtocol(agent).run(env, max_steps=3, env_seed=3)
    msgs = client.requests[2].messages
    assert [m["content"] for m in msgs] == ["Play well.", r.steps[1].next_obs]  # the old feedback is gone


async def test_full_dialog_shows_feedback_as_a_turn_and_stays_token_in(scripted, tokenizer):
    r, msgs, client = await _retry(scripted, tokenizer, FullDialog("Play well."))
    board, feedback = r.steps[0].prev_obs, r.steps[0].next_obs
    assert [m["content"] for m in msgs] == ["Play well.", board, BAD, feedback]
    first, second = client.requests[0].prompt_ids, client.requests[1].prompt_ids
    trace = r.steps[0].trace
    assert second[: len(first) + len(trace.completion_ids)] == first + trace.completion_ids


async def test_truncated_thinking_context_shows_feedback_as_a_turn(scripted, tokenizer):
    r, msgs, _ = await _retry(scripted, tokenizer, TruncatedThinkingContext("Play well."))
    assert [m["content"] for m in msgs] == ["Play well.", r.steps[0].prev_obs, BAD, r.steps[0].next_obs]


async def test_raw_prompt_context_retries_on_the_latest_observation(scripted, tokenizer):
    r, msgs, client = await _retry(scripted, tokenizer, RawPromptContext())
    board = r.steps[0].prev_obs
    assert msgs == [{"role": "user", "content": board}]  # a raw prompt has no place for feedback
    assert client.requests[1].prompt_ids == client.requests[0].prompt_ids


async def test_self_play_last_observation_context_keeps_the_board_after_a_parse_error(scripted, tokenizer):
    x = Agent(scripted([BAD, "<think>x</think><move>A1</move>"], tokenizer), LastObservationContext("P"),
              think_move_parser())
    o = Agent(scripted(["<think>o</think><move>B1</move>"], tokenizer), LastObservationContext("P"),
              think_move_parser())
    rx, _ = await MultiAgentProtocol({"X": x, "O": o}).run(TicTacToeGame(), max_steps=2, env_seed=0)
    board, feedback = rx.steps[0].prev_obs, rx.steps[0].next_obs
    retry = x.client.requests[1].messages
    assert [m["role"] for m in retry] == ["system", "user"]
    assert board in retry[1]["content"] and feedback in retry[1]["content"]
    assert rx.steps[1].parsed_action == "A1"


def test_rejection_sampled_records_show_the_retry_prompt_as_the_agent_saw_it():
    from ludic.tictactoe.synth import rollouts_to_records
    from ludic.types import Rollout, Step

    steps = [
        Step(0, "board 0", "bad", None, "feedback", -1.0, info={"parse_error": True}),
        Step(1, "feedback", "good", "B2", "board 1", 0.0),
        Step(2, "board 1", "good again", "A1", None, 1.0, terminated=True, info={"result": "win"}),
    ]
    rollout = Rollout(steps=steps)
    last = rollouts_to_records([rollout], "SYS", ctx="last")
    assert [m["role"] for m in last[1]["messages"]] == ["system", "user"]
    assert "board 0" in last[1]["messages"][1]["content"] and "feedback" in last[1]["messages"][1]["content"]
    assert [m["content"] for m in last[2]["messages"]] == ["SYS", "board 1"]
    full = rollouts_to_records([rollout], "SYS", transform=False)
    assert [m["content"] for m in full[2]["messages"]] == ["SYS", "board 0", "bad", "feedback", "good", "board 1"]
