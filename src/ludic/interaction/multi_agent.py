"""MultiAgentProtocol: several LLM agents in one env, one Rollout per agent.

Turn-based and simultaneous games both work: at every iteration the agents in
``env.active_agents`` act (concurrently), their parsed actions go to
``env.step`` together. An agent that does not act this step but whose state
changed (the opponent of a player who just won) gets its reward and
termination folded into its own last step, so every rollout carries the
final outcome. Self-play is two agents sharing one client.
"""

from __future__ import annotations

import asyncio
import dataclasses

from ludic.agents.agent import Agent
from ludic.envs.base import LudicEnv
from ludic.interaction.base import (
    InteractionProtocol,
    env_step,
    failed_request_step,
    mark_truncated,
    parse_error_step,
)
from ludic.types import Rollout, Step, StepOutcome


class MultiAgentProtocol(InteractionProtocol):
    """Drive every managed agent of a multi-agent env.

    Args:
        agents: ``{agent_id: Agent}`` for the roles played by LLMs. Roles not
            listed must be played by the env itself (built-in bots).
        stop_on_parse_error: a malformed output ends the episode.
    """

    def __init__(self, agents: dict[str, Agent], *, stop_on_parse_error: bool = False) -> None:
        self.agents = agents
        self.stop_on_parse_error = stop_on_parse_error

    async def run(
        self,
        env: LudicEnv,
        *,
        max_steps: int,
        env_seed: int | None = None,
        sampling_seed: int | None = None,
    ) -> list[Rollout]:
        unknown = set(self.agents) - set(env.agent_ids)
        if unknown:
            raise ValueError(f"agents {sorted(unknown)} are not roles of {type(env).__name__}")
        first = env.reset(seed=env_seed)
        steps: dict[str, list[Step]] = {a: [] for a in self.agents}
        obs: dict[str, str] = {a: first[a][0] for a in self.agents}
        unseen: dict[str, bool] = {a: True for a in self.agents}
        done: dict[str, bool] = {a: False for a in self.agents}
        for aid, agent in self.agents.items():
            agent.reset(env.suggested_sysprompt)
        stop_reason: str | None = None
        offsets = {aid: k * 1_000_003 for k, aid in enumerate(sorted(self.agents))}

        while stop_reason is None:
            active = [a for a in env.active_agents if a in self.agents and not done[a]]
            if not env.active_agents:
                break
            if not active:
                stop_reason = "unmanaged_agent_to_move"
                break
            if any(len(steps[a]) >= max_steps for a in active):
                stop_reason = "max_steps"
                break
            for a in active:
                if unseen[a]:
                    self.agents[a].observe(obs[a])
                    unseen[a] = False
            turns = await asyncio.gather(
                *(
                    self.agents[a].act(None if sampling_seed is None else sampling_seed + offsets[a])
                    for a in active
                )
            )
            actions: dict[str, str] = {}
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
                    actions[a] = turn.parse.action
            if stop_reason is not None or not actions:
                continue
            outcomes = env.step(actions)
            for a, out in outcomes.items():
                if a not in self.agents:
                    continue
                if a in actions:
                    turn = turns[active.index(a)]
                    steps[a].append(env_step(len(steps[a]), obs[a], turn, out))
                elif steps[a]:
                    steps[a][-1] = _fold_outcome(steps[a][-1], out)
                obs[a], unseen[a] = out.obs, True
                if out.terminated or out.truncated:
                    done[a] = True
            if all(done.values()):
                break

        rollouts = []
        for a in self.agents:
            if stop_reason is not None and not done[a]:
                reason = mark_truncated(steps[a], stop_reason)
            else:
                reason = mark_truncated(steps[a], "max_steps")
            meta = {"agent_id": a, "truncation_reason": reason, "failed": stop_reason == "inference_error"}
            rollouts.append(Rollout(steps=steps[a], meta=meta))
        return rollouts


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
