"""Gymnasium-style text environments as Ludic envs: ``GymTextEnv(env)``, ``EnvSpec("gem:game:Wordle-v0-easy")``.

Any object with Gymnasium's API over text works unchanged: ``reset(seed=) -> (obs, info)`` and
``step(action) -> (obs, reward, terminated, truncated, info)`` with string observations and actions.
GEM (``gem-llm``) follows it, as do Gymnasium text envs and most "gym for LLMs" packages; the spec
prefixes build them by id:

    gem:<id>   gem.make(id)        e.g. gem:game:GuessTheNumber-v0-easy, gem:game:Mastermind-v0-easy
    gym:<id>   gymnasium.make(id)  a Gymnasium env registered with text spaces

Rewards, termination and truncation are the env's own. Each step's observation is what the env
returned (GEM sends only what is new; the agent's context keeps the dialog). The env's info keys that
are numbers or strings go to the step's info; ``success`` is set from the env's own ``success`` flag
when it has one, else from a final reward >= ``success_reward``. ``reward="success"`` pays that success
only (1 or 0 at the end, 0 before; the env's own reward stays in the step's info as ``env_reward``): GEM's
guess-the-number pays a lost game by its last guess's distance to the secret, which a policy earns by
repeating one middle guess (``EnvSpec("gem:game:GuessTheNumber-v0-random", {"reward": "success"})``).
"""

from __future__ import annotations

from typing import Any, Callable

from ludic.envs.base import SingleAgentEnv
from ludic.types import JSON, StepOutcome


def _plain(info: Any) -> dict[str, Any]:
    if not isinstance(info, dict):
        return {}
    return {str(k): v for k, v in info.items() if isinstance(v, (bool, int, float, str))}


class GymTextEnv(SingleAgentEnv):
    """A Gymnasium-API text env as a single-agent Ludic env.

    Args:
        env: the env object, or a callable that builds one (called once).
        success_reward: a final reward at or above this counts as success (when the env's info has
            no ``success`` of its own).
        max_turns: the protocol's turn limit for requests that set none.
        instance: what names an instance (``eval.instances``): ``"both"`` the first observation and the env's
            plain attributes after reset (a secret the text does not show), ``"state"`` the attributes only (GEM's
            games: their prompts show a random example guess), ``"obs"`` the observation only.
        reward: ``"env"`` the env's own rewards; ``"success"`` 1 for a success at the end, else 0 (the env's
            reward in the info as ``env_reward``).
    """

    def __init__(self, env: Any | Callable[[], Any], *, success_reward: float = 1.0, max_turns: int = 64,
                 instance: str = "both", reward: str = "env") -> None:
        if instance not in ("both", "state", "obs"):
            raise ValueError(f"instance must be 'both', 'state' or 'obs', got {instance!r}")
        if reward not in ("env", "success"):
            raise ValueError(f"reward must be 'env' or 'success', got {reward!r}")
        self.instance, self.reward = instance, reward
        super().__init__()
        self.env = env() if isinstance(env, type) or (callable(env) and not hasattr(env, "step")) else env
        for need in ("reset", "step"):
            if not callable(getattr(self.env, need, None)):
                raise TypeError(f"GymTextEnv needs a Gymnasium-style env with {need}(); got {type(self.env).__name__}")
        self.success_reward, self.max_turns = success_reward, max_turns

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        got = self.env.reset(seed=seed)
        obs, info = got if isinstance(got, tuple) else (got, {})
        if not isinstance(obs, str):
            raise TypeError(f"{type(self.env).__name__}.reset() gave a {type(obs).__name__} observation; "
                            "GymTextEnv needs text")
        from ludic.eval.instances import state_key

        hidden = state_key(vars(getattr(self.env, "unwrapped", self.env)))  # a secret the text does not show
        key = {"both": f"{obs}\n{hidden}", "state": hidden, "obs": obs}[self.instance]
        return obs, {**_plain(info), "instance": key}

    def env_step(self, action: str) -> StepOutcome:
        got = self.env.step(action)
        if len(got) != 5:
            raise TypeError(f"{type(self.env).__name__}.step() returned {len(got)} values; Gymnasium's API "
                            "returns (obs, reward, terminated, truncated, info)")
        obs, reward, terminated, truncated, info = got
        info = _plain(info)
        if terminated or truncated:
            info.setdefault("success", float(float(reward) >= self.success_reward))
            info["success"] = float(info["success"])
        if self.reward == "success":
            info["env_reward"] = float(reward)
            reward = info["success"] if terminated or truncated else 0.0
        return StepOutcome(str(obs), float(reward), bool(terminated), bool(truncated), info)


def make_gem(env_id: str, reward: str = "env", **kwargs: Any) -> GymTextEnv:
    """``gem.make(env_id, **kwargs)`` wrapped (``pip install gem-llm``); ``reward``: the wrapper's (above)."""
    try:
        import gem
    except ImportError as e:
        raise ImportError("gem: specs need GEM: pip install gem-llm") from e
    return GymTextEnv(gem.make(env_id, **kwargs), instance="state" if env_id.startswith("game:") else "both",
                      reward=reward)


def make_gymnasium(env_id: str, reward: str = "env", **kwargs: Any) -> GymTextEnv:
    """``gymnasium.make(env_id, **kwargs)`` wrapped; ``reward``: the wrapper's (above)."""
    try:
        import gymnasium
    except ImportError as e:
        raise ImportError("gym: specs need gymnasium: pip install gymnasium") from e
    return GymTextEnv(gymnasium.make(env_id, **kwargs), reward=reward)
