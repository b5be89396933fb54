"""The game side of ``ludic train games`` and ``ludic eval games``: which games (``GamesBlock``, parsed by
``parse_games``), the env of one episode, the agent and protocols that play it, the batch metrics, and the
exact exploitability of a policy on the small poker games."""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass
from typing import Any, Sequence

from ludic.agents.agent import Agent
from ludic.context import make_context
from ludic.inference.client import ChatClient, SamplingParams
from ludic.interaction import SingleAgentProtocol
from ludic.interaction.multi_agent import MultiAgentProtocol
from ludic.parsers import identity_parser
from ludic.types import EnvSpec, Rollout

EXPLOITABILITY_GAMES = ("kuhn_poker", "leduc_poker")
"""Small imperfect-information games whose NashConv is computed exactly during training."""


@dataclass
class GamesBlock:
    """Games: which games, against whom, and how the agent answers (train and eval)."""

    games: str = "kuhn_poker"
    """Comma-separated pyspiel game names and/or task ids (GGGGCCCCCCCC), sampled uniformly per episode."""
    opponent: str = "random"
    """random, mcts (the suite's per-game strength unless --mcts-simulations), self (every seat the
    policy) or league (training, two-player games: the other seat is a frozen earlier snapshot)."""
    mcts_simulations: int = 0
    """MCTS simulations per move (0: the game's preset)."""
    mcts_rollouts: int = 0
    """Random rollouts per MCTS leaf (0: the game's preset)."""
    max_completion_tokens: int = 8
    """Reply limit: an action id needs a few tokens."""
    max_turns: int = 60
    """Agent turns per episode (retries included) before the episode is cut."""
    invalid_reward: float = -0.1
    """Reward of an answer that names no legal action (the turn is retried, 3 attempts)."""
    ctx: str = "last"
    """Context: last (the rules and the current turn) or full (the whole conversation)."""


def parse_games(spec: str) -> list[dict[str, Any]]:
    """``"kuhn_poker,200000000,index:1,trace"`` -> one entry per game: a pyspiel name, a task id, a
    game index of the task list (``index:<i>``: a fresh config variant every episode), or ``trace``
    (the code-trace task)."""
    from ludic.envs.openspiel_suite import GAMES

    out: list[dict[str, Any]] = []
    for part in [p.strip() for p in spec.split(",") if p.strip()]:
        if part.isdigit():
            out.append({"task_id": int(part)})
        elif part.startswith("index:"):
            i = int(part.split(":", 1)[1])
            if not 0 <= i < len(GAMES):
                raise ValueError(f"--games {part}: the task list has game indices 0..{len(GAMES) - 1}")
            out.append({"index": i})
        elif part == "trace":
            out.append({"trace": True})
        else:
            out.append({"game": part})
    if not out:
        raise ValueError("--games is empty: give pyspiel game names, task ids, index:<i> or trace, comma-separated")
    return out


def game_name(kwargs: dict[str, Any]) -> str:
    from ludic.envs.openspiel_suite import GAMES, decode_task

    if "trace" in kwargs:
        return "trace"
    if "index" in kwargs:
        return GAMES[kwargs["index"]]
    return kwargs["game"] if "game" in kwargs else decode_task(kwargs["task_id"]).game


def env_spec(cfg: Any, game: dict[str, Any], rng: random.Random | None = None) -> EnvSpec:
    """The env of one episode of ``game`` under ``cfg`` (an ``index:`` game draws its config variant)."""
    from ludic.envs.openspiel_suite import TASK_BLOCK

    if "trace" in game:
        return EnvSpec("trace", {})
    if "index" in game:
        game = {"task_id": game["index"] * TASK_BLOCK + (rng or random.Random(0)).randrange(TASK_BLOCK)}
    return EnvSpec("openspiel", env_kwargs(cfg, game))


def env_kwargs(cfg: Any, game: dict[str, Any]) -> dict[str, Any]:
    """The OpenSpielEnv arguments of one episode of ``game`` under ``cfg``."""
    kw: dict[str, Any] = {**game, "invalid_reward": cfg.invalid_reward}
    if cfg.opponent in ("self", "league"):
        kw["seats"] = "all"
    else:
        kw["opponent"] = cfg.opponent
        if cfg.mcts_simulations:
            kw["mcts"] = (cfg.mcts_simulations, cfg.mcts_rollouts or 1)
    return kw


def make_agent(client: ChatClient, ctx: str, temperature: float, max_tokens: int) -> Agent:
    """A game player: the env's rules as system prompt, the raw reply as action. The env parses it,
    even a reply cut by ``max_tokens`` (an id needs a few tokens; the env's 3 attempts then govern)."""
    return Agent(client, make_context(ctx), identity_parser, SamplingParams(temperature=temperature, max_tokens=max_tokens),
                 reject_incomplete=False)


def protocols(client: ChatClient, cfg: Any, temperature: float, seats: int = 2) -> dict[str, Any]:
    """``single_agent`` (one seat vs bots) and ``selfplay`` (every seat an agent on ``client``)."""
    def single() -> SingleAgentProtocol:
        return SingleAgentProtocol(make_agent(client, cfg.ctx, temperature, cfg.max_completion_tokens))

    def selfplay() -> MultiAgentProtocol:
        return MultiAgentProtocol({f"player_{k}": make_agent(client, cfg.ctx, temperature, cfg.max_completion_tokens)
                                   for k in range(seats)})
    return {"single_agent": single, "selfplay": selfplay}


def game_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Mean score, success, and the answer quality, overall and per game (``<game>/score``)."""
    out: dict[str, float] = {}
    by_game: dict[str, list[Rollout]] = {}
    for r in rollouts:
        by_game.setdefault(r.meta.get("game", "?"), []).append(r)
    for name, rs in [("", list(rollouts))] + sorted(by_game.items()):
        if not rs:
            continue
        pre = f"{name}/" if name else ""
        scores = [episode_score(r) for r in rs]
        done = [s for s in scores if s is not None]
        answers = [s for r in rs for s in r.steps if not s.no_turn]  # the model's answers
        invalid = sum(1 for s in answers if s.info.get("invalid"))
        out[f"{pre}score"] = statistics.fmean(done) if done else 0.0
        out[f"{pre}success_rate"] = sum(s > 0.5 for s in done) / max(len(rs), 1)
        out[f"{pre}finished_rate"] = len(done) / max(len(rs), 1)
        out[f"{pre}invalid_answer_rate"] = invalid / max(len(answers), 1)
        out[f"{pre}forfeit_rate"] = sum(1 for r in rs if r.steps and r.steps[-1].info.get("forfeit")) / len(rs)
    return out


def episode_score(r: Rollout) -> float | None:
    """The env's final score of an episode (None: cut before the end, or failed)."""
    if r.meta.get("failed") or not r.steps or "score" not in r.steps[-1].info:
        return None
    return float(r.steps[-1].info["score"])


def exploitability(model: Any, tok: Any, games: Sequence[str], temperature: float = 1.0,
                   tables: dict[str, Any] | None = None) -> dict[str, float]:
    """NashConv of the model's policy on each game of ``games`` that is in ``EXPLOITABILITY_GAMES``
    (and, into ``tables`` if given, the policy table it was computed from, per game)."""
    from ludic.envs.openspiel import OpenSpielEnv
    from ludic.eval.games import nash_conv, policy_table

    out = {}
    for g in games:
        if g in EXPLOITABILITY_GAMES:
            env = OpenSpielEnv(game=g)
            table = policy_table(env, model, tok, temperature=temperature)
            out[f"nash_conv/{g}"] = nash_conv(env.game, table)
            if tables is not None:
                tables[g] = table
    return out
