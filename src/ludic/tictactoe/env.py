"""Tic-tac-toe envs on ``ludic.tictactoe.board``.

* ``TicTacToeEnv``: one agent against a built-in bot (random, minimax, mixed).
* ``TicTacToeGame``: two players ``"X"`` and ``"O"`` for self-play.

Both judge a move the same way (``judge_move``: legal, optimal by the solver) and render the same
observation (``format_observation``); terminal rewards come from ``Rewards``.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from ludic.envs.base import LudicEnv, SingleAgentEnv
from ludic.tictactoe.board import (Board, EMPTY, EMPTY_BOARD, Opponent, TICTACTOE_RULES, coord, is_full, is_over,
                                   legal_moves, make_opponent, optimal_moves, other, parse_coord, play,
                                   render_board, to_move, winner)
from ludic.types import JSON, StepOutcome


# ---------------------------------------------------------------- shared env code

_STATUS = {
    "win": "Game over: you won.",
    "loss": "Game over: you lost.",
    "draw": "Game over: draw.",
    "illegal": "Game over: you made an illegal move and lost.",
    "opponent_illegal": "Game over: your opponent made an illegal move, so you won.",
}


@dataclass(frozen=True)
class Rewards:
    """Terminal rewards by result; non-terminal steps give 0."""

    win: float = 1.0
    draw: float = 0.5
    loss: float = 0.0
    illegal: float = -1.0

    def __call__(self, result: str | None) -> float:
        """Reward for a result of ``result_for`` (or ``"illegal"``); None (game on) gives 0."""
        if result is None:
            return 0.0
        return float(getattr(self, result))


def result_for(board: Board, mark: str) -> str | None:
    """``"win"``, ``"loss"`` or ``"draw"`` for ``mark`` if the game is over, else None."""
    w = winner(board)
    if w is not None:
        return "win" if w == mark else "loss"
    return "draw" if is_full(board) else None


def format_observation(
    board: Board, mark: str, note: str | None, status: str | None, compact: bool = False,
    show_moves: bool = True,
) -> str:
    """Observation text for ``mark``: optional note line, the board, then either
    the available moves (``show_moves``) and "Your move." (``status`` None) or ``status``."""
    lines = [note] if note else []
    lines += ["Board:", render_board(board, compact)]
    if status is None:
        if show_moves:
            lines.append("Available moves: " + ", ".join(coord(m) for m in legal_moves(board)))
        lines.append(f"You are {mark}. Your move.")
    else:
        lines.append(f"You are {mark}. {status}")
    return "\n".join(lines)


def opponent_note(mark: str, reply: int | None) -> str | None:
    """The note line that tells ``mark`` where its opponent just played (None for no move)."""
    return None if reply is None else f"Opponent ({other(mark)}) played {coord(reply)}."


def _illegal_note(action: str) -> str:
    move = parse_coord(action)
    if move is None:
        return f"Illegal move {action!r}: not a cell name like B2."
    return f"Illegal move {action!r}: {coord(move)} is already taken."


def judge_move(board: Board, action: str, tally: list[int]) -> tuple[int | None, JSON]:
    """Check one player's move on ``board`` before it is played.

    Returns the cell index (None if the move is illegal) and the step info
    ``agent_move`` (coordinate, or the raw text if illegal), ``optimal_move``,
    ``illegal_move``, ``num_agent_moves`` and ``num_optimal_moves``; the last
    two are running totals kept in ``tally = [moves, optimal moves]``, updated
    in place (an illegal move counts as a non-optimal move).
    """
    move = parse_coord(action)
    if move is not None and board[move] != EMPTY:
        move = None
    optimal = move is not None and move in optimal_moves(board)
    tally[0] += 1
    tally[1] += optimal
    info: JSON = {
        "agent_move": action if move is None else coord(move),
        "optimal_move": optimal,
        "illegal_move": move is None,
        "num_agent_moves": tally[0],
        "num_optimal_moves": tally[1],
    }
    return move, info


# ---------------------------------------------------------------- envs


class TicTacToeEnv(SingleAgentEnv):
    """One agent against a built-in bot; one step = agent move + bot reply.

    Args:
        agent_starts: agent plays X (True) or O (False); None samples 50/50
            from the episode RNG at each reset.
        opponent: ``"random"``, ``"minimax"`` or ``"mixed"``; a callable
            ``(board, rng) -> index`` is also accepted (not serialisable).
        epsilon: random-move probability of the ``"mixed"`` bot.
        win_reward, draw_reward, loss_reward, illegal_reward: terminal rewards.
        show_opponent_move: start observations with "Opponent (O) played B2."
        compact: render the board as a small labelled grid (fewer prompt tokens).
        show_moves: list the available moves under the board.
        agent_id: the agent's role name.
    """

    def __init__(
        self,
        *,
        agent_starts: bool | None = None,
        opponent: str | Opponent = "random",
        epsilon: float = 0.2,
        win_reward: float = 1.0,
        draw_reward: float = 0.5,
        loss_reward: float = 0.0,
        illegal_reward: float = -1.0,
        show_opponent_move: bool = True,
        compact: bool = False,
        show_moves: bool = True,
        agent_id: str = "agent_0",
    ) -> None:
        super().__init__(agent_id)
        self.compact = compact
        self.show_moves = show_moves
        self.agent_starts = agent_starts
        if isinstance(opponent, str):
            self.opponent_name, self._opponent = opponent, make_opponent(opponent, epsilon)
        else:
            self.opponent_name, self._opponent = getattr(opponent, "__name__", "custom"), opponent
        self.rewards = Rewards(win_reward, draw_reward, loss_reward, illegal_reward)
        self.show_opponent_move = show_opponent_move
        self._rng = random.Random(0)
        self._board: Board | None = None
        self.mark = "X"
        self._tally = [0, 0]

    @property
    def board(self) -> Board:
        """Current board (after ``reset``)."""
        if self._board is None:
            raise RuntimeError("TicTacToeEnv: call reset() first")
        return self._board

    @property
    def suggested_sysprompt(self) -> str:
        return TICTACTOE_RULES

    def _obs(self, reply: int | None, status: str | None) -> str:
        note = opponent_note(self.mark, reply) if self.show_opponent_move else None
        return format_observation(self.board, self.mark, note, status, self.compact, self.show_moves)

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        self._rng = random.Random(seed)
        starts = self._rng.random() < 0.5 if self.agent_starts is None else bool(self.agent_starts)
        self.mark = "X" if starts else "O"
        self._board, self._tally, opening = EMPTY_BOARD, [0, 0], None
        if not starts:
            opening = self._opponent(self._board, self._rng)
            self._board = play(self._board, opening)
        info = {
            "agent_mark": self.mark,
            "opponent_mark": other(self.mark),
            "agent_starts": starts,
            "opponent": self.opponent_name,
            "opponent_move": None if opening is None else coord(opening),
        }
        return self._obs(opening, None), info

    def env_step(self, action: str) -> StepOutcome:
        move, info = judge_move(self.board, action, self._tally)
        info["opponent_move"] = None
        if move is None:
            info["result"] = "illegal"
            note, status = _illegal_note(action), _STATUS["illegal"]
            obs = format_observation(self.board, self.mark, note, status, self.compact, self.show_moves)
            return StepOutcome(obs, self.rewards("illegal"), terminated=True, info=info)
        self._board = play(self.board, move)
        reply, result = None, result_for(self.board, self.mark)
        if result is None:
            reply = self._opponent(self.board, self._rng)
            self._board = play(self.board, reply)
            result = result_for(self.board, self.mark)
            info["opponent_move"] = coord(reply)
        if result is not None:
            info["result"] = result
        obs = self._obs(reply, None if result is None else _STATUS[result])
        return StepOutcome(obs, self.rewards(result), terminated=result is not None, info=info)


class TicTacToeGame(LudicEnv):
    """Two-player tic-tac-toe for self-play; agent ids ``"X"`` and ``"O"``.

    ``step({mover: action})`` returns an outcome for both players: the mover
    gets the ``judge_move`` info plus ``agent_mark``; the other player gets
    ``opponent_move`` and the new board (its turn). Terminal rewards go to
    both (win/loss/draw). An illegal move ends the game: the mover gets
    ``illegal_reward`` (result ``"illegal"``), the other player wins by
    forfeit: ``win_reward``, result ``"win"`` and info ``opponent_illegal:
    True`` (so metrics can tell a forfeit from a win on the board).

    Args: the rewards and ``compact`` as for ``TicTacToeEnv``;
    ``show_opponent_move`` starts a player's observation with "Opponent (X)
    played B2." (off: the same observations ``TicTacToeEnv`` gives with it off).
    """

    AGENT_IDS = ("X", "O")

    def __init__(
        self,
        *,
        win_reward: float = 1.0,
        draw_reward: float = 0.5,
        loss_reward: float = 0.0,
        illegal_reward: float = -1.0,
        compact: bool = False,
        show_opponent_move: bool = True,
        show_moves: bool = True,
    ) -> None:
        self.rewards = Rewards(win_reward, draw_reward, loss_reward, illegal_reward)
        self.compact = compact
        self.show_opponent_move = show_opponent_move
        self.show_moves = show_moves
        self.board: Board = EMPTY_BOARD
        self._last: int | None = None
        self._illegal: tuple[str, str] | None = None  # (mark, raw action)
        self._tallies: dict[str, list[int]] = {m: [0, 0] for m in self.AGENT_IDS}

    @property
    def agent_ids(self) -> list[str]:
        return list(self.AGENT_IDS)

    @property
    def active_agents(self) -> list[str]:
        return [] if self.over else [to_move(self.board)]

    @property
    def over(self) -> bool:
        """True once someone won, the board is full, or a move was illegal."""
        return self._illegal is not None or is_over(self.board)

    @property
    def suggested_sysprompt(self) -> str:
        return TICTACTOE_RULES

    def _result(self, mark: str) -> str | None:
        if self._illegal is not None:
            return "illegal" if self._illegal[0] == mark else "win"  # a forfeit is a win
        return result_for(self.board, mark)

    def _forfeit_win(self, mark: str) -> bool:
        """True when ``mark`` won because the other player moved illegally."""
        return self._illegal is not None and self._illegal[0] != mark

    def observe(self, agent_id: str) -> str:
        if agent_id not in self.AGENT_IDS:
            raise KeyError(f"unknown player {agent_id!r}; players are 'X' and 'O'")
        note = None
        if self._illegal is not None:
            mark, action = self._illegal
            note = (_illegal_note(action) if mark == agent_id
                    else f"Opponent ({mark}) made an illegal move {action!r}.")
        elif self.show_opponent_move and self._last is not None and self.board[self._last] != agent_id:
            note = f"Opponent ({other(agent_id)}) played {coord(self._last)}."
        result = self._result(agent_id)
        if result is not None:
            status = _STATUS["opponent_illegal" if self._forfeit_win(agent_id) else result]
        else:
            status = None if to_move(self.board) == agent_id else f"Waiting for {other(agent_id)}."
        return format_observation(self.board, agent_id, note, status, self.compact, self.show_moves)

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, JSON]]:
        """Start from the empty board (the game is deterministic; ``seed`` is unused)."""
        self.board, self._last, self._illegal = EMPTY_BOARD, None, None
        self._tallies = {m: [0, 0] for m in self.AGENT_IDS}
        info = {m: {"agent_mark": m, "opponent_mark": other(m), "agent_starts": m == "X"}
                for m in self.AGENT_IDS}
        return {m: (self.observe(m), info[m]) for m in self.AGENT_IDS}

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self.over:
            raise RuntimeError("TicTacToeGame.step() called after the game ended")
        mover = to_move(self.board)
        if set(actions) != {mover}:
            raise ValueError(f"expected an action for {mover!r} only, got {sorted(actions)}")
        move, mover_info = judge_move(self.board, actions[mover], self._tallies[mover])
        if move is None:
            self._illegal = (mover, actions[mover])
        else:
            self.board, self._last = play(self.board, move), move
        mover_info["agent_mark"] = mover
        infos = {mover: mover_info, other(mover): {"opponent_move": mover_info["agent_move"]}}
        out = {}
        for mark, info in infos.items():
            result = self._result(mark)
            if result is not None:
                info["result"] = result
            if self._forfeit_win(mark):
                info["opponent_illegal"] = True
            out[mark] = StepOutcome(
                self.observe(mark), self.rewards(result), terminated=result is not None, info=info
            )
        return out
