"""The InteractionProtocol interface and the step-recording helpers both protocols share.

A protocol never lets an exception of its episode escape (``ludic.errors``):
the episode ends as failed rollouts, one per managed agent, with the steps
recorded so far, ``meta["failed"]``, ``meta["error"]`` and ``meta["error_stage"]``.
"""

from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod

from ludic.agents.agent import AgentTurn
from ludic.envs.base import LudicEnv
from ludic.types import Rollout, Step, StepOutcome

INVALID_ACTION_FEEDBACK = "Invalid action."


class InteractionProtocol(ABC):
    """Owns the loop between agents and an env; returns one Rollout per managed agent."""

    @abstractmethod
    async def run(self, env: LudicEnv, *, max_steps: int, env_seed: int | None = None,
                  sampling_seed: int | None = None) -> list[Rollout]:
        """Play one episode. An exception inside it ends it as failed rollouts; only an env
        the protocol cannot drive (wrong agents) raises."""


def failed_request_step(index: int, obs: str, turn: AgentTurn) -> Step:
    """The inference call failed: a truncated step with no tokens to train on."""
    return Step(
        index=index, prev_obs=obs, action="", parsed_action=None, next_obs=None, reward=0.0,
        terminated=False, truncated=True, trace=turn.trace, info=dict(turn.info),
    )


def parse_error_step(index: int, obs: str, turn: AgentTurn, stop: bool) -> Step:
    """The completion did not parse: the env is not stepped, the parser's penalty is the reward."""
    feedback = turn.parse.obs or INVALID_ACTION_FEEDBACK
    return Step(
        index=index, prev_obs=obs, action=turn.text, parsed_action=None,
        next_obs=None if stop else feedback, reward=turn.parse.reward,
        terminated=stop, truncated=False, trace=turn.trace,
        info={**turn.info, "parse_error": True},
    )


def tool_step(index: int, obs: str, turn: AgentTurn) -> Step:
    """The model called tools (``ludic.agents.tools``): the env is not stepped; the results are the next obs."""
    return Step(
        index=index, prev_obs=obs, action=turn.text, parsed_action=None,
        next_obs="\n".join(m["content"] for m in turn.tool_messages), reward=turn.parse.reward,
        terminated=False, truncated=False, trace=turn.trace, info={**turn.info, "tool_step": True},
    )


def env_step(index: int, obs: str, turn: AgentTurn, out: StepOutcome) -> Step:
    """A parsed action was applied to the env: env reward plus format reward."""
    done = out.terminated or out.truncated
    return Step(
        index=index, prev_obs=obs, action=turn.text, parsed_action=turn.parse.action,
        next_obs=None if done else out.obs, reward=out.reward + turn.parse.reward,
        terminated=out.terminated, truncated=out.truncated, trace=turn.trace,
        info={**turn.info, **out.info, "parsed_action": turn.parse.action},
    )


def no_turn_step(index: int, obs: str, out: StepOutcome) -> Step:
    """The env ended an agent's episode before its first turn (the opponent forfeited first, say): a step with
    no action and no tokens (nothing to train) that carries the reward and the outcome, ``info["no_turn"]``."""
    return Step(index=index, prev_obs=obs, action="", parsed_action=None, next_obs=None, reward=out.reward,
                terminated=out.terminated, truncated=out.truncated, info={**out.info, "no_turn": True})


def no_turn_steps_at_reset(env: LudicEnv, obs: dict[str, str]) -> dict[str, Step]:
    """The no-turn step of each agent in ``obs`` (agent -> its reset observation) whose episode the env's
    ``reset`` already ended (``LudicEnv.ended_at_reset``)."""
    return {a: no_turn_step(0, obs[a], out) for a, out in env.ended_at_reset.items()
            if a in obs and (out.terminated or out.truncated)}


def error_step(index: int, obs: str, turn: AgentTurn, error: str) -> Step:
    """The env raised while applying this turn's action: the turn is kept for the log, unrewarded."""
    return Step(
        index=index, prev_obs=obs, action=turn.text, parsed_action=turn.parse.action, next_obs=None,
        reward=0.0, terminated=False, truncated=True, trace=turn.trace,
        info={**turn.info, "error": error, "truncation_reason": "error"},
    )


def mark_truncated(steps: list[Step], reason: str) -> str | None:
    """Mark the last step truncated (with a reason) if the episode did not end on its own.

    Returns the truncation reason recorded for the rollout (None when the
    episode terminated).
    """
    if not steps:
        return reason
    last = steps[-1]
    if last.terminated:
        return None
    if last.truncated:
        return str(last.info.get("truncation_reason", "env"))
    steps[-1] = dataclasses.replace(
        last, truncated=True, info={**last.info, "truncation_reason": reason}
    )
    return reason
