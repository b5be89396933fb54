"""Exact evaluation: scripted agents with hand-known results, through the real Agent, context and parser."""

from __future__ import annotations

import asyncio
import zlib
from fractions import Fraction

import pytest

from ludic.agents.agent import Agent
from ludic.context import make_context

from ludic.tictactoe.board import CORNERS, EMPTY, EMPTY_BOARD, best_moves, coord, legal_moves, optimal_moves, parse_board
from ludic.tictactoe.env import TicTacToeEnv
from ludic.tictactoe.exact import OUTCOMES, ExactResult, exact_eval, format_table
from ludic.inference.client import ChatRequest, ChatResponse, SamplingParams
from ludic.parsers import ParseResult
from ludic.types import FinishReason, TokenTrace

EDGES = (1, 3, 5, 7)


class BoardPolicyClient:
    """A ChatClient that plays ``policy(board)`` on the board of the latest user message.

    The policy returns a cell index (answered as ``<think>..</think><move>B2</move>``)
    or a raw reply. With a tokenizer, the reply is tokenised for real (the agent then
    sends prompt ids); ``calls`` counts the requests that reached the client.
    """

    def __init__(self, policy, tokenizer=None):
        self.policy = policy
        self._tokenizer = tokenizer
        self.calls = 0

    @property
    def tokenizer(self):
        return self._tokenizer

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self.calls += 1
        board = parse_board(request.messages[-1]["content"])
        assert board is not None, request.messages[-1]["content"]
        answer = self.policy(board)
        text = answer if isinstance(answer, str) else f"<think>I play {coord(answer)}.</think><move>{coord(answer)}</move>"
        if self._tokenizer is not None:
            ids = tuple(self._tokenizer(text, add_special_tokens=False)["input_ids"]) + (self._tokenizer.eos_token_id,)
            prompt = request.prompt_ids or ()
        else:
            ids, prompt = (1, 2), ()
        trace = TokenTrace(tuple(prompt), ids, (0.0,) * len(ids), (0,) * len(ids), FinishReason.STOP)
        return ChatResponse(text, trace)


def solver(board):
    """Perfect play: the lowest of the solver's best moves."""
    return best_moves(board)[0]


def solver_with_edge_blunder(board):
    """The solver, except that it answers a corner opening with the lowest free edge."""
    if board.count("X") == 1 and board.count("O") == 0 and board.index("X") in CORNERS:
        return min(e for e in EDGES if board[e] == EMPTY)
    return solver(board)


def lowest_free(board):
    return legal_moves(board)[0]


def assert_sums_to_one(result: ExactResult):
    for seat in [*result.seats.values(), result.both]:
        assert sum(getattr(seat, k) for k in OUTCOMES) == 1


@pytest.mark.parametrize("opponent", ["minimax", "random"])
async def test_the_solver_never_loses_in_either_seat(opponent, tokenizer):
    client = BoardPolicyClient(solver, tokenizer)
    r = await exact_eval(client, ctx="last", opponent=opponent)
    assert_sums_to_one(r)
    for seat in ("X", "O"):
        assert r.seats[seat].non_loss == 1 and r.seats[seat].loss == 0
        assert r.seats[seat].illegal == r.seats[seat].parse_error == r.seats[seat].failed == 0
        assert r.positions[seat].optimal == r.positions[seat].value_preserving == r.positions[seat].legal == 1.0
    assert r.both.non_loss == 1 and not r.all_positions
    assert client.calls == r.decisions == r.both.decisions < r.both.nodes  # branches shared prompts
    if opponent == "minimax":  # perfect against perfect: every branch is a draw
        assert r.both.draw == 1
    else:
        assert r.seats["X"].win > r.seats["O"].win > 0


async def test_an_edge_reply_to_a_corner_opening_loses_against_minimax(tokenizer):
    r = await exact_eval(BoardPolicyClient(solver_with_edge_blunder, tokenizer), opponent="minimax", seats=("O",))
    o = r.seats["O"]
    assert o.non_loss == Fraction(5, 9) and o.draw == Fraction(5, 9) and o.loss == Fraction(4, 9)
    assert r.both == o and set(r.seats) == {"O"}
    assert_sums_to_one(r)


async def test_reach_is_the_share_of_a_seats_games_through_each_decision(tokenizer):
    """ExactResult.reach: how likely the seat's games reach each position decided on. The edge reply to a corner
    opening is reached by the 4 corner openings, 1/9 each, and loses exactly their 4/9; as X the first decision is
    every game's; the decisions at one depth of a seat share its games' mass (1, less the games already over)."""
    r = await exact_eval(BoardPolicyClient(solver_with_edge_blunder, tokenizer), opponent="minimax", seats=("O",))
    corner_openings = [b for b in r.reach if b.count("X") == 1 and b.index("X") in CORNERS]
    assert len(corner_openings) == 4 and all(r.reach[b] == Fraction(1, 9) for b in corner_openings)
    assert sum(r.reach[b] for b in corner_openings) == r.seats["O"].loss
    assert sum(p for b, p in r.reach.items() if b.count("X") == 1) == 1  # O's first decision: every game
    assert set(r.reach) == {d.board for d in r.records}
    x = await exact_eval(BoardPolicyClient(lowest_free, tokenizer), opponent="random", seats=("X",))
    assert x.reach[EMPTY_BOARD] == 1
    for depth in range(1, 5):  # X's decisions with `depth` X marks on the board: at most the whole seat
        assert 0 < sum(p for b, p in x.reach.items() if b.count("X") == depth) <= 1


async def test_lowest_free_cell_as_x_against_random(tokenizer):
    r = await exact_eval(BoardPolicyClient(lowest_free, tokenizer), opponent="random", seats=("X",))
    x = r.seats["X"]
    assert (x.win, x.draw, x.loss) == (Fraction(25, 32), Fraction(1, 24), Fraction(17, 96))
    assert x.illegal == x.parse_error == 0
    assert set(r.positions) == {"X", "all"}  # only X's tree was played
    m = r.as_metrics()
    assert m["x/win_rate"] == m["win_rate"] == 25 / 32 and m["x/non_loss_rate"] == pytest.approx(79 / 96)


def forfeits(board):
    """X: A1; then a garbled reply if O took the centre, A1 again (illegal) if O took A2,
    else the centre, then the lowest free cell."""
    if board.count("X") == 0:
        return 0
    if board.count("X") == 1 and board[4] == "O":
        return "<move>B2</move>"  # no <think> block: a parse error
    if board.count("X") == 1 and board[1] == "O":
        return 0
    return 4 if board[4] == EMPTY else lowest_free(board)


async def test_illegal_moves_and_parse_errors_are_forfeits_counted_apart():
    r = await exact_eval(BoardPolicyClient(forfeits), opponent="random", seats=("X",))
    x = r.seats["X"]
    assert x.parse_error == Fraction(1, 8) and x.illegal == Fraction(1, 8)
    assert x.win + x.draw + x.loss == Fraction(3, 4) and x.failed == 0
    assert r.positions["X"].legal < 1.0


async def test_a_history_dependent_context_gives_the_same_exact_results_with_fewer_shared_prompts(tokenizer):
    last = await exact_eval(BoardPolicyClient(lowest_free, tokenizer), ctx="last", opponent="random")
    full = await exact_eval(BoardPolicyClient(lowest_free, tokenizer), ctx="full", opponent="random",
                            all_positions=True)
    for seat in ("X", "O"):
        assert [getattr(full.seats[seat], k) for k in (*OUTCOMES, "nodes")] == \
            [getattr(last.seats[seat], k) for k in (*OUTCOMES, "nodes")]
    assert full.both.nodes == last.both.nodes and full.decisions > last.decisions
    assert not full.all_positions  # ctx full is history-dependent: positions met in the enumeration
    assert full.positions["X"].positions == last.positions["X"].positions


async def test_all_positions_sweep_covers_every_reachable_position_and_feeds_the_enumeration():
    client = BoardPolicyClient(solver)
    r = await exact_eval(client, opponent="minimax", all_positions=True)
    assert r.all_positions and r.sweep_seconds > 0
    assert (r.positions["X"].positions, r.positions["O"].positions, r.positions["all"].positions) == (2423, 2097, 4520)
    assert r.positions["all"].prompts == 13306  # one per opponent mark that can have been the last move
    assert client.calls == r.decisions == 13306  # the games met no prompt the sweep had not answered
    assert r.positions["all"].optimal == 1.0 and r.both.non_loss == 1

    r = await exact_eval(BoardPolicyClient(lambda b: min(optimal_moves(b))), opponent="random",
                         all_positions=True, show_opponent_move=False, compact=True, show_moves=False)
    assert r.positions["all"].prompts == r.decisions == 4520  # one prompt per board, games included
    assert not any("Available moves" in d.observation for d in r.records)
    assert r.positions["all"].value_preserving == 1.0 > r.positions["all"].optimal  # slow wins are not optimal
    assert r.both.non_loss == 1


async def test_mixed_opponent_is_the_mixture_of_the_two():
    mm = await exact_eval(BoardPolicyClient(lowest_free), opponent="minimax")
    rnd = await exact_eval(BoardPolicyClient(lowest_free), opponent="random")
    mixed = await exact_eval(BoardPolicyClient(lowest_free), opponent="mixed", epsilon=0.3)
    assert_sums_to_one(mixed)
    assert mm.both.loss > mixed.both.loss > rnd.both.loss  # more random moves, fewer losses
    assert mixed.both.loss.denominator > 1 and isinstance(mixed.both.loss, Fraction)


async def test_refuses_sampling_and_unenumerable_opponents():
    client = BoardPolicyClient(solver)
    with pytest.raises(ValueError, match="greedy.*sampled evaluation"):
        await exact_eval(client, temperature=0.6)
    with pytest.raises(ValueError, match="no exact distribution"):
        await exact_eval(client, opponent="first_free")
    with pytest.raises(ValueError, match="seats"):
        await exact_eval(client, seats=("Z",))


async def test_metrics_and_table():
    r = await exact_eval(BoardPolicyClient(lowest_free), opponent="random")
    m = r.as_metrics()
    assert all(isinstance(v, float) for v in m.values())
    assert m["win_rate"] == pytest.approx((m["x/win_rate"] + m["o/win_rate"]) / 2)
    assert m["positions_all"] == 0.0 and m["positions"] == m["x/positions"] + m["o/positions"]
    table = r.table()
    assert table == format_table(m, "random")
    assert "against random" in table and "positions met in the enumeration" in table
    assert f"{m['x/win_rate'] * 100:.2f}%" in table.splitlines()[2]
    rec = r.records[0].to_dict()
    assert rec["board"] == "........." and rec["move"] == 0 and rec["optimal"] is True  # every opening draws


@pytest.fixture(scope="module")
def tiny_engine(tiny_model_dir):
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.lora import load_policy

    model, tok = load_policy(str(tiny_model_dir), dtype="float32", seed=0)
    return TransformersEngine(model, tok, max_batch_size=64)


def hashed_cell_parser(raw: str) -> ParseResult:
    """Any reply names a cell (a hash of its text), so a random model's games go on."""
    return ParseResult(coord(zlib.crc32(raw.encode()) % 9))


async def test_tiny_model_end_to_end_batches_each_depth(tiny_engine):
    tiny_engine.stats.update(batches=0, sequences=0)
    r = await exact_eval(tiny_engine, opponent="minimax", max_tokens=4)  # the recipe's strict parser
    assert_sums_to_one(r)
    assert r.both.parse_error == 1 and r.seats["O"].nodes == 9  # never parses: one decision per opening
    assert tiny_engine.stats["batches"] == 1 and tiny_engine.stats["sequences"] == r.decisions == 10

    tiny_engine.stats.update(batches=0, sequences=0)
    r = await exact_eval(tiny_engine, opponent="random", agent_factory=lambda client: Agent(
        client, make_context("last"), hashed_cell_parser, SamplingParams(temperature=0.0, max_tokens=4),
        reject_incomplete=False))
    assert_sums_to_one(r)
    assert tiny_engine.stats["sequences"] == r.decisions  # one call per distinct prompt
    assert r.decisions >= 40 and tiny_engine.stats["batches"] <= 5  # at most one batch per depth here
    assert r.both.nodes >= r.decisions and r.both.illegal > 0


@pytest.mark.slow
async def test_tiny_model_answers_every_reachable_position_in_batches(tiny_engine):
    tiny_engine.stats.update(batches=0, sequences=0)
    r = await exact_eval(tiny_engine, opponent="random", max_tokens=4, all_positions=True, compact=True,
                         show_opponent_move=False)
    assert_sums_to_one(r)
    assert r.decisions == 4520 == tiny_engine.stats["sequences"] and r.positions["all"].positions == 4520
    assert tiny_engine.stats["batches"] <= 4520 // 64 + 8  # batched, not one forward per decision


def test_a_custom_agent_must_be_greedy():
    factory = lambda client: Agent(client, make_context("last"), sampling=SamplingParams(temperature=1.0))  # noqa: E731
    with pytest.raises(ValueError, match="temperature 1.0"):
        asyncio.run(exact_eval(BoardPolicyClient(solver), agent_factory=factory))


async def test_decision_cache_answers_concurrent_duplicates_once_and_turns_errors_into_failed_responses():
    from ludic.tictactoe.exact import DecisionCache

    class Slow:
        tokenizer = None
        calls = 0

        async def complete(self, request):
            Slow.calls += 1
            await asyncio.sleep(0.01)
            if request.messages[0]["content"] == "boom":
                raise RuntimeError("backend down")
            return ChatResponse(request.messages[0]["content"].upper(), TokenTrace((), (1,), (0.0,), (0,)))

    cache = DecisionCache(Slow())
    ask = lambda text: cache.complete(ChatRequest([{"role": "user", "content": text}]))  # noqa: E731
    a, b, c, d = await asyncio.gather(ask("hi"), ask("hi"), ask("ho"), ask("boom"))
    assert Slow.calls == 3 and len(cache) == 3
    assert (a.text, b.text, c.text) == ("HI", "HI", "HO")
    assert a.info["decision"] == b.info["decision"] == 0 and c.info["decision"] == 1
    assert d.finish_reason == FinishReason.ERROR and "backend down" in d.info["error"] and d.info["decision"] == 2


@pytest.mark.parametrize("policy, opponent, starts, expected", [
    (lowest_free, "random", True, Fraction(25, 32) + Fraction(1, 24)),
    (solver_with_edge_blunder, "minimax", False, Fraction(5, 9)),
])
async def test_exact_non_loss_agrees_with_games_played_by_the_protocol(policy, opponent, starts, expected):
    from ludic.interaction import SingleAgentProtocol
    from ludic.parsers import think_move_parser
    from ludic.eval.stats import wilson_interval

    exact = await exact_eval(BoardPolicyClient(policy), opponent=opponent, seats=("X" if starts else "O",))
    assert exact.both.non_loss == expected
    non_losses, n = 0, 600
    for seed in range(n):  # the env samples its own opponent moves from the seed
        agent = Agent(BoardPolicyClient(policy), make_context("last"), think_move_parser(),
                      SamplingParams(temperature=0.0))
        env = TicTacToeEnv(agent_starts=starts, opponent=opponent)
        (rollout,) = await SingleAgentProtocol(agent, stop_on_parse_error=True).run(env, max_steps=5, env_seed=seed)
        non_losses += rollout.steps[-1].info["result"] in ("win", "draw")
    lo, hi = wilson_interval(non_losses, n, z=3.29)  # 99.9%: the seeds are fixed, this cannot flake
    assert lo <= float(expected) <= hi
