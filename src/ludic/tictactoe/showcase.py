"""Games a recipe's policy played, move by move, for its report (``games.jsonl``, drawn by ``ludic.report``).

A greedy policy with history-free prompts (ctx ``last``) is a function of the board, and the exact evaluation
(``exact.exact_eval``) records its answer on every board it met against the opponent, in every branch
(``decisions_<stage>_<opponent>.jsonl``). So a game against that opponent replays from those records: the policy's
move is the one it gave there, the opponent's comes from the bot itself (``board.make_opponent``, seeded
tie-breaks). No model call is made, and the games shown are the very decisions the stage's numbers count.

    games = play_recorded_games(decisions, "minimax", seats=("X", "O"), games_per_seat=3)
    write_games(run_dir, ["base", "sft", "rl"])      # games.jsonl
    games_markdown(run_dir)                          # report.md's text on them
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any, Iterable

from ludic.tictactoe.board import EMPTY_BOARD, Board, coord, is_over, make_opponent, play, to_move, winner
from ludic.tictactoe.positions import board_to_string

GAMES_PER_SEAT = 3
"""Distinct games kept per seat (minimax's tie-breaks, seeded 0, 1, ..., tell them apart)."""
MAX_SEEDS = 12
"""Tie-break seeds tried per seat to find those distinct games."""


def _rows(board: Board) -> list[str]:
    cells = board_to_string(board)
    return [cells[i:i + 3] for i in (0, 3, 6)]


def play_recorded_game(decisions: dict[str, dict[str, Any]], seat: str, opponent: str, seed: int) -> dict[str, Any]:
    """One game of the recorded greedy policy (``decisions``: board string -> ``exact.Decision.to_dict()``) in
    ``seat`` against ``opponent``, whose tie-breaks draw from ``random.Random(seed)``. The policy forfeits on an
    unparsable reply (``parse_error``) or an illegal move (``illegal``), as in the evaluation; ``unrecorded``:
    a board the records lack (records of another opponent)."""
    bot, rng, board = make_opponent(opponent), random.Random(seed), EMPTY_BOARD
    moves: list[dict[str, Any]] = []
    outcome = ""
    while not is_over(board):
        mark = to_move(board)
        if mark != seat:
            cell = bot(board, rng)
            board = play(board, cell)
            moves.append({"mark": mark, "player": opponent, "cell": coord(cell), "board": _rows(board)})
            continue
        d = decisions.get(board_to_string(board))
        if d is None:
            outcome = "unrecorded"
            break
        move = {"mark": mark, "player": "policy", "reply": d.get("completion", ""),
                "value_preserving": bool(d.get("value_preserving")), "optimal": bool(d.get("optimal"))}
        if d.get("move") is None:
            outcome = "parse_error" if d.get("action") is None else "illegal"
            moves.append({**move, "cell": None, "board": _rows(board), "note": outcome})
            break
        board = play(board, int(d["move"]))
        moves.append({**move, "cell": coord(int(d["move"])), "board": _rows(board)})
    if not outcome:
        w = winner(board)
        outcome = "draw" if w is None else "win" if w == seat else "loss"
    return {"seat": seat, "opponent": opponent, "seed": seed, "outcome": outcome, "moves": moves}


def play_recorded_games(decisions: Iterable[dict[str, Any]], opponent: str = "minimax", seats: tuple[str, ...] = ("X", "O"),
                        games_per_seat: int = GAMES_PER_SEAT) -> list[dict[str, Any]]:
    """Up to ``games_per_seat`` distinct games per seat (fewer when the opponent's tie-breaks allow fewer)."""
    by_board = {d["board"]: d for d in decisions}
    games: list[dict[str, Any]] = []
    for seat in seats:
        seen: set[str] = set()
        for seed in range(MAX_SEEDS):
            g = play_recorded_game(by_board, seat, opponent, seed)
            cells = " ".join(str(m["cell"]) for m in g["moves"])
            if cells not in seen:
                seen.add(cells)
                games.append(g)
            if len(seen) == games_per_seat:
                break
    return games


def write_games(run_dir: Path, stages: Iterable[str], opponent: str = "minimax") -> list[dict[str, Any]]:
    """``games.jsonl``: each stage's games against ``opponent`` (both seats), replayed from its
    ``decisions_<stage>_<opponent>.jsonl``; the last stage is the final policy. Returns the games written."""
    games = []
    for stage in stages:
        path = run_dir / f"decisions_{stage}_{opponent}.jsonl"
        if path.exists():
            records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
            games += [{"stage": stage, **g} for g in play_recorded_games(records, opponent)]
    (run_dir / "games.jsonl").write_text("".join(json.dumps(g) + "\n" for g in games))
    return games


def games_markdown(run_dir: Path) -> str:
    """report.md's lines for the final stage's games (``games.jsonl``): the moves in order and the outcome."""
    path = run_dir / "games.jsonl"
    games = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    if not games:
        return ""
    last = games[-1]["stage"]
    lines = [f"- as {g['seat']}: " + ", ".join(f"{m['mark']} {m['cell'] or m.get('note', '?')}" for m in g["moves"])
             + f" -> **{g['outcome']}**" for g in games if g["stage"] == last]
    return (f"\nGames of the final policy ({last}) against {games[-1]['opponent']} (games.jsonl; report.html draws "
            "them move by move):\n\n" + "\n".join(lines) + "\n")
