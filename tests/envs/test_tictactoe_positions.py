"""The solver-exact move reward and the single-position env (position-level RL)."""

import pytest

import ludic.tictactoe.board as ttt
from ludic.tictactoe.env import format_observation
from ludic.tictactoe.thinktactoe import make_prompt, move_quality_reward
from ludic.envs.prompt_env import get_reward
from ludic.envs.registry import make_env
from ludic.tictactoe.positions import (
    TicTacToePositionEnv,
    board_from_string,
    board_to_string,
    solver_move_reward,
)
from ludic.types import EnvSpec


def _board(rows):
    return board_from_string("".join(rows))


def test_solver_reward_prefers_the_winning_fork_where_move_quality_prefers_the_centre():
    board = _board(["XOX", "O..", "OX."])  # the example: X to move
    assert ttt.to_move(board) == "X"
    c3, b2 = ttt.parse_coord("C3"), ttt.parse_coord("B2")
    assert ttt.game_value(board) == 1 and c3 in ttt.best_moves(board) and b2 not in ttt.optimal_moves(board)
    assert solver_move_reward(board, c3) == 1.0 and solver_move_reward(board, b2) == 0.0
    prompt = make_prompt(board)
    centre, fork = "<|move|><|1-1|><|end|>", "<|move|><|2-2|><|end|>"  # ThinkTacToe move tokens
    assert move_quality_reward(prompt, centre) == 0.6 and move_quality_reward(prompt, fork) == 0.4
    solver = get_reward("solver_move")
    assert solver(prompt, fork) == 1.0 and solver(prompt, centre) == 0.0


def test_solver_reward_value_preserving_illegal_and_best():
    # X to move on an empty board: every move draws; the centre and the corners are "best" only by tie
    empty = ttt.EMPTY_BOARD
    assert all(solver_move_reward(empty, m) in (1.0, 0.8) for m in range(9))
    board = _board(["XX.", "OO.", "..."])  # X wins at A3 now; anything else lets O win at B3
    a3 = ttt.parse_coord("A3")
    assert solver_move_reward(board, a3) == 1.0
    assert solver_move_reward(board, ttt.parse_coord("A1")) == -1.0  # occupied
    assert solver_move_reward(board, None) == -1.0
    slower = [m for m in ttt.optimal_moves(board) if m not in ttt.best_moves(board)]
    for m in slower:
        assert solver_move_reward(board, m) == 0.8


def test_position_env_renders_like_the_game_and_scores_one_move():
    board = _board(["XOX", "O..", "OX."])
    env = make_env(EnvSpec("tictactoe_position", {"board": board_to_string(board), "compact": True}))
    assert isinstance(env, TicTacToePositionEnv)
    obs, info = env.reset()[env.agent_id]
    assert obs == format_observation(board, "X", None, None, True) and info["agent_mark"] == "X"
    out = env.step({env.agent_id: "C3"})[env.agent_id]
    assert out.terminated and out.reward == 1.0 and out.info["best_move"] and out.info["optimal_move"]
    env.reset()
    out = env.step({env.agent_id: "A1"})[env.agent_id]
    assert out.reward == -1.0 and out.info["illegal_move"]
    hidden = TicTacToePositionEnv(board_to_string(board), show_moves=False)
    assert "Available moves" not in hidden.reset()[hidden.agent_id][0]
    with pytest.raises(ValueError, match="already over"):
        TicTacToePositionEnv("XXXOO....")
    with pytest.raises(ValueError, match="9 characters"):
        board_from_string("XO")
