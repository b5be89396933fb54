"""Environment interfaces: a multi-agent kernel and a single-agent helper.

Envs are pure state machines over text: ``reset`` gives each agent an
observation, ``step`` takes the actions of the active agents and returns a
``StepOutcome`` per agent. They know nothing about LLMs, prompts or parsing;
an optional ``suggested_sysprompt`` tells agents the rules.

Example (single agent)::

    class Guess(SingleAgentEnv):
        def env_reset(self, seed=None):
            self.target = random.Random(seed).randint(1, 9)
            return "Guess a digit 1-9.", {}

        def env_step(self, action):
            ok = action.strip() == str(self.target)
            return StepOutcome("Correct." if ok else "Wrong.", float(ok), terminated=True)
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from ludic.types import JSON, StepOutcome


class LudicEnv(ABC):
    """Multi-agent environment kernel (turn-based or simultaneous).

    ``active_agents`` names who must act now: one agent for turn-based games,
    several for simultaneous moves. ``step`` receives actions of (some of) the
    active agents and returns an outcome for every agent whose state changed,
    including non-acting agents that just won or lost.
    """

    @property
    @abstractmethod
    def agent_ids(self) -> list[str]:
        """Every role in the game."""

    @property
    @abstractmethod
    def active_agents(self) -> list[str]:
        """Agents that must act at the current state (empty when the episode is over)."""

    @abstractmethod
    def reset(self, seed: int | None = None) -> dict[str, tuple[str, JSON]]:
        """Start an episode; return ``{agent_id: (observation, info)}``."""

    @abstractmethod
    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        """Apply actions ``{agent_id: action}``; return outcomes per agent."""

    def observe(self, agent_id: str) -> str:
        """Current observation for ``agent_id`` (used when a turn comes around)."""
        raise NotImplementedError(f"{type(self).__name__} does not implement observe()")

    @property
    def suggested_sysprompt(self) -> str | None:
        """Rules of the game, for agents that have no system prompt of their own."""
        return None

    @property
    def opening_messages(self) -> list[dict[str, str]]:
        """Chat messages that open the agent's dialog before the first observation (after the system prompt), such
        as the few-shot turns of a verifiers prompt; read after ``reset``. Empty by default."""
        return []

    @property
    def ended_at_reset(self) -> dict[str, StepOutcome]:
        """The outcomes of agents whose episode the last ``reset`` already ended (players the env plays
        itself, an opponent, finished the game before their first turn): a protocol records each as a
        no-turn step carrying its reward and info (``interaction.base.no_turn_steps_at_reset``). Empty by
        default."""
        return {}

    max_turns: int | None = None
    """The env's own turn limit: a ``RolloutRequest`` with ``max_steps=None`` uses it (the one place a
    turn limit lives); None: ``DEFAULT_MAX_STEPS``. Every model call counts as a turn."""


class SingleAgentEnv(LudicEnv):
    """Gym-like convenience base: implement ``env_reset`` and ``env_step``."""

    def __init__(self, agent_id: str = "agent_0") -> None:
        self.agent_id = agent_id
        self._done = False
        self._last_obs = ""

    @abstractmethod
    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        """Start an episode; return ``(observation, info)``."""

    @abstractmethod
    def env_step(self, action: str) -> StepOutcome:
        """Apply one action (already parsed by the agent)."""

    @property
    def agent_ids(self) -> list[str]:
        return [self.agent_id]

    @property
    def active_agents(self) -> list[str]:
        return [] if self._done else [self.agent_id]

    def reset(self, seed: int | None = None) -> dict[str, tuple[str, JSON]]:
        self._done = False
        obs, info = self.env_reset(seed)
        self._last_obs = obs
        return {self.agent_id: (obs, info)}

    def step(self, actions: dict[str, str]) -> dict[str, StepOutcome]:
        if self._done:
            raise RuntimeError(f"{type(self).__name__}.step() called after the episode ended")
        out = self.env_step(actions.get(self.agent_id, ""))
        self._done = out.terminated or out.truncated
        self._last_obs = out.obs
        return {self.agent_id: out}

    def observe(self, agent_id: str) -> str:
        return self._last_obs
