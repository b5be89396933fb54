"""OpenSpiel games as Ludic envs: any pyspiel game, played by LLM agents through action ids.

Each turn an agent sees the state from its own seat (pyspiel's observation string, else its
information-state string; never another seat's private information) and one ``id -> action``
line per legal action, and answers with an action id. The rules come once, as the suggested
system prompt. Answers are parsed as the task suite this follows does it (see
``parse_action``); a seat gets ``max_attempts`` tries per turn, then the game ends with score 0
for that seat.

Task ids (``openspiel_suite.decode_task``): ``task_id = game_index * 10**8 + config_id`` over ``GAMES``,
the 22 games of that suite in its order, each with its parameter variants (``game_params``). The
suite's data, the readable poker views and the bots live in ``ludic.envs.openspiel_suite``.
The episode RNG comes from the reset seed: chance outcomes, the random bot and the MCTS
bots' seeds, and the LLM's seat (``seed % 2``, modulo the number of players). The same task
id and seed replay the same game.

Scores (``score_for``): zero-sum games map the return into [0, 1] with the game's utility
bounds (win 1, draw 0.5, loss 0 for a +-1 game); other games with more than two players
score by rank, two-player general-sum games 1 / 0.5 / 0, one-player games by their
utility bounds. A seat's rewards sum to its score: games with intermediate rewards (2048,
solitaire) pay them as they come, normalised, and the last step pays the rest.

Opponents for the seats no agent plays (``make_bot``): ``random`` (uniform over legal
actions) or ``mcts`` (pyspiel's C++ MCTS with random rollouts; ``MCTS_PRESETS`` holds the
suite's per-game strength, ``mcts=(simulations, rollouts)`` overrides it). Simultaneous-move
games always get random bots, as in the suite. LLM opponents (self-play, league snapshots)
are agents: list their seats in ``seats`` and drive the env with ``MultiAgentProtocol``.
"""

from __future__ import annotations

import re
from typing import Any, Sequence

import numpy as np

from ludic.envs.base import LudicEnv
from ludic.envs.openspiel_suite import READABLE, RULES, Bot, GameTask, decode_task, load_game, make_bot
from ludic.types import JSON, StepOutcome

RETRY_MESSAGE = ("Invalid response format. You must respond with ONLY the action ID number (e.g., '5'). "
                 "This is attempt {attempt} of {attempts}.")
"""What a seat sees after an answer that names no legal action (the suite's wording)."""


_INT_RE = re.compile(r"^\s*[-+]?\d+\s*$")
_THINK_RE = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_OPEN_THINK_RE = re.compile(r"<(think|thinking)>.*$", re.DOTALL | re.IGNORECASE)


def strip_thinking(text: str) -> str:
    """Remove ``<think>...</think>`` blocks and an unclosed ``<think>`` tail."""
    return _OPEN_THINK_RE.sub("", _THINK_RE.sub("", text)).strip()


def parse_action(reply: str, legal: Sequence[int], names: Sequence[str]) -> int | None:
    """The action a reply names, the suite's way; None when it names no legal action.

    1. the whole reply is an integer: that action if it is legal (an illegal number fails);
    2. else the first legal id, in legal-action order, that appears as a whole word;
    3. else the first legal action whose string (lower-cased) appears in the reply, or whose
       letters and digits (two or more: the suite also took one, so "banana" named solitaire's
       "♠ <- A♠") appear in the reply's letters and digits.
    """
    text = strip_thinking(reply)
    if _INT_RE.match(text):
        value = int(text)
        return value if value in legal else None
    for a in legal:
        if re.search(rf"(?<![\w-]){a}(?!\w)", text):
            return a
    low = text.lower()
    alnum = re.sub(r"[^a-z0-9]", "", low)
    for a, name in zip(legal, names):
        s = name.lower().strip()
        if s and s in low:
            return a
        s_alnum = re.sub(r"[^a-z0-9]", "", s)
        if len(s_alnum) >= 2 and s_alnum in alnum:  # 1 character ("♠ <- A♠" -> "a") matches anything
            return a
    return None


def score_for(game: Any, returns: Sequence[float], player: int) -> float:
    """``player``'s score in [0, 1] from the final ``returns`` (see the module docstring)."""
    import pyspiel

    n = game.num_players()
    lo, hi = game.min_utility(), game.max_utility()
    r = float(returns[player])
    if game.get_type().utility == pyspiel.GameType.Utility.ZERO_SUM or n == 1:
        return float(np.clip((r - lo) / (hi - lo), 0.0, 1.0)) if hi > lo else 0.5
    if n > 2:
        rank = sum(1 for x in returns if x > r)  # ties share the better rank
        return 1.0 - rank / (n - 1)
    other = float(returns[1 - player])
    return 1.0 if r > other else 0.5 if r == other else 0.0


# ----------------------------------------------------------------------------------------- env
class OpenSpielEnv(LudicEnv):
    """A pyspiel game whose seats are LLM agents and bots.

    Args:
        game: a pyspiel game name (``kuhn_poker``, ``tic_tac_toe``, ...) with ``params``; or
        task_id: a task of the suite (``decode_task``), instead of ``game``.
        seats: which seats agents play. ``"seed"`` (default): one seat, ``seed % 2`` modulo
            the number of players, as agent ``agent_0``; ``"all"``: every seat (self-play),
            agents ``player_<k>``; a list of seat numbers: those seats, ``player_<k>``.
        opponent: the bot of every other seat: ``"random"``, ``"mcts"`` or a callable
            ``(state, player) -> action``.
        mcts: (simulations, rollouts) for ``"mcts"``, instead of the game's preset.
        max_attempts: answers per turn before the seat forfeits (score 0).
        invalid_reward: reward of an answer that names no legal action (the game goes on).
        readable: kuhn_poker and leduc_poker state in words (``READABLE``) instead of pyspiel's
            terse strings ("1b", "[Private: 3][Round1: 1 1]..."); both identify the same
            information state.
    """

    def __init__(
        self,
        game: str | None = None,
        *,
        task_id: int | None = None,
        params: dict[str, Any] | None = None,
        seats: str | Sequence[int] = "seed",
        opponent: str | Bot = "random",
        mcts: tuple[int, int] | None = None,
        max_attempts: int = 3,
        invalid_reward: float = 0.0,
        readable: bool = True,
    ) -> None:
        if (game is None) == (task_id is None):
            raise ValueError("OpenSpielEnv: give a game name or a task_id (one of them)")
        if task_id is not None:
            self.task = decode_task(task_id)
            if params:
                raise ValueError("OpenSpielEnv: a task_id fixes the parameters; do not pass params")
        else:
            self.task = GameTask(-1, str(game), 0, dict(params or {}), "custom")
        self.game = load_game(self.task.game, self.task.params)
        self.num_players = self.game.num_players()
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        if seats == "seed":
            self._fixed_seats: list[int] | None = None
            self._ids = ["agent_0"]
        else:
            fixed = list(range(self.num_players)) if seats == "all" else [int(s) for s in seats]
            bad = [s for s in fixed if not 0 <= s < self.num_players]
            if bad or not fixed or len(set(fixed)) != len(fixed):
                raise ValueError(f"seats {list(seats)!r} must be distinct seats of {self.task.game} "
                                 f"(0..{self.num_players - 1})")
            self._fixed_seats = sorted(fixed)
            self._ids = [f"player_{s}" for s in self._fixed_seats]
        self.opponent, self.mcts = opponent, mcts
        self.max_attempts, self.invalid_reward, self.readable = max_attempts, invalid_reward, readable
        self.state: Any = None
        self.seat_of: dict[str, int] = {}
        self._bots: dict[int, Bot] = {}
        self._rng = np.random.RandomState(0)
        self._seed = 0
        self._attempts: dict[str, int] = {}
        self._paid: dict[str, float] = {}
        self._due: dict[str, float] = {}
        """Intermediate rewards earned since the seat's last outcome (REWARDS games)."""
        self._pending: dict[int, int] = {}
        self._forfeit: str | None = None
        self.history: list[dict[str, Any]] = []

    # -- identity ------------------------------------------------------------------------
    @property
    def agent_ids(self) -> list[str]:
        return list(self._ids)

    @property
    def game_name(self) -> str:
        return self.task.game

    @property
    def suggested_sysprompt(self) -> str:
        rules = RULES.get(self.task.game) or f"The game {self.game.get_type().long_name} (OpenSpiel)."
        return (f"You are playing {self.task.game}.\n\n# Game Rules\n{rules}\n\n# Output Format\n"
                "You must respond with ONLY the action ID (a single number).\n"
                "Do NOT include descriptions or explanations.\nExamples:\n"
                '- For action "0 -> roll": respond "0"\n- For action "89 -> a3": respond "89"')

    @property
    def over(self) -> bool:
        return self.state is None or self.state.is_terminal() or self._forfeit is not None

    @property
    def active_agents(self) -> list[str]:
        if self.over:
            return []
        if self.state.is_simultaneous_node():
            return [a for a, s in self.seat_of.items() if s not in self._pending]
        p = self.state.current_player()
        return [a for a, s in self.seat_of.items() if s == p]

    # -- text ----------------------------------------------------------------------------
    def state_text(self, seat: int) -> str:
        """The state as ``seat`` may see it (no other seat's private information): a readable
        rendering of the information state for the poker games of ``READABLE``, else pyspiel's
        observation string, else its information-state string."""
        t = self.game.get_type()
        if self.readable and self.task.game in READABLE:
            return READABLE[self.task.game](self.state.information_state_string(seat), seat)
        if t.provides_observation_string:
            return self.state.observation_string(seat)
        if t.provides_information_state_string:
            return self.state.information_state_string(seat)
        import pyspiel

        if t.information == pyspiel.GameType.Information.PERFECT_INFORMATION:
            return str(self.state)
        raise ValueError(f"{self.task.game} gives no observation or information-state string for a seat")

    def legal_lines(self, seat: int) -> tuple[list[int], list[str]]:
        legal = [int(a) for a in self.state.legal_actions(seat)]
        return legal, [self.state.action_to_string(seat, a) for a in legal]

    def turn_text(self, seat: int) -> str:
        """What ``seat`` sees when it must act: its view of the state and its legal actions."""
        legal, names = self.legal_lines(seat)
        lines = "\n".join(f"{a} -> {n}" for a, n in zip(legal, names))
        return (f"Current State:\n{self.state_text(seat)}\n\nYou are Player {seat}.\nLegal Actions:\n{lines}\n\n"
                "Your choice (ID only):")

    def observe(self, agent_id: str) -> str:
        seat = self.seat_of[agent_id]
        if self.over:
            return self._final_text(agent_id)
        if agent_id not in self.active_agents:
            return f"Current State:\n{self.state_text(seat)}\n\nYou are Player {seat}. Waiting for the other players."
        return self.turn_text(seat)

    def _final_text(self, agent_id: str) -> str:
        seat = self.seat_of[agent_id]
        score = self.score(agent_id)
        how = ("you forfeited after invalid answers" if self._forfeit == agent_id
               else "the other player forfeited" if self._forfeit is not None else "game over")
        return (f"Game over ({how}). Returns: {self.returns()}. You are Player {seat}; "
                f"your score: {score:.3f} ({'win' if score > 0.5 else 'draw' if score == 0.5 else 'loss'}).")

    # -- results -------------------------------------------------------------------------
    def returns(self) -> list[float]:
        return [float(x) for x in self.state.returns()]

    def score(self, agent_id: str) -> float:
        """The seat's score in [0, 1] (at the end of the game)."""
        if self._forfeit is not None:
            return 0.0 if agent_id == self._forfeit else 1.0
        return score_for(self.game, self.returns(), self.seat_of[agent_id])

    # -- episode -------------------------------------------------------------------------
    def reset(self, seed: int | None = None) -> dict[str, tuple[str, JSON]]:
        self._seed = 0 if seed is None else int(seed)
        self._rng = np.random.RandomState(self._seed % 2**32)
        seats = self._fixed_seats if self._fixed_seats is not None else [(self._seed % 2) % self.num_players]
        self.seat_of = dict(zip(self._ids, seats))
        self._bots = {p: make_bot(self.opponent, self.game, self.task.game, p, self._seed, self.mcts)
                      for p in range(self.num_players) if p not in seats}
        self.state = self.game.new_initial_state()
        self._attempts = {a: 0 for a in self._ids}
        self._paid = {a: 0.0 for a in self._ids}
        self._due = {}
        self._pending, self._forfeit, self.history = {}, None, []
        self._advance()
        info = {"game": self.task.game, "task_id": self.task.task_id, "variant": self.task.variant,
                "seed": self._seed, "num_players": self.num_players,  # the instance: the deal and the moves before
                "instance": f"{self.task.task_id}|{sorted(seats)}|{self.state.history()}"}  # the agents' first turn
        return {a: (self.observe(a), {**info, "seat": self.seat_of[a]}) for a in self._ids}

    def _advance(self) -> None:
        """Play chance and bot moves until an agent must act or the game ends."""
        while not self.state.is_terminal():
            if self.state.is_chance_node():
                outcomes, probs = zip(*self.state.chance_outcomes())
                action = int(outcomes[self._rng.choice(len(outcomes), p=np.asarray(probs) / sum(probs))])
                self._apply(action, -1)
            elif self.state.is_simultaneous_node():
                if self.seat_of:
                    return
                self._apply_joint({})
            else:
                p = self.state.current_player()
                if p in self.seat_of.values():
                    return
                self._apply(self._bots[p](self.state, p), p)

    def _apply(self, action: int, player: int) -> None:
        self.history.append({"player": player, "action": action,
                             "action_str": self.state.action_to_string(player, action) if player >= 0
                             else self.state.action_to_string(action)})
        self.state.apply_action(action)
        self._collect_intermediate()

    def _apply_joint(self, chosen: dict[int, int]) -> None:
        joint = [chosen[p] if p in chosen else self._bots[p](self.state, p) for p in range(self.num_players)]
        for p, a in enumerate(joint):
            self.history.append({"player": p, "action": a, "action_str": self.state.action_to_string(p, a)})
        self.state.apply_actions(joint)
        self._collect_intermediate()

    def _collect_intermediate(self) -> None:
        """Rewards of games that pay as they go (normalised like the score); paid in ``step``."""
        if self.state.is_terminal():
            return
        import pyspiel

        if self.game.get_type().reward_model != pyspiel.GameType.RewardModel.REWARDS:
            return
        span = self.game.max_utility() - self.game.min_utility()
        rewards = self.state.rewards()
        for a, s in self.seat_of.items():
            self._due[a] = self._due.get(a, 0.0) + (float(rewards[s]) / span if span > 0 else 0.0)

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self.over:
            raise RuntimeError("OpenSpielEnv.step() called after the game ended")
        active = self.active_agents
        unknown = set(actions) - set(active)
        if unknown or not actions:
            raise ValueError(f"expected actions of {active}, got {sorted(actions)}")
        infos: dict[str, JSON] = {}
        for agent, reply in actions.items():
            seat = self.seat_of[agent]
            legal, names = self.legal_lines(seat)
            action = parse_action(reply, legal, names)
            if action is None:
                self._attempts[agent] += 1
                infos[agent] = {"invalid": True, "attempt": self._attempts[agent], "reply": reply[:200]}
                if self._attempts[agent] >= self.max_attempts:
                    self._forfeit = agent
                continue
            self._attempts[agent] = 0
            infos[agent] = {"action": action, "action_str": names[legal.index(action)], "attempts_used": 0}
            if self.state.is_simultaneous_node():
                self._pending[seat] = action
            else:
                self._apply(action, seat)
        if self._forfeit is None:
            if self.state.is_simultaneous_node() and not self.active_agents:
                chosen, self._pending = dict(self._pending), {}
                self._apply_joint(chosen)
            self._advance()
        return self._outcomes(actions, infos)

    def _outcomes(self, actions: dict[str, str], infos: dict[str, JSON]) -> dict[str, StepOutcome]:
        out = {}
        for agent in self._ids:
            info = dict(infos.get(agent, {}))
            if agent in actions and info.get("invalid") and not self.over:
                msg = RETRY_MESSAGE.format(attempt=self._attempts[agent] + 1, attempts=self.max_attempts)
                # the turn again below it: a history-free context (ctx last) still shows the state
                out[agent] = StepOutcome(f"{msg}\n\n{self.turn_text(self.seat_of[agent])}", self.invalid_reward,
                                         info=info)
                continue
            reward = self.invalid_reward if info.get("invalid") else 0.0
            if self.over:
                score = self.score(agent)
                reward += score - self._paid[agent]
                self._paid[agent] = score
                info.update(score=score, success=score > 0.5, returns=self.returns(), seat=self.seat_of[agent],
                            game=self.task.game, task_id=self.task.task_id, forfeit=self._forfeit)
            else:
                due = self._due.pop(agent, 0.0)
                reward += due
                self._paid[agent] += due
            out[agent] = StepOutcome(self.observe(agent), reward, terminated=self.over, info=info)
        return out
