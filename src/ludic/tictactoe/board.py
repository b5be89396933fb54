"""Tic-tac-toe's board: pure rules, rendering and parsing, a perfect solver, move kinds and the bots.

Board: a tuple of 9 cells, each ``' '``, ``'X'`` or ``'O'``; index =
``row * 3 + col``. Cells are named by a row letter A (top), B, C (bottom)
and a column digit 1 (left), 2, 3 (right): ``"A1"`` is index 0, ``"C3"`` is
index 8. X always moves first, so the side to move is derived from the board.

The envs that play on it are in ``ludic.tictactoe.env``.

Solver scores (``solve``) are from the perspective of the player to move and
depth-aware: with ``p`` = plies from the current position until the game
ends (the move itself counts as 1) under perfect play, a win scores
``10 - p`` (1..9), a loss ``-(10 - p)`` and a draw 0. Faster wins and slower
losses therefore score higher.
"""

from __future__ import annotations

import random
import re
from fractions import Fraction
from functools import lru_cache
from typing import Callable


Board = tuple[str, ...]
Opponent = Callable[[Board, random.Random], int]

EMPTY = " "
EMPTY_BOARD: Board = (EMPTY,) * 9
ROWS = "ABC"
LINES = (
    (0, 1, 2), (3, 4, 5), (6, 7, 8),  # rows
    (0, 3, 6), (1, 4, 7), (2, 5, 8),  # columns
    (0, 4, 8), (2, 4, 6),  # diagonals
)
WIN_SCORE = 10
"""A win ``p`` plies ahead scores ``WIN_SCORE - p``; a loss the negation."""

TICTACTOE_RULES = (
    "You are playing tic-tac-toe on a 3x3 board. Rows are labelled A, B, C from top to "
    "bottom and columns 1, 2, 3 from left to right, so A1 is the top-left cell and C3 the "
    "bottom-right cell. Players take turns placing their mark (X or O) in an empty cell; "
    "X moves first. Three of your marks in a row, column or diagonal wins; a full board "
    "without a line is a draw. Naming an occupied cell or anything that is not a cell "
    "is an illegal move and loses the game."
)

_COORD_RE = re.compile(r"([A-C])([1-3])", re.IGNORECASE)


# ---------------------------------------------------------------- rules


def winner(board: Board) -> str | None:
    """``'X'`` or ``'O'`` if that mark has three in a line, else None."""
    for a, b, c in LINES:
        if board[a] != EMPTY and board[a] == board[b] == board[c]:
            return board[a]
    return None


def is_full(board: Board) -> bool:
    """True when no cell is empty."""
    return EMPTY not in board


def is_over(board: Board) -> bool:
    """True when someone has won or the board is full."""
    return winner(board) is not None or is_full(board)


def legal_moves(board: Board) -> list[int]:
    """Empty cell indices in increasing order ([] once the game is over)."""
    if winner(board) is not None:
        return []
    return [i for i, cell in enumerate(board) if cell == EMPTY]


def to_move(board: Board) -> str:
    """Mark of the player to move: X when both have played equally often."""
    return "X" if board.count("X") == board.count("O") else "O"


def other(mark: str) -> str:
    """The opposing mark."""
    return "O" if mark == "X" else "X"


def play(board: Board, index: int) -> Board:
    """The board after the player to move puts its mark on ``index``."""
    if index not in legal_moves(board):
        raise ValueError(f"illegal move {index!r} on board {board!r}")
    cells = list(board)
    cells[index] = to_move(board)
    return tuple(cells)


def parse_coord(text: str) -> int | None:
    """Cell index for a name like ``" b2 "`` (case-insensitive), else None."""
    m = _COORD_RE.fullmatch(text.strip())
    if m is None:
        return None
    return ROWS.index(m.group(1).upper()) * 3 + int(m.group(2)) - 1


def coord(index: int) -> str:
    """Cell name of an index: ``coord(4) == "B2"``."""
    if not 0 <= index < 9:
        raise ValueError(f"cell index must be 0..8, got {index!r}")
    return f"{ROWS[index // 3]}{index % 3 + 1}"


def render_board(board: Board, compact: bool = False) -> str:
    """Three rows of marks; free cells show their name in brackets, e.g. ``[A2]``.

    ``compact=True`` gives a grid with row/column labels and ``.`` for free
    cells (about a third of the tokens)::

          1 2 3
        A X . O
        B . X .
        C . . .
    """
    if compact:
        rows = ["  1 2 3"]
        for r in range(3):
            rows.append(ROWS[r] + " " + " ".join("." if c == EMPTY else c for c in board[r * 3 : r * 3 + 3]))
        return "\n".join(rows)
    rows = []
    for r in range(3):
        cells = [
            (f"[{coord(i)}]" if board[i] == EMPTY else board[i]).center(6)
            for i in range(r * 3, r * 3 + 3)
        ]
        rows.append("|".join(cells).rstrip())
    return "\n------+------+------\n".join(rows)


_WIDE_SEP = "------+------+------"
_COMPACT_ROW = re.compile(r"([A-C])((?: [.XO]){3})")


def parse_board(text: str) -> Board | None:
    """The board drawn in ``text`` by ``render_board`` (either rendering), else None.

    The inverse of ``render_board``: the first board found wins, so an
    observation (note line, ``Board:``, the grid, moves) parses to its board.
    A free cell must carry its own name (``[A2]`` as the second cell).
    """
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.strip() == "1 2 3":  # compact: a header, then rows A, B, C
            rows = [_COMPACT_ROW.fullmatch(x.rstrip()) for x in lines[i + 1:i + 4]]
            if len(rows) == 3 and all(m and m.group(1) == ROWS[r] for r, m in enumerate(rows)):
                return tuple(EMPTY if c == "." else c for m in rows for c in m.group(2).split())  # type: ignore[union-attr]
        elif line == _WIDE_SEP and i >= 1 and lines[i + 2:i + 3] == [_WIDE_SEP]:
            cells = [c for row in lines[i - 1:i + 4:2] for c in row.split("|")]
            board = tuple(_wide_cell(c.strip(), k) for k, c in enumerate(cells))
            if len(board) == 9 and None not in board:
                return board  # type: ignore[return-value]
    return None


def _wide_cell(text: str, index: int) -> str | None:
    """A wide-rendering cell's content: its mark, EMPTY for its own ``[name]``, else None."""
    if text in ("X", "O"):
        return text
    return EMPTY if index < 9 and text == f"[{coord(index)}]" else None


# ---------------------------------------------------------------- solver


@lru_cache(maxsize=None)
def _solve(board: Board) -> tuple[tuple[int, int], ...]:
    """(move, score) pairs for the player to move; cached on the board alone.

    Scores are relative to whoever moves on ``board``, and that player is a
    function of the board, so the cache key carries the perspective.
    """
    scores = []
    for move in legal_moves(board):
        child = play(board, move)
        if winner(child) is not None:
            score = WIN_SCORE - 1
        elif is_full(child):
            score = 0
        else:
            # The reply's best score v is for the opponent; one more ply for us.
            v = max(s for _, s in _solve(child))
            score = -(v - 1) if v > 0 else -(v + 1) if v < 0 else 0
        scores.append((move, score))
    return tuple(scores)


def solve(board: Board) -> dict[int, int]:
    """Depth-aware score of every legal move, for the player to move.

    Win in ``p`` plies (this move included) = ``10 - p``, loss = ``-(10 - p)``,
    draw = 0. Empty dict when the game is over.
    """
    return dict(_solve(tuple(board)))


def game_value(board: Board) -> int:
    """Outcome under perfect play for the player to move: 1 win, 0 draw, -1 loss.

    On a finished board: -1 if the previous player won, 0 for a draw.
    """
    scores = solve(board)
    if not scores:
        return -1 if winner(board) is not None else 0
    best = max(scores.values())
    return (best > 0) - (best < 0)


def optimal_moves(board: Board) -> set[int]:
    """Moves that keep the game-theoretic outcome (win/draw/loss), at any speed."""
    value = game_value(board)
    return {m for m, s in solve(board).items() if (s > 0) - (s < 0) == value}


def best_moves(board: Board) -> list[int]:
    """Moves with the maximal depth-aware score: fastest win, slowest loss."""
    scores = solve(board)
    if not scores:
        return []
    best = max(scores.values())
    return sorted(m for m, s in scores.items() if s == best)


@lru_cache(maxsize=1)
def reachable_positions() -> tuple[Board, ...]:
    """Every reachable non-terminal position (4,520: 2,423 with X to move, 2,097 with O),
    by piece count then board order; the empty board first."""
    level, out = [EMPTY_BOARD], []
    while level:
        out += sorted(level)
        level = sorted({c for b in level for c in (play(b, m) for m in legal_moves(b)) if not is_over(c)})
    return tuple(out)


# ---------------------------------------------------------------- move kinds

CORNERS = (0, 2, 6, 8)


def completed_line(board: Board, index: int, mark: str) -> int | None:
    """Index into ``LINES`` of a line that ``mark`` completes by playing ``index`` (None if none)."""
    for k, line in enumerate(LINES):
        if index in line and all(board[i] == mark for i in line if i != index):
            return k
    return None


def threats(board: Board, mark: str) -> int:
    """Number of lines where ``mark`` holds two cells and the third is empty."""
    return sum(
        1 for line in LINES
        if [board[i] for i in line].count(mark) == 2 and [board[i] for i in line].count(EMPTY) == 1
    )


def move_kind(board: Board, index: int, player: str | None = None, *, forks: bool = False) -> str:
    """What playing the empty cell ``index`` does for ``player`` (default: the side to move).

    ``win``: it completes a line for ``player``. ``block``: otherwise, the
    opponent would complete a line there. ``fork`` (only with ``forks=True``):
    otherwise, ``player`` then threatens to complete two or more lines. Else
    the cell's position: ``centre``, ``corner`` or ``edge``. The move-quality
    reward scores these kinds (no forks); the SFT teacher's thoughts name them.
    """
    mark = player or to_move(board)
    if completed_line(board, index, mark) is not None:
        return "win"
    if completed_line(board, index, other(mark)) is not None:
        return "block"
    if forks and threats(board[:index] + (mark,) + board[index + 1:], mark) >= 2:
        return "fork"
    return "centre" if index == 4 else "corner" if index in CORNERS else "edge"


# ---------------------------------------------------------------- opponents


def random_opponent(board: Board, rng: random.Random) -> int:
    """A uniformly random legal move."""
    return rng.choice(legal_moves(board))


def minimax_opponent(board: Board, rng: random.Random) -> int:
    """A perfect player: uniform among ``best_moves`` (seeded tie-break)."""
    return rng.choice(best_moves(board))


def mixed_opponent(epsilon: float) -> Opponent:
    """A bot that plays randomly with probability ``epsilon``, else minimax."""
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")

    def opponent(board: Board, rng: random.Random) -> int:
        if rng.random() < epsilon:
            return random_opponent(board, rng)
        return minimax_opponent(board, rng)

    return opponent


def make_opponent(name: str, epsilon: float = 0.2) -> Opponent:
    """Bot by name: ``"random"``, ``"minimax"`` or ``"mixed"`` (uses ``epsilon``)."""
    if name == "random":
        return random_opponent
    if name == "minimax":
        return minimax_opponent
    if name == "mixed":
        return mixed_opponent(epsilon)
    raise ValueError(f"unknown tic-tac-toe opponent {name!r}; use 'random', 'minimax' or 'mixed'")


def opponent_distribution(name: str, epsilon: float = 0.2) -> Callable[[Board], list[tuple[int, Fraction]]]:
    """The bot ``name`` as an exact distribution: ``board -> [(move, probability), ...]``.

    What ``make_opponent(name, epsilon)`` samples from: minimax is uniform over
    ``best_moves``, random uniform over ``legal_moves``, mixed their mixture with
    weight ``epsilon`` (read as the decimal it is written as: 0.3 is 3/10) on random.
    """
    if name not in ("random", "minimax", "mixed"):
        raise ValueError(f"no exact distribution for opponent {name!r}; use 'random', 'minimax' or 'mixed'")
    eps = Fraction(1) if name == "random" else Fraction(0) if name == "minimax" else Fraction(repr(epsilon))
    if not 0 <= eps <= 1:
        raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")

    def distribution(board: Board) -> list[tuple[int, Fraction]]:
        legal, best = legal_moves(board), best_moves(board)
        probs = [eps / len(legal) + (1 - eps) * Fraction(int(m in best), len(best)) for m in legal]
        return [(m, p) for m, p in zip(legal, probs) if p]

    return distribution
