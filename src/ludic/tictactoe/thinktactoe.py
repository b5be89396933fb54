"""ThinkTacToe datasets (SFT / DPO / GRPO / minimax JSONL) in the original project's text dialects.

A prompt is a board block (one line per row of ``<|r-c|><|V|>`` cells, V in
X, O, blank; row 0 = top) between ``<|board_start|>`` and ``<|board_end|>``,
then the side to move: ``<|player|>X`` (style ``"player"``, legacy SFT/DPO) or
``<|turn|>bot`` + ``<|symbol|>X`` (style ``"minimax"``; turn is ``bot`` for X,
``player`` for O). An answer is an optional ``<player_think>...</player_think>``
line and ``<|move|><|r-c|><|end|>``. Unlike the original generators, both sides
to move appear, labels come from the perfect solver of ``ludic.tictactoe.env``
(fastest win, slowest loss, seeded tie-break), DPO ``rejected`` moves are
strictly worse than ``chosen``, and ``move_quality_reward`` (win 1.0, block
0.8, centre 0.6, corner 0.4, edge 0.2, invalid -1.0) judges the side to move.

CLI: ``python -m ludic.tictactoe.thinktactoe --kind sft|dpo|grpo|minimax ...``.
"""

from __future__ import annotations

import argparse
import random
import re
from datetime import datetime
from pathlib import Path
from typing import Callable

from ludic.data.jsonl import read_jsonl, write_jsonl
from ludic.tictactoe.board import (EMPTY, EMPTY_BOARD, Board, best_moves, completed_line, is_over, legal_moves,
                                   move_kind, other, play, solve, to_move)
from ludic.tictactoe.board import reachable_positions as all_positions  # noqa: F401 public name here too

BOARD_START, BOARD_END = "<|board_start|>", "<|board_end|>"
MOVE_PREFIX = "<|move|><|"
"""The forced prefix that ends minimax-style GRPO prompts."""
THINK_OPEN, THINK_CLOSE = "<player_think>", "</player_think>"
PROMPT_STYLES = ("player", "minimax")
THINK_MODES = ("template", "none")
KINDS = ("sft", "dpo", "grpo", "minimax")
NUM_POSITIONS = 4520
"""Reachable non-terminal positions (empty board included)."""

QUALITY = {"win": 1.0, "block": 0.8, "centre": 0.6, "corner": 0.4, "edge": 0.2}
INVALID = -1.0

_CELL_RE = re.compile(r"<\|(\d)-(\d)\|><\|(X|O|blank)\|>")
_MOVE_RE = re.compile(r"<\|move\|><\|([0-2])-([0-2])\|><\|end\|>")
_BARE_MOVE_RE = re.compile(r"\s*([0-2])-([0-2])\|><\|end\|>")
_SIDE_RE = re.compile(r"<\|(?:symbol|player)\|>[ \t]*([XO])")
_LINE_NAMES = ("top row", "middle row", "bottom row", "left column", "middle column",
               "right column", "main diagonal", "anti-diagonal")

# ---------------------------------------------------------------- text format


def cell_name(index: int) -> str:
    """``r-c`` name of a cell index: ``cell_name(5) == "1-2"``."""
    return f"{index // 3}-{index % 3}"


def board_block(board: Board) -> str:
    """The board between ``<|board_start|>`` and ``<|board_end|>`` lines (no trailing newline)."""
    rows = [" ".join(f"<|{cell_name(i)}|><|{'blank' if board[i] == EMPTY else board[i]}|>"
                     for i in range(r * 3, r * 3 + 3)) for r in range(3)]
    return "\n".join([BOARD_START, *rows, BOARD_END])


def parse_board_block(text: str) -> Board | None:
    """The board in the first board block of ``text`` (None if there is none).

    Lenient like the original: the first 3 non-empty lines between the
    markers are scanned for ``<|r-c|><|V|>`` cells; unmentioned cells stay
    empty. Coordinates outside 0-2 or fewer than 3 lines give None.
    """
    start = text.find(BOARD_START)
    end = text.find(BOARD_END, start + len(BOARD_START)) if start >= 0 else -1
    if end < 0:
        return None
    lines = [ln for ln in text[start + len(BOARD_START):end].splitlines() if ln.strip()][:3]
    if len(lines) < 3:
        return None
    cells = [EMPTY] * 9
    for line in lines:
        for r, c, v in _CELL_RE.findall(line):
            if int(r) > 2 or int(c) > 2:
                return None
            cells[int(r) * 3 + int(c)] = EMPTY if v == "blank" else v
    return tuple(cells)


def move_text(index: int) -> str:
    """``<|move|><|r-c|><|end|>``."""
    return f"{MOVE_PREFIX}{cell_name(index)}|><|end|>"


def parse_move(completion: str) -> int | None:
    """Cell index of the first ``<|move|><|r-c|><|end|>`` in ``completion``, or of a
    bare ``r-c|><|end|>`` at its start (after a forced ``<|move|><|`` prefix)."""
    m = _MOVE_RE.search(completion) or _BARE_MOVE_RE.match(completion)
    return None if m is None else int(m.group(1)) * 3 + int(m.group(2))


def side_lines(mark: str, style: str = "player") -> str:
    """``<|player|>X`` or ``<|turn|>bot\\n<|symbol|>X`` (no trailing newline)."""
    if style == "player":
        return f"<|player|>{mark}"
    if style == "minimax":
        return f"<|turn|>{'bot' if mark == 'X' else 'player'}\n<|symbol|>{mark}"
    raise ValueError(f"unknown prompt style {style!r}; use one of {PROMPT_STYLES}")


def make_prompt(board: Board, style: str = "player") -> str:
    """Board block + side-to-move line(s) + newline: everything before the thought/move."""
    return f"{board_block(board)}\n{side_lines(to_move(board), style)}\n"


def parse_side(text: str) -> str | None:
    """The mark on the first ``<|symbol|>`` / ``<|player|>`` line, if any."""
    m = _SIDE_RE.search(text)
    return None if m is None else m.group(1)


# ---------------------------------------------------------------- move judging


def move_quality(board: Board, index: int | None, player: str | None = None) -> float:
    """The documented move-quality score for ``player`` (default: side to move).

    -1.0 for a non-cell, an occupied cell or a finished game; else 1.0 if the
    move wins at once; else 0.8 if it takes a cell where the opponent threatened
    to win next move; else centre 0.6, corner 0.4, edge 0.2. Only the chosen
    cell is judged, as in the original: blocking while a win was available is
    still a block (0.8, not 1.0); against two threats, blocking either one is a
    block (0.8) although the game is lost; ignoring a threat scores by position.
    """
    if not isinstance(index, int) or isinstance(index, bool) or index not in legal_moves(board):
        return INVALID
    return QUALITY[move_kind(board, index, player)]


def move_quality_reward(prompt: str, completion: str) -> float:
    """Reward ``(prompt, completion) -> float`` for any single-turn env or GRPO dataset.

    Board from the prompt's board block; side from its ``<|symbol|>`` /
    ``<|player|>`` line, else from the piece counts; move from the completion
    (``parse_move``). Anything unparsable scores -1.0.
    """
    board = parse_board_block(prompt)
    move = parse_move(completion)
    if board is None or move is None:
        return INVALID
    return move_quality(board, move, parse_side(prompt) or to_move(board))


# ---------------------------------------------------------------- thoughts

_TEMPLATES = {
    "win": ("I am {me} and {move} completes the {line}. That wins the game, so I take it.",
            "Two of my marks already sit on the {line} and {move} is still free: playing there wins now.",
            "First question: can I win this turn? Yes, {move} finishes the {line} for {me}.",
            "The {line} needs one more {me}. {move} ends the game in my favour."),
    "block": ("{opp} has two marks on the {line} and wins at {move} next turn unless I block it.",
            "If I leave {move} open, {opp} completes the {line}. I have to take that cell.",
            "Danger on the {line}: {opp} threatens {move}, so I put my {me} there.",
            "Playing as {me}, my first duty here is defence: {move} stops {opp} on the {line}."),
    "centre": ("The centre {move} lies on four lines; holding it gives {me} the most options.",
            "I'll take the middle square {move}: it supports both diagonals, the middle row and the middle column.",
            "As {me}, I want the centre. {move} is free and every plan of {opp} runs through it."),
    "corner": ("Corner {move} sits on a row, a column and a diagonal, which is useful for {me}.",
            "I'll take the corner at {move}; corners can set up two threats at once.",
            "Playing as {me}, {move} is a solid corner that also limits what {opp} can build."),
    "edge": ("The edge cell {move} lies on a row and a column; it is the right square in this position.",
            "I'll play the side square {move}, which works with the lines through it.",
            "As {me}, I choose {move}. An edge is modest in general, but here it keeps my position sound."),
}


def think_text(board: Board, index: int, rng: random.Random, player: str | None = None) -> str:
    """A templated ``<player_think>...</player_think>`` for playing ``index`` (move kind decides the template)."""
    me = player or to_move(board)
    kind = move_kind(board, index, me)
    line = completed_line(board, index, me if kind == "win" else other(me))
    text = rng.choice(_TEMPLATES[kind]).format(
        me=me, opp=other(me), move=cell_name(index), line=_LINE_NAMES[line] if line is not None else "")
    return f"{THINK_OPEN}{text}{THINK_CLOSE}"


# ---------------------------------------------------------------- positions and labels


def solver_move(board: Board, rng: random.Random) -> int:
    """A perfect move: fastest win / slowest loss; ties broken with ``rng``."""
    return rng.choice(best_moves(board))


def worse_move(board: Board, chosen: int, rng: random.Random) -> int | None:
    """A legal move with a strictly lower solver score than ``chosen``, preferring
    one that changes the game-theoretic outcome; None if every move is as good."""
    scores = solve(board)
    worse = [m for m in sorted(scores) if scores[m] < scores[chosen]]
    sign = lambda s: (s > 0) - (s < 0)  # noqa: E731
    flips = [m for m in worse if sign(scores[m]) != sign(scores[chosen])]
    return rng.choice(flips or worse) if worse else None


def sample_positions(n: int, rng: random.Random, keep: Callable[[Board], bool] | None = None) -> list[Board]:
    """``n`` distinct non-terminal positions from random legal play of 0-8 plies.

    Positions failing ``keep`` are skipped. Raises ValueError if fewer than
    ``n`` such positions exist (or are found within a generous attempt budget).
    """
    available = sum(1 for b in all_positions() if keep is None or keep(b))
    if not 0 <= n <= available:
        raise ValueError(f"n must be in 0..{available} (distinct positions available), got {n}")
    seen: set[Board] = set()
    out: list[Board] = []
    for _ in range(10_000 + 500 * n):
        if len(out) == n:
            break
        board = EMPTY_BOARD
        for _ in range(rng.randint(0, 8)):
            board = board if is_over(board) else play(board, rng.choice(legal_moves(board)))
        if not is_over(board) and board not in seen:
            seen.add(board)
            out += [board] if keep is None or keep(board) else []
    if len(out) == n:
        return out
    raise ValueError(f"found only {len(out)} of {n} distinct positions by random play; ask for fewer")


def _check_think(think: str) -> None:
    if think not in THINK_MODES:
        raise ValueError(f"unknown think mode {think!r}; use one of {THINK_MODES}")


def _answer(board: Board, move: int, think: str, rng: random.Random) -> str:
    if think == "none":
        return move_text(move)
    return f"{think_text(board, move, rng)}\n{move_text(move)}"


# ---------------------------------------------------------------- generators


def make_sft_records(n: int, think: str = "template", seed: int = 0, *, prompt_style: str = "player") -> list[dict]:
    """``{"text": prompt + (thought line) + move}`` for ``n`` sampled positions."""
    _check_think(think)
    rng = random.Random(seed)
    return [{"text": make_prompt(b, prompt_style) + _answer(b, solver_move(b, rng), think, rng)}
            for b in sample_positions(n, rng)]


def make_dpo_records(n: int, think: str = "template", seed: int = 0, *, prompt_style: str = "player") -> list[dict]:
    """``{"prompt", "chosen", "rejected"}``: solver move vs a strictly worse legal move.

    Positions where every move is equally good are skipped.
    """
    _check_think(think)
    rng = random.Random(seed)
    out = []
    for b in sample_positions(n, rng, keep=lambda b: len(set(solve(b).values())) > 1):
        chosen = solver_move(b, rng)
        rejected = worse_move(b, chosen, rng)
        assert rejected is not None and rejected != chosen
        out.append({"prompt": make_prompt(b, prompt_style), "chosen": _answer(b, chosen, think, rng),
                    "rejected": _answer(b, rejected, think, rng)})
    return out


def make_grpo_records(n: int, seed: int = 0, prompt_style: str = "minimax") -> list[dict]:
    """``{"prompt", "completion"}``; the prompt ends right before the move.

    ``minimax``: prompt ends with ``\\n<|move|><|``, completion ``r-c|><|end|>``.
    ``player``: prompt ends with ``<|player|>X\\n``, completion ``<|move|><|r-c|><|end|>``.
    The completion is the solver's reference answer (GRPO trainers may ignore it).
    """
    rng = random.Random(seed)
    out = []
    for b in sample_positions(n, rng):
        prompt, answer = make_prompt(b, prompt_style), move_text(solver_move(b, rng))
        if prompt_style == "minimax":
            prompt, answer = prompt + MOVE_PREFIX, answer[len(MOVE_PREFIX):]
        out.append({"prompt": prompt, "completion": answer})
    return out


def make_minimax_records(seed: int = 0) -> list[dict]:
    """``{"text"}`` for every reachable non-terminal position, labelled with a fastest-win move."""
    rng = random.Random(seed)
    return [{"text": make_prompt(b, "minimax") + move_text(solver_move(b, rng))} for b in all_positions()]


# ---------------------------------------------------------------- readers


def _position_problem(field: str, text: str) -> tuple[Board, str | None]:
    """(board, None) for a playable position with a consistent side line, else (_, message)."""
    board = parse_board_block(text)
    if board is None:
        return EMPTY_BOARD, f"field {field!r}: no board block with 3 rows of <|r-c|><|V|> cells"
    x, o = board.count("X"), board.count("O")
    if x - o not in (0, 1):
        return board, f"field {field!r}: impossible board (X={x}, O={o})"
    if is_over(board):
        return board, f"field {field!r}: the board is already finished"
    side = parse_side(text)
    if side is not None and side != to_move(board):
        return board, f"field {field!r}: side line says {side} but {to_move(board)} is to move"
    return board, None


def _move_problem(field: str, text: str, board: Board) -> str | None:
    move = parse_move(text)
    if move is None:
        return f"field {field!r}: no move <|move|><|r-c|><|end|> (r, c in 0-2)"
    if board[move] != EMPTY:
        return f"field {field!r}: move {cell_name(move)} is on an occupied cell"
    if text.count(THINK_OPEN) != text.count(THINK_CLOSE):
        return f"field {field!r}: unbalanced {THINK_OPEN}...{THINK_CLOSE}"
    return None


def _validate_text(record: dict) -> str | None:
    board, problem = _position_problem("text", record["text"])
    return problem or _move_problem("text", record["text"].split(BOARD_END, 1)[1], board)


def _validate_dpo(record: dict) -> str | None:
    board, problem = _position_problem("prompt", record["prompt"])
    problem = problem or _move_problem("chosen", record["chosen"], board) \
        or _move_problem("rejected", record["rejected"], board)
    if problem is None and parse_move(record["chosen"]) == parse_move(record["rejected"]):
        return "field 'rejected': same move as 'chosen'"
    return problem


def _validate_grpo(record: dict) -> str | None:
    board, problem = _position_problem("prompt", record["prompt"])
    return problem or _move_problem("completion", record["completion"], board)


def _validate_minimax(record: dict) -> str | None:
    return "field 'text': missing <|symbol|> line" if "<|symbol|>" not in record["text"] else _validate_text(record)


def read_sft(path: str | Path) -> list[dict]:
    """SFT records ``{"text"}``; each text must hold a playable board and a legal move."""
    return read_jsonl(path, {"text": str}, validate=_validate_text)


def read_dpo(path: str | Path) -> list[dict]:
    """DPO records ``{"prompt", "chosen", "rejected"}`` with two different legal moves."""
    return read_jsonl(path, {"prompt": str, "chosen": str, "rejected": str}, validate=_validate_dpo)


def read_grpo(path: str | Path) -> list[dict]:
    """GRPO records ``{"prompt", "completion"}``; the completion must hold a legal move."""
    return read_jsonl(path, {"prompt": str, "completion": str}, validate=_validate_grpo)


def read_minimax(path: str | Path) -> list[dict]:
    """Minimax records ``{"text"}`` (the ``<|symbol|>`` line is required)."""
    return read_jsonl(path, {"text": str}, validate=_validate_minimax)


# ---------------------------------------------------------------- CLI


def default_output(kind: str, think: str = "template", now: datetime | None = None) -> str:
    """File names of the original: ``tictactoe_sft_template.jsonl``, ``tictactoe_minimax_<ts>.jsonl``..."""
    if kind in ("sft", "dpo"):
        return f"tictactoe_{kind}_{'nothink' if think == 'none' else think}.jsonl"
    if kind == "grpo":
        return "tictactoe_grpo.jsonl"
    return f"tictactoe_minimax_{(now or datetime.now()).strftime('%Y%m%d_%H%M%S')}.jsonl"


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="ludic datagen thinktactoe",
                                description="Write a ThinkTacToe SFT / DPO / GRPO / minimax JSONL dataset.")
    p.add_argument("--kind", choices=KINDS, required=True)
    p.add_argument("--n", type=int, default=None,
                   help="number of records (default: sft 2000, dpo 1000, grpo 2000; minimax: all 4520)")
    p.add_argument("--think", choices=THINK_MODES, default="template", help="thought line (sft, dpo)")
    p.add_argument("--prompt-style", choices=PROMPT_STYLES, default=None,
                   help="side-to-move dialect (default: player for sft/dpo, minimax for grpo)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--output", default=None, help="output path (default: the original's file name)")
    args = p.parse_args(argv)
    if args.kind == "minimax" and (args.n is not None or args.prompt_style not in (None, "minimax")):
        p.error("--kind minimax writes every position in the minimax style; drop --n / --prompt-style")
    n = args.n if args.n is not None else {"dpo": 1000}.get(args.kind, 2000)
    style = args.prompt_style or ("minimax" if args.kind == "grpo" else "player")
    try:
        records = (make_sft_records(n, args.think, args.seed, prompt_style=style) if args.kind == "sft" else
                   make_dpo_records(n, args.think, args.seed, prompt_style=style) if args.kind == "dpo" else
                   make_grpo_records(n, args.seed, prompt_style=style) if args.kind == "grpo" else
                   make_minimax_records(args.seed))
    except ValueError as e:
        p.error(str(e))
    path = write_jsonl(args.output or default_output(args.kind, args.think), records)
    print(f"wrote {len(records)} {args.kind} records to {path}")


if __name__ == "__main__":
    main()
