"""SingleAgentProtocol: one agent, one env, a gym-like loop."""

from __future__ import annotations

from ludic.agents.agent import Agent, AgentTurn
from ludic.envs.base import LudicEnv
from ludic.errors import episode_failure, stage
from ludic.interaction.base import (InteractionProtocol, env_step, error_step, failed_request_step, mark_truncated,
                                    no_turn_steps_at_reset, parse_error_step, tool_step)
from ludic.types import JSON, Rollout, Step


class SingleAgentProtocol(InteractionProtocol):
    """Loop: observe -> act -> (tool call: tool step | parse failure: synthetic step | env.step)
    until done or max_steps (every model call counts as a step).

    Args:
        agent: the policy (its context must be fresh per episode).
        stop_on_parse_error: end the episode at the first malformed output
            (the step is terminal with the parser's penalty). Otherwise the
            agent sees the parser's feedback and tries again.
        extra_steps: model calls allowed beyond ``max_steps`` (a tool agent's
            tool calls, on top of the env's own turn limit).
        max_tool_errors: this many tool turns in a row whose calls all fail end the episode, truncated
            (reason ``tool_errors``); a policy that repeats a failing call would otherwise loop to the
            step limit (greedy evaluation repeats it every time). None: no limit.
    """

    def __init__(self, agent: Agent, *, stop_on_parse_error: bool = False, extra_steps: int = 0,
                 max_tool_errors: int | None = 3) -> None:
        if max_tool_errors is not None and max_tool_errors < 1:
            raise ValueError(f"SingleAgentProtocol: max_tool_errors must be >= 1 or None, got {max_tool_errors}")
        self.agent = agent
        self.stop_on_parse_error = stop_on_parse_error
        self.extra_steps = extra_steps
        self.max_tool_errors = max_tool_errors

    async def run(self, env: LudicEnv, *, max_steps: int, env_seed: int | None = None,
                  sampling_seed: int | None = None) -> list[Rollout]:
        if len(env.agent_ids) != 1:
            raise ValueError(
                f"SingleAgentProtocol needs a single-agent env, {type(env).__name__} has {env.agent_ids}"
            )
        aid = env.agent_ids[0]
        steps: list[Step] = []
        meta: JSON = {"agent_id": aid, "reset_info": {}, "failed": False}
        obs = ""
        acting: AgentTurn | None = None  # the turn whose action the env is applying
        failing_tool_turns = 0  # tool turns in a row whose calls all failed
        reason = None
        try:
            with stage("env.reset"):
                obs, meta["reset_info"] = env.reset(seed=env_seed)[aid]
            steps += no_turn_steps_at_reset(env, {aid: obs}).values()  # the game ended before its first turn
            self.agent.reset(env.suggested_sysprompt)
            if getattr(env, "opening_messages", None):
                self.agent.open_dialog(env.opening_messages)
            self.agent.observe(obs)
            for i in range(max_steps + self.extra_steps):
                if aid not in env.active_agents:
                    break
                turn = await self.agent.act(sampling_seed)
                if turn.failed_request:
                    steps.append(failed_request_step(i, obs, turn))
                    meta["failed"] = True
                    break
                if turn.tool_messages:  # the agent already holds the tool results in its context
                    steps.append(tool_step(i, obs, turn))
                    obs = steps[-1].next_obs or ""
                    errors = turn.info.get("tool_errors") or []
                    failing_tool_turns = failing_tool_turns + 1 if len(errors) == len(turn.tool_messages) else 0
                    if self.max_tool_errors is not None and failing_tool_turns >= self.max_tool_errors:
                        reason = mark_truncated(steps, "tool_errors")
                        break
                    continue
                if turn.parse.action is None:
                    step = parse_error_step(i, obs, turn, self.stop_on_parse_error)
                    steps.append(step)
                    if step.terminated:
                        break
                    obs = step.next_obs or ""
                    self.agent.add_feedback(obs)
                    continue
                acting = turn
                with stage("env.step"):
                    out = env.step({aid: turn.parse.action})[aid]
                acting = None
                step = env_step(i, obs, turn, out)
                steps.append(step)
                if step.terminated or step.truncated:
                    break
                obs = out.obs
                self.agent.observe(obs)
            if reason is None:
                reason = "inference_error" if meta["failed"] else mark_truncated(steps, "max_steps")
        except Exception as e:
            meta.update(episode_failure(e, "protocol"))
            if acting is not None:
                steps.append(error_step(len(steps), obs, acting, meta["error"]))
            reason = mark_truncated(steps, "error")
        meta["truncation_reason"] = reason
        return [Rollout(steps=steps, meta=meta)]
