"""Single-decision tic-tac-toe: one position, one move, a solver-exact reward.

Position-level RL trains the decisions a policy still gets wrong, one prompt
per position, without replaying whole games: ``TicTacToePositionEnv`` shows a
board exactly as ``TicTacToeEnv`` renders it for the side to move, takes one
move, and scores it with the perfect solver's game values
(``solver_move_reward``):

    1.0   a best move (fastest win, slowest loss: what the solver plays)
    0.8   another move that keeps the game-theoretic value (win stays win, draw stays draw)
    0.0   a move that gives value away (a won game drawn or lost, a drawn game lost)
   -1.0   an illegal move (occupied cell, not a cell name) or no move at all

Unlike the seed's ``move_quality`` cell heuristic (win 1.0, block 0.8, centre
0.6, corner 0.4, edge 0.2), this never prefers a losing cell: with X to move
on ``XOX / O.. / OX.`` the centre only draws while the fork at C3 wins, and
here C3 scores 1.0 and B2 0.0 (move_quality: 0.4 and 0.6).

``solver_move_reward_text`` is the same reward on ThinkTacToe-format prompts,
registered for ``ludic train prompts --reward solver_move`` beside ``move_quality``.
"""

from __future__ import annotations

from ludic.envs.base import SingleAgentEnv
from ludic.tictactoe.board import EMPTY, Board, best_moves, coord, is_over, optimal_moves, parse_coord, to_move
from ludic.tictactoe.env import format_observation
from ludic.types import JSON, StepOutcome

BEST, PRESERVING, GIVES_AWAY, ILLEGAL = 1.0, 0.8, 0.0, -1.0


def solver_move_reward(board: Board, index: int | None) -> float:
    """Solver-exact reward of playing ``index`` on ``board`` for the side to move (table above)."""
    if index is None or not 0 <= index < 9 or board[index] != EMPTY or is_over(board):
        return ILLEGAL
    if index in best_moves(board):
        return BEST
    return PRESERVING if index in optimal_moves(board) else GIVES_AWAY


def board_from_string(cells: str) -> Board:
    """``"XO......."``-style 9-character string ('.' or ' ' for free) -> Board."""
    if len(cells) != 9 or any(c not in "XO. " for c in cells.upper()):
        raise ValueError(f"a board is 9 characters of X, O and '.', got {cells!r}")
    return tuple(EMPTY if c in ". " else c for c in cells.upper())


def board_to_string(board: Board) -> str:
    return "".join("." if c == EMPTY else c for c in board)


class TicTacToePositionEnv(SingleAgentEnv):
    """One position (the side to move is the agent), one move, ``solver_move_reward``.

    Args:
        board: the position as a 9-character string (``board_to_string``).
        compact, show_moves: rendering, as in ``TicTacToeEnv`` (the prompt must match what
            the policy sees in games).
    """

    def __init__(self, board: str, *, compact: bool = False, show_moves: bool = True,
                 agent_id: str = "agent_0") -> None:
        super().__init__(agent_id)
        self.board = board_from_string(board)
        if is_over(self.board):
            raise ValueError(f"position {board!r} is already over: nothing to decide")
        self.compact, self.show_moves = compact, show_moves
        self.mark = to_move(self.board)

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        obs = format_observation(self.board, self.mark, None, None, self.compact, self.show_moves)
        return obs, {"agent_mark": self.mark, "board": board_to_string(self.board)}

    def env_step(self, action: str) -> StepOutcome:
        move = parse_coord(action)
        reward = solver_move_reward(self.board, move)
        info: JSON = {
            "agent_move": action if move is None else coord(move),
            "illegal_move": reward == ILLEGAL,
            "optimal_move": reward >= PRESERVING,
            "best_move": reward == BEST,
            "board": board_to_string(self.board),
        }
        return StepOutcome("", reward, terminated=True, info=info)


def solver_move_reward_text(prompt: str, completion: str) -> float:
    """``solver_move_reward`` for a ThinkTacToe-format prompt and completion (cf. ``move_quality_reward``)."""
    from ludic.tictactoe.thinktactoe import parse_board_block, parse_move, parse_side

    board = parse_board_block(prompt)
    move = parse_move(completion)
    if board is None or move is None:
        return ILLEGAL
    side = parse_side(prompt) or to_move(board)
    if side != to_move(board):
        return ILLEGAL  # the prompt names a side that is not to move: no solver answer
    return solver_move_reward(board, move)
