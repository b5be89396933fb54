"""Single-turn environments over prompt datasets, scored by a reward function.

``PromptEnv`` shows one prompt and scores the agent's (parsed) reply with a
reward function ``(prompt, completion) -> float``. Reward functions are looked
up by name so that requests stay serialisable::

    EnvSpec("prompt", {"prompt": "...", "reward": "move_quality"})

Register your own with ``register_reward(name, fn)``.
"""

from __future__ import annotations

from typing import Callable

from ludic.envs.base import SingleAgentEnv
from ludic.errors import stage
from ludic.envs.registry import Registry
from ludic.types import JSON, StepOutcome

RewardFn = Callable[[str, str], float]
REWARDS: Registry[RewardFn] = Registry("reward", {
    "move_quality": "ludic.tictactoe.thinktactoe:move_quality_reward",
    "solver_move": "ludic.tictactoe.positions:solver_move_reward_text",
})


def register_reward(name: str, fn: RewardFn) -> None:
    REWARDS.register(name, fn)


def get_reward(name: str) -> RewardFn:
    return REWARDS.get(name)


class PromptEnv(SingleAgentEnv):
    """One prompt, one reply, one reward.

    Args:
        prompt: the observation shown to the agent.
        reward: name of a registered reward function ``(prompt, completion) -> float``.
        meta: JSON metadata copied into the step info (dataset id, reference answer, ...).
    """

    def __init__(self, prompt: str, reward: str, meta: JSON | None = None, agent_id: str = "agent_0") -> None:
        super().__init__(agent_id)
        self.prompt = prompt
        self.reward_name = reward
        self.reward_fn = get_reward(reward)
        self.meta = meta or {}

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        return self.prompt, dict(self.meta)

    def env_step(self, action: str) -> StepOutcome:
        with stage("reward"):  # a failing reward function fails this episode only
            r = float(self.reward_fn(self.prompt, action))
        return StepOutcome("", r, terminated=True, info={**self.meta, "reward_fn": self.reward_name})
