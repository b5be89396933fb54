"""MultiAgentProtocol: several LLM agents in one env, one Rollout per agent.

Turn-based and simultaneous games both work: at every iteration the agents in
``env.active_agents`` act (concurrently), their parsed actions go to
``env.step`` together. An agent that does not act this step but whose state
changed (the opponent of a player who just won) gets its reward and
termination folded into its own last step, so every rollout carries the
final outcome (an agent whose episode ended before its first turn gets one
step with no action and no tokens that carries it: ``no_turn_step``; also when the
env's ``reset`` already ended it, ``LudicEnv.ended_at_reset``).
Self-play is two agents sharing one client; a seat played by
a frozen policy (a league opponent) is listed in ``frozen``: its rollout is
recorded with ``meta["trainable"] = False`` and gives no training items. An
exception in the episode (env, agent parts) fails the rollout of every
managed agent.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Collection

from ludic.agents.agent import Agent, AgentTurn
from ludic.envs.base import LudicEnv
from ludic.errors import episode_failure, stage
from ludic.interaction.base import (InteractionProtocol, env_step, error_step, failed_request_step, mark_truncated,
                                    no_turn_step, no_turn_steps_at_reset, parse_error_step)
from ludic.types import JSON, Rollout, Step, StepOutcome


@dataclass
class _Episode:
    """Per-agent state of one episode, kept when the loop fails half-way."""

    steps: dict[str, list[Step]]
    obs: dict[str, str]
    """Latest observation (or parser feedback) each agent acted on."""
    done: dict[str, bool]
    acting: dict[str, AgentTurn] = field(default_factory=dict)
    """Turns whose actions the env is applying right now."""


class MultiAgentProtocol(InteractionProtocol):
    """Drive every managed agent of a multi-agent env.

    Args:
        agents: ``{agent_id: Agent}`` for the roles played by LLMs. Roles not
            listed must be played by the env itself (built-in bots).
        stop_on_parse_error: a malformed output ends the episode.
        frozen: roles played by policies that are not trained (league opponents): their
            rollouts get ``meta["trainable"] = False``.
    """

    def __init__(self, agents: dict[str, Agent], *, stop_on_parse_error: bool = False,
                 frozen: Collection[str] = ()) -> None:
        unknown = set(frozen) - set(agents)
        if unknown:
            raise ValueError(f"frozen roles {sorted(unknown)} are not among the agents {sorted(agents)}")
        self.agents = agents
        self.stop_on_parse_error = stop_on_parse_error
        self.frozen = frozenset(frozen)

    async def run(self, env: LudicEnv, *, max_steps: int, env_seed: int | None = None,
                  sampling_seed: int | None = None) -> list[Rollout]:
        unknown = set(self.agents) - set(env.agent_ids)
        if unknown:
            raise ValueError(f"agents {sorted(unknown)} are not roles of {type(env).__name__}")
        ep = _Episode(
            steps={a: [] for a in self.agents}, obs={a: "" for a in self.agents}, done={a: False for a in self.agents}
        )
        failure: JSON = {}
        try:
            stop_reason = await self._play(env, ep, max_steps, env_seed, sampling_seed)
        except Exception as e:
            failure = episode_failure(e, "protocol")
            for a, turn in ep.acting.items():
                ep.steps[a].append(error_step(len(ep.steps[a]), ep.obs[a], turn, failure["error"]))
            stop_reason = "error"

        rollouts = []
        for a, steps in ep.steps.items():
            if stop_reason is not None and not ep.done[a]:
                reason = mark_truncated(steps, stop_reason)
            else:
                reason = mark_truncated(steps, "max_steps")
            meta = {"agent_id": a, "truncation_reason": reason, "failed": stop_reason == "inference_error",
                    **failure}
            if a in self.frozen:
                meta["trainable"] = False
            rollouts.append(Rollout(steps=steps, meta=meta))
        return rollouts

    async def _play(
        self, env: LudicEnv, ep: _Episode, max_steps: int, env_seed: int | None, sampling_seed: int | None
    ) -> str | None:
        """The episode loop: fills ``ep`` and returns why it stopped early (None: the game ended)."""
        steps, obs, done = ep.steps, ep.obs, ep.done
        with stage("env.reset"):
            first = env.reset(seed=env_seed)
        obs.update({a: first[a][0] for a in self.agents})
        for a, step in no_turn_steps_at_reset(env, obs).items():  # over before its first turn, in reset
            steps[a].append(step)
            done[a] = True
        unseen: dict[str, bool] = {a: True for a in self.agents}
        for agent in self.agents.values():
            agent.reset(env.suggested_sysprompt)
        offsets = {aid: k * 1_000_003 for k, aid in enumerate(sorted(self.agents))}

        while True:
            active = [a for a in env.active_agents if a in self.agents and not done[a]]
            if not env.active_agents:
                return None
            if not active:
                return "unmanaged_agent_to_move"
            if any(len(steps[a]) >= max_steps for a in active):
                return "max_steps"
            for a in active:
                if unseen[a]:
                    self.agents[a].observe(obs[a])
                    unseen[a] = False
            turns = await _act_together(
                [self.agents[a] for a in active],
                [None if sampling_seed is None else sampling_seed + offsets[a] for a in active],
            )
            stop_reason, actions = None, {}
            for a, turn in zip(active, turns):
                i = len(steps[a])
                if turn.failed_request:
                    steps[a].append(failed_request_step(i, obs[a], turn))
                    stop_reason = "inference_error"
                elif turn.parse.action is None:
                    step = parse_error_step(i, obs[a], turn, self.stop_on_parse_error)
                    steps[a].append(step)
                    if step.terminated:
                        done[a] = True
                        stop_reason = "parse_error"
                    else:
                        obs[a] = step.next_obs or ""
                        self.agents[a].add_feedback(obs[a])
                else:
                    actions[a] = turn
            if stop_reason is not None:
                return stop_reason
            if not actions:
                continue
            ep.acting = actions
            with stage("env.step"):
                outcomes = env.step({a: turn.parse.action for a, turn in actions.items()})
            ep.acting = {}
            for a, out in outcomes.items():
                if a not in self.agents:
                    continue
                if a in actions:
                    steps[a].append(env_step(len(steps[a]), obs[a], actions[a], out))
                elif steps[a]:
                    steps[a][-1] = _fold_outcome(steps[a][-1], out)
                elif out.terminated or out.truncated:  # over before its first turn: the outcome is still its
                    steps[a].append(no_turn_step(0, obs[a], out))
                obs[a], unseen[a] = out.obs, True
                if out.terminated or out.truncated:
                    done[a] = True
            if all(done.values()):
                return None


async def _act_together(agents: list[Agent], seeds: list[int | None]) -> list[AgentTurn]:
    """Every agent acts concurrently; all finish before the first exception (if any) is raised."""
    results = await asyncio.gather(*(ag.act(seed) for ag, seed in zip(agents, seeds)), return_exceptions=True)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results  # type: ignore[return-value]


def _fold_outcome(last: Step, out: StepOutcome) -> Step:
    """Add a non-acting agent's reward and termination to its last step."""
    return dataclasses.replace(
        last,
        reward=last.reward + out.reward,
        terminated=last.terminated or out.terminated,
        truncated=last.truncated or out.truncated,
        next_obs=None if (out.terminated or out.truncated) else out.obs,
        info={**last.info, **out.info},
    )
