"""Tic-tac-toe rules, solver, bots and envs (all hand-checkable, < 2 s)."""

from __future__ import annotations

import itertools
import random
from collections import Counter
from fractions import Fraction
from functools import lru_cache

import pytest

from ludic.envs.registry import make_env
from ludic.tictactoe.board import (EMPTY_BOARD, TICTACTOE_RULES, best_moves, coord, game_value, is_full,
                                   legal_moves, make_opponent, minimax_opponent, mixed_opponent,
                                   opponent_distribution, optimal_moves, other, parse_board, parse_coord, play,
                                   random_opponent, reachable_positions, render_board, solve, to_move, winner)
from ludic.tictactoe.env import TicTacToeEnv, TicTacToeGame
from ludic.types import EnvSpec

A1, A2, A3, B1, B2, B3, C1, C2, C3 = range(9)


def board(*rows: str):
    """board("X.O", ".O.", "X..") -> a 9-tuple ('.' = empty)."""
    cells = "".join(rows).replace(".", " ")
    assert len(cells) == 9
    return tuple(cells)


def first_free(b, rng):
    """Deterministic test bot: the lowest free cell index."""
    return legal_moves(b)[0]


# ---------------------------------------------------------------- rules


@pytest.mark.parametrize(
    "rows, expected",
    [
        (("XXX", "OO.", "..."), "X"),  # top row
        (("X..", "OOO", "X.X"), "O"),  # middle row
        ((".X.", "OXO", ".X."), "X"),  # middle column
        (("..O", "X.O", "X.O"), "O"),  # right column
        (("X.O", "OX.", "..X"), "X"),  # main diagonal
        (("X.O", "XO.", "O.X"), "O"),  # anti-diagonal
        (("XOX", "XOO", "OXX"), None),  # full board, draw
        (("...", "...", "..."), None),
    ],
)
def test_winner(rows, expected):
    assert winner(board(*rows)) == expected


def test_rules_helpers():
    b = board("XO.", "...", "...")
    assert to_move(EMPTY_BOARD) == "X" and to_move(board("X..", "...", "...")) == "O"
    assert to_move(b) == "X"
    assert legal_moves(b) == [2, 3, 4, 5, 6, 7, 8]
    assert legal_moves(board("XXX", "OO.", "...")) == []  # game over
    assert is_full(board("XOX", "XOO", "OXX")) and not is_full(b)
    assert play(b, B2) == board("XO.", ".X.", "...")
    with pytest.raises(ValueError):
        play(b, A1)


def test_coordinates_round_trip():
    assert coord(0) == "A1" and coord(4) == "B2" and coord(8) == "C3" and coord(5) == "B3"
    for i in range(9):
        assert parse_coord(coord(i)) == i
        assert parse_coord(f"  {coord(i).lower()} ") == i
    assert parse_coord(" b2 ") == 4 and parse_coord("C1") == 6


@pytest.mark.parametrize(
    "text", ["D1", "A4", "A0", "A", "1", "", "  ", "A1 B2", "1A", "AA1", "B 2", "B2."]
)
def test_parse_coord_rejects(text):
    assert parse_coord(text) is None


def test_render_board_shows_free_cells_in_brackets():
    text = render_board(board("X.O", "...", "..."))
    rows = text.split("\n")
    assert len(rows) == 5 and rows[1] == rows[3] == "------+------+------"
    assert [c.strip() for c in rows[0].split("|")] == ["X", "[A2]", "O"]
    assert [c.strip() for c in rows[4].split("|")] == ["[C1]", "[C2]", "[C3]"]


@pytest.mark.parametrize("compact", [False, True])
def test_parse_board_inverts_render_board_on_every_reachable_position(compact):
    for b in reachable_positions():
        assert parse_board(render_board(b, compact)) == b
    won = board("XXX", "OO.", "...")  # terminal boards parse too
    assert parse_board(render_board(won, compact)) == won


@pytest.mark.parametrize("compact", [False, True])
def test_parse_board_reads_the_board_out_of_an_observation(compact):
    env = TicTacToeEnv(agent_starts=False, opponent=minimax_opponent, compact=compact)
    obs, _ = env.reset(seed=3)["agent_0"]
    assert parse_board(obs) == env.board and env.board.count("X") == 1
    out = env.step({"agent_0": coord(legal_moves(env.board)[0])})["agent_0"]
    assert parse_board(out.obs) == env.board and env.board.count("O") == 1


def test_parse_board_rejects_what_is_not_a_board():
    assert parse_board("no board here") is None
    wide = render_board(board("X..", "...", "..."))
    assert parse_board(wide.replace("[A2]", "[B2]")) is None  # a free cell under another name
    assert parse_board(wide.replace("|", " ")) is None
    assert parse_board(render_board(board("X..", "...", "..."), True).replace("B . .", "B . ? .")) is None


def test_reachable_positions_are_exactly_the_legal_unfinished_boards():
    # Independent check over all 3^9 fillings: a board is reachable and unfinished iff
    # X has as many marks as O or one more, nobody has three in a line, and a cell is free.
    legal = set()
    for cells in itertools.product(" XO", repeat=9):
        if cells.count("X") - cells.count("O") in (0, 1) and winner(cells) is None and not is_full(cells):
            legal.add(cells)
    positions = reachable_positions()
    assert len(positions) == len(set(positions)) == len(legal) == 4520
    assert set(positions) == legal and positions[0] == EMPTY_BOARD
    assert sum(to_move(b) == "X" for b in positions) == 2423
    assert sum(to_move(b) == "O" for b in positions) == 2097


# ---------------------------------------------------------------- solver


def test_solver_prefers_the_immediate_win_over_a_slower_forced_win():
    # X to move. A1 wins now (score 9). B2, C1 and C2 each make a fork (two
    # threats, O has none of its own), winning at ply 3 (score 7). B3 forces O
    # to block at A1, which gives O a fork (C1 and B2): loss at ply 4 (-6).
    b = board(".XX", "O..", "..O")
    assert solve(b) == {A1: 9, B2: 7, B3: -6, C1: 7, C2: 7}
    assert best_moves(b) == [A1]
    assert game_value(b) == 1
    assert optimal_moves(b) == {A1, B2, C1, C2}


def test_solver_only_block_keeps_the_draw():
    # O to move; X threatens A3. Every other move loses at X's next move.
    b = board("XX.", ".O.", "...")
    scores = solve(b)
    assert scores[A3] == 0
    assert all(scores[m] == -8 for m in scores if m != A3)
    assert optimal_moves(b) == {A3} and best_moves(b) == [A3]
    assert game_value(b) == 0


def test_empty_board_is_a_draw_and_every_opening_is_optimal():
    assert game_value(EMPTY_BOARD) == 0
    assert solve(EMPTY_BOARD) == {m: 0 for m in range(9)}
    assert optimal_moves(EMPTY_BOARD) == set(range(9))
    assert best_moves(EMPTY_BOARD) == list(range(9))


def test_lost_position_prefers_the_slowest_loss():
    # O to move; X threatens B2 (A3-B2-C1). Blocking at B2 forces C3 (O
    # threatens A1-B2-C3), after which X forks B3/C2 and wins at ply 4 (-6);
    # anything else loses to B2 at ply 2 (-8).
    b = board("O.X", "...", "X..")
    scores = solve(b)
    assert scores[B2] == -6
    assert all(scores[m] == -8 for m in scores if m != B2)
    assert game_value(b) == -1
    assert best_moves(b) == [B2]
    assert optimal_moves(b) == set(legal_moves(b))  # every move keeps the (lost) value


def test_scores_are_from_the_perspective_of_the_player_to_move():
    x_wins_now = board("XX.", "OO.", "...")  # X to move
    o_wins_now = board("XX.", "OO.", "X..")  # O to move
    assert solve(x_wins_now)[A3] == 9 and best_moves(x_wins_now) == [A3]
    assert solve(o_wins_now)[B3] == 9 and best_moves(o_wins_now) == [B3]
    assert game_value(x_wins_now) == game_value(o_wins_now) == 1
    assert solve(board("XXX", "OO.", "...")) == {} and game_value(board("XXX", "OO.", "...")) == -1


def _reachable():
    seen, stack = set(), [EMPTY_BOARD]
    while stack:
        b = stack.pop()
        if b not in seen:
            seen.add(b)
            stack.extend(play(b, m) for m in legal_moves(b))
    return seen


@lru_cache(maxsize=None)
def _plain_value(b) -> int:
    """Independent textbook minimax: +1/0/-1 for the player to move."""
    if winner(b) is not None:
        return -1
    if is_full(b):
        return 0
    return max(-_plain_value(play(b, m)) for m in legal_moves(b))


def test_solver_agrees_with_plain_minimax_on_every_reachable_position():
    positions = _reachable()
    assert len(positions) == 5478  # well-known count of legal tic-tac-toe positions
    for b in positions:
        assert game_value(b) == _plain_value(b)
        expected = {m for m in legal_moves(b) if -_plain_value(play(b, m)) == _plain_value(b)}
        assert optimal_moves(b) == expected
        assert set(best_moves(b)) <= expected


# ---------------------------------------------------------------- opponents


def test_minimax_opponent_never_loses_exhaustively_from_both_sides():
    """DFS over every agent move sequence and every opponent tie-break in best_moves.

    16752 terminal games in all: as X the agent draws 3584 and loses 2528; as O
    it draws 3584 and loses 7056; it never wins. (Cross-checked once by filtering
    all 255168 complete tic-tac-toe games for opponent moves in best_moves.)
    """
    rng = random.Random(0)
    counts = {}
    for agent in "XO":
        results = {"agent_win": 0, "draw": 0, "agent_loss": 0}  # agent's perspective
        stack = [EMPTY_BOARD]
        while stack:
            b = stack.pop()
            w = winner(b)
            if w is not None or is_full(b):
                key = "draw" if w is None else ("agent_win" if w == agent else "agent_loss")
                results[key] += 1
                continue
            if to_move(b) == agent:
                stack.extend(play(b, m) for m in legal_moves(b))
            else:
                assert minimax_opponent(b, rng) in best_moves(b)
                stack.extend(play(b, m) for m in best_moves(b))
        assert results["agent_win"] == 0, f"minimax lost as {other(agent)}: {results}"
        counts[agent] = results
    expected = {
        "X": {"agent_win": 0, "draw": 3584, "agent_loss": 2528},
        "O": {"agent_win": 0, "draw": 3584, "agent_loss": 7056},
    }
    assert counts == expected, f"terminal games checked: {counts}"


def test_opponent_factories():
    rng = random.Random(3)
    b = board("XX.", "OO.", "...")
    assert all(random_opponent(b, rng) in legal_moves(b) for _ in range(20))
    assert all(minimax_opponent(b, rng) == A3 for _ in range(20))
    assert all(mixed_opponent(0.0)(b, rng) == A3 for _ in range(20))
    assert {mixed_opponent(1.0)(b, rng) for _ in range(200)} == set(legal_moves(b))
    assert make_opponent("random") is random_opponent
    assert make_opponent("minimax") is minimax_opponent
    assert make_opponent("mixed", 0.0)(b, rng) == A3
    with pytest.raises(ValueError, match="'alphazero'"):
        make_opponent("alphazero")
    with pytest.raises(ValueError):
        mixed_opponent(1.5)


def test_opponent_distribution_is_what_the_bots_sample():
    # X to move: A3 wins now (the only best move); five free cells for random.
    b = board("XX.", "OO.", "...")
    assert opponent_distribution("minimax")(b) == [(A3, 1)]
    assert opponent_distribution("random")(b) == [(m, Fraction(1, 5)) for m in legal_moves(b)]
    mixed = dict(opponent_distribution("mixed", 0.3)(b))
    assert mixed[A3] == Fraction(3, 10) / 5 + Fraction(7, 10) and mixed[C1] == Fraction(3, 50)
    assert sum(mixed.values()) == 1
    # the empty board: every opening draws, so minimax is uniform over all nine
    assert opponent_distribution("minimax")(EMPTY_BOARD) == [(m, Fraction(1, 9)) for m in range(9)]
    # over many seeds the bot plays exactly the support, near the stated frequencies
    rng, b = random.Random(0), board("X..", "...", "...")
    support = dict(opponent_distribution("mixed", 0.5)(b))
    counts = Counter(mixed_opponent(0.5)(b, rng) for _ in range(4000))
    assert set(counts) == set(support)
    assert all(abs(counts[m] / 4000 - float(p)) < 0.03 for m, p in support.items())
    with pytest.raises(ValueError, match="no exact distribution"):
        opponent_distribution("alphazero")
    with pytest.raises(ValueError, match="epsilon"):
        opponent_distribution("mixed", 1.5)


# ---------------------------------------------------------------- TicTacToeEnv


def _step(env, action):
    return env.step({env.agent_id: action})[env.agent_id]


def test_env_reset_observation_and_rules():
    env = TicTacToeEnv(agent_starts=True)
    obs, info = env.reset(seed=0)["agent_0"]
    assert info == {"agent_mark": "X", "opponent_mark": "O", "agent_starts": True,
                    "opponent": "random", "opponent_move": None}
    assert obs.startswith("Board:\n")
    assert "Available moves: A1, A2, A3, B1, B2, B3, C1, C2, C3" in obs
    assert obs.endswith("You are X. Your move.")
    assert env.suggested_sysprompt == TICTACTOE_RULES
    assert "three" in TICTACTOE_RULES.lower() and "illegal" in TICTACTOE_RULES.lower()


def test_env_observation_after_a_move():
    env = TicTacToeEnv(agent_starts=True, opponent=first_free)
    env.reset(seed=0)
    out = _step(env, "a1")  # O replies A2 (first free cell)
    assert out.obs.split("\n")[0] == "Opponent (O) played A2."
    assert "Available moves: A3, B1, B2, B3, C1, C2, C3\n" in out.obs
    assert out.obs.endswith("You are X. Your move.")
    assert out.info["agent_move"] == "A1" and out.info["opponent_move"] == "A2"
    assert out.reward == 0.0 and not out.terminated and "result" not in out.info

    quiet = TicTacToeEnv(agent_starts=True, opponent=first_free, show_opponent_move=False)
    quiet.reset(seed=0)
    assert _step(quiet, "A1").obs.startswith("Board:\n")


def test_env_agent_as_o_sees_the_opening_move():
    env = TicTacToeEnv(agent_starts=False, opponent=first_free)
    obs, info = env.reset(seed=0)["agent_0"]
    assert info["agent_mark"] == "O" and info["opponent_move"] == "A1"
    assert obs.split("\n")[0] == "Opponent (X) played A1."
    assert "Available moves: A2, A3, B1, B2, B3, C1, C2, C3\n" in obs
    assert obs.endswith("You are O. Your move.")


@pytest.mark.parametrize("action, shown", [("Z9", "Z9"), ("B2 please", "B2 please"), ("A1", "A1")])
def test_env_illegal_move_ends_the_episode(action, shown):
    env = TicTacToeEnv(agent_starts=False, opponent=first_free, illegal_reward=-2.0)
    env.reset(seed=0)  # X (opponent) opened at A1, so A1 is occupied
    out = _step(env, action)
    assert out.terminated and out.reward == -2.0
    assert out.info["illegal_move"] is True and out.info["result"] == "illegal"
    assert out.info["agent_move"] == shown and out.info["optimal_move"] is False
    assert out.info["opponent_move"] is None
    assert out.info["num_agent_moves"] == 1 and out.info["num_optimal_moves"] == 0
    assert "Illegal move" in out.obs and env.active_agents == []
    with pytest.raises(RuntimeError):
        _step(env, "B2")


def test_env_agent_starts_none_samples_both_marks_deterministically():
    env = TicTacToeEnv(opponent="random")
    marks = {}
    for seed in range(20):
        obs, info = env.reset(seed=seed)["agent_0"]
        marks[seed] = info["agent_mark"]
        assert env.reset(seed=seed)["agent_0"] == (obs, info)
    assert set(marks.values()) == {"X", "O"}


def _play_out(env, seed):
    """Always play the first available move; return every observation seen."""
    obs, _ = env.reset(seed=seed)["agent_0"]
    seen = [obs]
    while env.active_agents:
        out = _step(env, coord(legal_moves(env.board)[0]))
        seen.append((out.obs, out.info.get("opponent_move")))
    return seen


def test_env_same_seed_same_opponent_moves():
    a = _play_out(TicTacToeEnv(opponent="random"), seed=11)
    b = _play_out(TicTacToeEnv(opponent="random"), seed=11)
    assert a == b
    others = [_play_out(TicTacToeEnv(opponent="random"), seed=s) for s in range(12, 20)]
    assert any(o != a for o in others)


def _script(moves, **kwargs):
    env = TicTacToeEnv(agent_starts=True, opponent=first_free, **kwargs)
    env.reset(seed=0)
    return [_step(env, m) for m in moves]


def test_env_rewards_for_win_draw_loss():
    kw = {"win_reward": 2.0, "draw_reward": 0.25, "loss_reward": -0.5}
    # Win: X A1, O A2, X B1, O A3, X C1 (column 1).
    *mid, last = _script(["A1", "B1", "C1"], **kw)
    assert [o.reward for o in mid] == [0.0, 0.0] and not any(o.terminated for o in mid)
    assert last.terminated and last.reward == 2.0 and last.info["result"] == "win"
    assert last.info["opponent_move"] is None and "Game over: you won." in last.obs
    # Loss: X B2, O A1, X B1, O A2, X C3, O A3 (row A).
    last = _script(["B2", "B1", "C3"], **kw)[-1]
    assert last.terminated and last.reward == -0.5 and last.info["result"] == "loss"
    assert last.info["opponent_move"] == "A3" and "Game over: you lost." in last.obs
    # Draw: X A2, O A1, X B1, O A3, X B3, O B2, X C1, O C2, X C3:
    #   O X O / X O X / X O X
    outs = _script(["A2", "B1", "B3", "C1", "C3"], **kw)
    assert outs[-1].terminated and outs[-1].reward == 0.25 and outs[-1].info["result"] == "draw"
    assert outs[-1].info["num_agent_moves"] == 5


def test_env_optimal_move_info():
    # X B2 (opening: optimal), O A1; X C1 (keeps the draw), O A2 (a blunder);
    # now X must win at A3: B3 is not optimal, O then wins at A3.
    outs = _script(["B2", "C1", "B3"])
    assert [o.info["optimal_move"] for o in outs] == [True, True, False]
    assert outs[-1].info["result"] == "loss"
    assert outs[-1].info["num_optimal_moves"] == 2 and outs[-1].info["num_agent_moves"] == 3
    win = _script(["B2", "C1", "A3"])[-1]
    assert win.info["optimal_move"] is True and win.info["result"] == "win"
    assert win.info["num_optimal_moves"] == 3


def test_env_minimax_never_loses_to_a_random_agent_and_registry_builds_it():
    env = make_env(EnvSpec("tictactoe", {"opponent": "minimax", "agent_starts": None}))
    agent_rng = random.Random(0)
    for seed in range(30):
        env.reset(seed=seed)
        while env.active_agents:
            out = _step(env, coord(agent_rng.choice(legal_moves(env.board))))
        assert out.info["result"] in {"loss", "draw"}
    with pytest.raises(ValueError, match="'nobody'"):
        TicTacToeEnv(opponent="nobody")


# ---------------------------------------------------------------- TicTacToeGame


def test_game_reset_and_turns():
    game = make_env(EnvSpec("tictactoe_selfplay", {}))
    assert isinstance(game, TicTacToeGame) and game.agent_ids == ["X", "O"]
    first = game.reset(seed=0)
    assert game.active_agents == ["X"]
    assert first["X"][0].endswith("You are X. Your move.")
    assert first["O"][0].endswith("You are O. Waiting for X.")
    assert first["O"][1] == {"agent_mark": "O", "opponent_mark": "X", "agent_starts": False}
    out = game.step({"X": "B2"})
    assert set(out) == {"X", "O"}
    assert out["X"].obs.endswith("You are X. Waiting for O.") and out["X"].reward == 0.0
    assert out["X"].info["agent_move"] == "B2" and out["X"].info["optimal_move"] is True
    assert out["O"].obs.startswith("Opponent (X) played B2.\n")
    assert "Available moves: A1, A2, A3, B1, B3, C1, C2, C3\n" in out["O"].obs
    assert out["O"].info == {"opponent_move": "B2"} and not out["O"].terminated
    assert game.active_agents == ["O"] and game.observe("O") == out["O"].obs
    with pytest.raises(ValueError):
        game.step({"X": "A1"})  # not X's turn


def test_game_observations_match_the_bot_env_without_the_opponent_move():
    game = TicTacToeGame(compact=True, show_opponent_move=False)
    game.reset()
    game.step({"X": "B2"})
    env = TicTacToeEnv(agent_starts=False, compact=True, show_opponent_move=False,
                       opponent=lambda board, rng: 4)  # the bot opens B2 too
    obs, _ = env.env_reset(seed=0)
    assert game.observe("O") == obs and "Opponent" not in obs


def test_game_terminal_rewards_for_both_players():
    game = TicTacToeGame(win_reward=1.0, loss_reward=-1.0)
    game.reset()
    for mark, move in [("X", "A1"), ("O", "B1"), ("X", "A2"), ("O", "B2")]:
        game.step({mark: move})
    out = game.step({"X": "A3"})  # row A
    assert out["X"].terminated and out["X"].reward == 1.0 and out["X"].info["result"] == "win"
    assert out["O"].terminated and out["O"].reward == -1.0 and out["O"].info["result"] == "loss"
    assert out["X"].info["num_agent_moves"] == 3
    assert "Game over: you lost." in out["O"].obs and game.active_agents == []
    with pytest.raises(RuntimeError):
        game.step({"O": "C1"})


def test_game_draw_rewards_both():
    game = TicTacToeGame(draw_reward=0.5)
    game.reset()
    moves = ["A2", "A1", "B1", "A3", "B3", "B2", "C1", "C2", "C3"]  # O X O / X O X / X O X
    for i, move in enumerate(moves):
        out = game.step({"XO"[i % 2]: move})
    assert {m: (o.reward, o.terminated, o.info["result"]) for m, o in out.items()} == {
        "X": (0.5, True, "draw"), "O": (0.5, True, "draw")}


def test_game_illegal_move_forfeits_the_game_to_the_other_seat():
    game = TicTacToeGame(win_reward=1.0, illegal_reward=-1.0)
    game.reset()
    game.step({"X": "B2"})
    out = game.step({"O": "b2"})  # occupied
    assert out["O"].terminated and out["O"].reward == -1.0
    assert out["O"].info["result"] == "illegal" and out["O"].info["illegal_move"] is True
    # the other seat wins by forfeit: the win reward, result "win", and a flag telling it from a real win
    assert out["X"].terminated and out["X"].reward == 1.0
    assert out["X"].info["result"] == "win" and out["X"].info["opponent_illegal"] is True
    assert "opponent_illegal" not in out["O"].info
    assert "illegal move" in out["X"].obs and "you won" in out["X"].obs
    assert game.observe("X") == out["X"].obs and game.active_agents == []


def test_game_forfeit_win_uses_the_configured_win_reward():
    game = TicTacToeGame(win_reward=2.0, illegal_reward=-3.0)
    game.reset()
    out = game.step({"X": "D4"})  # not a cell
    assert (out["X"].reward, out["X"].info["result"]) == (-3.0, "illegal")
    assert (out["O"].reward, out["O"].info["result"], out["O"].info["opponent_illegal"]) == (2.0, "win", True)


def test_game_real_win_is_not_marked_as_a_forfeit():
    game = TicTacToeGame()
    game.reset()
    for mark, move in [("X", "A1"), ("O", "B1"), ("X", "A2"), ("O", "B2")]:
        game.step({mark: move})
    out = game.step({"X": "A3"})
    assert out["X"].info["result"] == "win" and "opponent_illegal" not in out["X"].info


# ---------------------------------------------------------------- move kinds


def test_move_kind_has_one_definition_next_to_the_rules():
    from ludic.tictactoe import board, synth, thinktactoe

    assert synth.move_kind is board.move_kind and thinktactoe.move_kind is board.move_kind


def test_move_kind_win_block_fork_and_position():
    from ludic.tictactoe.board import move_kind

    b = board(".XX", "...", "OO.")  # X to move: A1 wins, C3 blocks
    assert move_kind(b, A1) == "win" and move_kind(b, C3) == "block"
    assert move_kind(b, A1, "O") == "block" and move_kind(b, C3, "O") == "win"  # judged for the named player
    assert move_kind(b, B2) == "centre" and move_kind(b, B1) == "edge" and move_kind(EMPTY_BOARD, A3) == "corner"
    f = board("XO.", ".O.", "..X")  # X to move: C1 threatens row C and column 1 at once
    assert move_kind(f, C1, forks=True) == "fork" and move_kind(f, C1) == "corner"
    assert move_kind(f, A3, forks=True) == "corner"  # one threat only (column 3)
    assert move_kind(f, C2, forks=True) == "block"  # O threatens column 2 at C2
