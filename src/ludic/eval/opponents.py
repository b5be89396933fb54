"""Opponents a two-player policy did not train against, and wins by forfeit told apart from wins in play.

A policy trained against one opponent (a frozen copy of its start) and evaluated against that same opponent
shows what it learned about that opponent, not about the game. ``ludic train env`` evaluates a multi-player env
against each opponent here that the game allows:

- ``frozen``: the frozen starting policy (the training opponent under ``--opponent frozen``);
- ``random``: a uniformly random legal player (``random_legal_reply``), where the observation lists the legal
  moves (TextArena's "available actions/moves: '[a]', '[b]'", OpenSpiel's "Legal Actions:" lines); its choice is a
  function of the observation and a seed, so an evaluation does not depend on the order episodes run in;
- ``bot``: the game package's own search bot, where it has one (OpenSpiel's MCTS: ``bot_spec``); TextArena ships
  none;
- ``league``: a snapshot of the policy taken halfway through training, which no training episode faced under
  ``--opponent frozen`` (under self-play only at its own step).

``won_by_forfeit`` tells a win by the opponent's invalid move or forfeit from a win in play; evaluation summaries
report both.
"""

from __future__ import annotations

import hashlib
import random
import re
from typing import Any, Callable

from ludic.types import Rollout

OPPONENTS = ("frozen", "random", "bot", "league")
_AVAILABLE = re.compile(r"(?:available|possible|valid) (?:actions|moves)[^:\n]*:\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_BRACKETED = re.compile(r"'(\[[^\]\n]+\])'")
_LEGAL_LINE = re.compile(r"^(\S+) -> ", re.MULTILINE)


def legal_moves(observation: str) -> list[str] | None:
    """The legal moves an observation lists (the last such list: TextArena's "available/possible/valid actions:
    '[a]', '[b]'", OpenSpiel's "Legal Actions:" lines), as replies; None when it lists none."""
    found = _AVAILABLE.findall(observation)
    if found:
        moves = _BRACKETED.findall(found[-1])
        if moves:
            return moves
    if "Legal Actions:" in observation:
        moves = _LEGAL_LINE.findall(observation.rsplit("Legal Actions:", 1)[1])
        if moves:
            return moves
    return None


def random_legal_reply(seed: int = 0) -> Callable[[list[dict]], str]:
    """``messages -> reply`` of a uniformly random legal player: one of the moves the last observation lists,
    drawn from an RNG seeded by the observation text and ``seed`` (the same position gets the same draw
    whatever else runs); "" when the observation lists no move."""

    def reply(messages: list[dict]) -> str:
        text = next((str(m["content"]) for m in reversed(messages) if m["role"] == "user"), "")
        moves = legal_moves(text)
        if not moves:
            return ""
        digest = hashlib.sha256(f"{seed}\n{text}".encode()).digest()
        rng = random.Random(int.from_bytes(digest[:8], "big"))
        move = rng.choice(moves)  # an amount left to the player ('[bet X]'): a small one at random
        return re.sub(r"\bX\b", str(rng.randint(1, 3)), move)

    return reply


def bot_spec(kind: str, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Env kwargs under which the game package's own bot plays every seat but the agent's (one agent, its seat
    alternating with the seed), or None when the package has no bot: OpenSpiel's MCTS."""
    if kind == "openspiel":
        return {**kwargs, "seats": "seed", "opponent": "mcts"}
    return None


def won_by_forfeit(r: Rollout) -> bool:
    """Whether the episode's win came from the opponent's invalid move or forfeit: the last step's info says
    ``opponent_invalid`` (TextArena), ``opponent_illegal`` (tic-tac-toe), or a ``forfeit`` by another agent
    (OpenSpiel)."""
    if not r.steps:
        return False
    info = r.steps[-1].info
    forfeit = info.get("forfeit")
    return bool(info.get("opponent_invalid") or info.get("opponent_illegal")
                or (forfeit and forfeit != r.meta.get("agent_id")))
