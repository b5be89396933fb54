"""TextArena games as Ludic envs: ``EnvSpec("textarena:GuessTheNumber-v0")`` or ``TextArenaEnv(game_id)``.

Any registered TextArena id works (``textarena.make(id)``, with the id's own wrappers: the default ids
show each player the whole game so far as one text and accept ``[move]`` answers). TextArena player
``k`` is the Ludic agent ``player_k``; ``seats`` picks which players Ludic's agents play:

    seats="all"     every player is an agent: self-play (one client for all), or a trained seat
                    against a frozen one (``MultiAgentProtocol(frozen=...)``, a league snapshot)
    seats=[0]       only player 0 is an agent; ``opponent`` plays the others
    seats="seed"    one agent ``agent_0`` whose player alternates with the reset seed (seed % players)

``observations`` picks how an agent sees the game. ``"full"`` (the default, TextArena's own view): every
turn the whole game so far as one text, kept alone (``preferred_context = "last"``), so each turn's prompt
is a new text and trains as an item of its own, the history read again every turn. ``"new"``: the first
turn the whole text, then only what the game added since the agent's last turn (the opponent's move, the
game's answer), in a growing dialog (``preferred_context = "full"``); every turn's prompt then extends the
last token for token and the episode trains as one sequence (``rollouts.batch``): on GuessTheNumber
games of 5.7 turns 3.65x fewer training tokens (``benchmarks/bench_multiturn.py --workload textarena``). Where a game rewrites its text (the new text does not extend the old), that turn
gets the whole text again.

The game's own rules stay: its invalid-move handling (an error allowance, or a loss), its turn limit
and its rewards. A player's reward arrives when the game ends (``env.close()``), as TextArena reports
it (1 win, -1 loss, 0 draw in two-player games; a score in single-player ones, 1 when solved, partial
credit below). ``info["outcome"]`` is ``win`` / ``loss`` / ``draw`` (by the sign in multi-player games;
``win`` only for a full score alone), and ``info["success"]`` is 1 for a win. A game the ``opponent``
ends before an agent's first turn (it moves first and forfeits) ends in ``reset``: ``ended_at_reset``
carries each agent's outcome, which the protocol records as a no-turn step. A
TextArena exception is raised to the protocol, which records a failed rollout (the run goes on).

Needs ``pip install 'ludic[envs]'`` (or ``textarena``). Games that need extra data (NLTK word lists:
Hangman, Wordle, Crosswords, ...) fetch it on first use and fail offline; their error says so.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from ludic.envs.base import LudicEnv
from ludic.types import JSON, StepOutcome

Opponent = Callable[[int, str], str]
"""``(player_id, observation) -> answer`` for a player no Ludic agent plays."""

_PLAYERS: dict[str, int] = {}
"""Game id -> the number of players it was found to accept (found once per process)."""


def _observation_text(obs: Any) -> str:
    """TextArena's observation: a string (the default wrappers) or a list of (from, message, type)."""
    if isinstance(obs, str):
        return obs.strip()
    return "\n".join(str(m[1]) if isinstance(m, (tuple, list)) else str(m) for m in obs).strip()


def _make(game_id: str, env_kwargs: dict[str, Any]) -> Any:
    try:
        import textarena as ta
    except ImportError as e:
        raise ImportError("the TextArena adapter needs the textarena package: pip install 'ludic[envs]'") from e
    from textarena.envs.registration import ENV_REGISTRY

    if game_id not in ENV_REGISTRY:
        near = sorted(k for k in ENV_REGISTRY if game_id.split("-")[0].lower() in k.lower())[:10]
        raise ValueError(f"TextArena has no game {game_id!r}" + (f"; similar ids: {near}" if near else ""))
    return ta.make(game_id, **env_kwargs)


def _players(game_id: str, env_kwargs: dict[str, Any]) -> int:
    """The smallest player count the game accepts (1 or 2 tried; give ``num_players`` for others)."""
    if game_id not in _PLAYERS:
        errors = []
        for n in (1, 2):
            try:
                _make(game_id, env_kwargs).reset(num_players=n, seed=0)
            except Exception as e:  # noqa: BLE001 - the game says it wants another count
                errors.append(f"{n}: {type(e).__name__}: {e}")
                continue
            _PLAYERS[game_id] = n
            break
        else:
            raise ValueError(f"TextArena game {game_id!r} accepts neither 1 nor 2 players ({'; '.join(errors)}); "
                             "pass num_players=")
    return _PLAYERS[game_id]


class TextArenaEnv(LudicEnv):
    """One TextArena game per episode (see the module docstring).

    Args:
        game_id: a TextArena id, e.g. ``"TicTacToe-v0"``, ``"GuessTheNumber-v0"``.
        seats: ``"all"``, ``"seed"``, or the player numbers Ludic's agents play.
        num_players: players in the game (default: the smallest count it accepts, 1 or 2).
        opponent: plays every player no agent plays: ``(player_id, observation) -> answer``.
        env_kwargs: passed to ``textarena.make`` (the game's options, e.g. ``{"max_rounds": 1}``).
        **game_kwargs: more game options, the same as ``env_kwargs`` and taking precedence: an env spec's
            ``{"max_rounds": 1}`` reaches the game.
        max_turns: the protocol's turn limit for requests that set none (``LudicEnv.max_turns``); the
            game's own limit usually ends it first.
        observations: ``"full"`` (the whole game each turn) or ``"new"`` (what it added since the agent's
            last turn, in a dialog); the module docstring.
    """

    def __init__(self, game_id: str, *, seats: str | Sequence[int] = "all", num_players: int | None = None,
                 opponent: Opponent | None = None, env_kwargs: dict[str, Any] | None = None,
                 max_turns: int = 64, observations: str = "full", **game_kwargs: Any) -> None:
        if observations not in ("full", "new"):
            raise ValueError(f"{game_id}: observations must be 'full' or 'new', got {observations!r}")
        self.observations = observations
        self._seen: dict[str, str] = {}
        self.game_id, self.env_kwargs = game_id, {**(env_kwargs or {}), **game_kwargs}
        self.num_players = int(num_players) if num_players else _players(game_id, self.env_kwargs)
        self.opponent, self.max_turns = opponent, max_turns
        if seats == "seed":
            self._fixed: list[int] | None = None
            self._ids = ["agent_0"]
        else:
            fixed = list(range(self.num_players)) if seats == "all" else sorted(int(s) for s in seats)
            if not fixed or len(set(fixed)) != len(fixed) or any(not 0 <= s < self.num_players for s in fixed):
                raise ValueError(f"seats {seats!r} must be distinct players of {game_id} (0..{self.num_players - 1})")
            self._fixed, self._ids = fixed, [f"player_{s}" for s in fixed]
        if (self._fixed is None or len(self._fixed) < self.num_players) and opponent is None and self.num_players > 1:
            raise ValueError(f"{game_id}: seats={seats!r} leaves players to an opponent; pass opponent= "
                             "(player_id, observation) -> answer, or seats='all' with a frozen agent per seat")
        self.env: Any = None
        self.seat_of: dict[str, int] = {}
        self._current: int | None = None
        self._obs: dict[str, str] = {}
        self._ended: dict[str, StepOutcome] = {}
        self._done = True

    @property
    def preferred_context(self) -> str:
        """``"last"`` for ``observations="full"`` (each observation is the whole game so far: the agent keeps
        only it), ``"full"`` for ``"new"`` (the agent keeps the dialog)."""
        return "last" if self.observations == "full" else "full"

    @property
    def agent_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def ended_at_reset(self) -> dict[str, StepOutcome]:
        """Each agent's outcome when the opponent ended the game in ``reset`` (before any agent's turn)."""
        return dict(self._ended)

    @property
    def active_agents(self) -> list[str]:
        if self._done or self._current is None:
            return []
        return [a for a, p in self.seat_of.items() if p == self._current]

    def observe(self, agent_id: str) -> str:
        return self._obs.get(agent_id, "")

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, JSON]]:
        seed = 0 if seed is None else int(seed)
        seats = self._fixed if self._fixed is not None else [seed % self.num_players]
        self.seat_of = dict(zip(self._ids, seats))
        self.env = _make(self.game_id, self.env_kwargs)
        self.env.reset(num_players=self.num_players, seed=seed)
        instance = self._instance()  # the game's hidden state (the secret, the deal) before anyone moves
        self._done, self._obs, self._seen = False, {}, {}
        self._ended = self._advance()  # an opponent that moves first may end the game before an agent's turn
        info = {"game": self.game_id, "seed": seed, "num_players": self.num_players, "instance": instance}
        return {a: (self._obs.get(a, ""), {**info, "seat": p}) for a, p in self.seat_of.items()}

    def _instance(self) -> str:
        """The instance key (``eval.instances``): the game's state at reset, which holds what the first
        observation does not (GuessTheNumber's secret, Kuhn poker's deal)."""
        from ludic.eval.instances import state_key

        state = getattr(getattr(self.env, "unwrapped", self.env), "state", None)
        game_state = getattr(state, "game_state", None)
        return state_key(game_state) if isinstance(game_state, dict) else ""

    def _advance(self) -> dict[str, StepOutcome]:
        """Let the opponent play until an agent must act or the game ends; the outcomes at the end."""
        while True:
            player, obs = self.env.get_observation()
            agent = next((a for a, p in self.seat_of.items() if p == player), None)
            if agent is not None:
                self._current, self._obs[agent] = player, self._show(agent, _observation_text(obs))
                return {}
            if self.opponent is None:
                raise RuntimeError(f"{self.game_id}: player {player} must move and no agent or opponent plays it")
            done, _ = self.env.step(self.opponent(player, _observation_text(obs)))
            if done:
                return self._finish()

    def _show(self, agent: str, text: str) -> str:
        """What ``agent`` is shown of the game text ``text``: all of it, or (``observations="new"``) what
        was added since the text it saw last, when the new text extends that one."""
        seen, self._seen[agent] = self._seen.get(agent), text
        extends = self.observations == "new" and seen and text.startswith(seen)
        return (text[len(seen):].strip() if extends else "") or text

    def _finish(self) -> dict[str, StepOutcome]:
        self._done, self._current = True, None
        closed = self.env.close()
        rewards, game_info = closed if isinstance(closed, tuple) else (closed, {})
        rewards = rewards or {}
        out = {}
        for agent, player in self.seat_of.items():
            raw = rewards.get(player, 0.0)
            try:
                r = float(raw)
            except (TypeError, ValueError):
                raise ValueError(f"TextArena {self.game_id} gave player {player} a non-numeric reward {raw!r} "
                                 "(a bug in the game)") from None
            gi = dict((game_info or {}).get(player, {}))
            others_invalid = any(bool(dict(v).get("invalid_move")) for p, v in (game_info or {}).items()
                                 if p != player and isinstance(v, dict))
            if self.num_players == 1:  # a score: 1 solves the game, less is partial credit
                outcome = "win" if r >= 1.0 else "loss"
            else:
                outcome = "win" if r > 0 else "loss" if r < 0 else "draw"
            info = {"outcome": outcome, "success": float(outcome == "win"), "reason": str(gi.get("reason", "")),
                    "invalid_move": bool(gi.get("invalid_move", False)), "turns": int(gi.get("turn_count", 0) or 0),
                    "opponent_invalid": others_invalid and outcome == "win"}  # a win by forfeit, not in play
            out[agent] = StepOutcome(f"Game over: {info['reason'] or outcome}.", r, terminated=True, info=info)
        return out

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self._done:
            raise RuntimeError(f"{self.game_id}: step() after the game ended")
        (agent,) = self.active_agents
        done, _ = self.env.step(actions.get(agent, ""))
        if done:
            return self._finish()
        out = self._advance()
        if out:
            return out
        # the mover's turn is recorded (its next observation comes when its turn does), and the agent
        # to move now gets the game as it sees it
        return {agent: StepOutcome(""), **{a: StepOutcome(self._obs[a]) for a in self.active_agents}}
