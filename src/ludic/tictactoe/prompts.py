"""Tic-tac-toe as the recipes play it: the system prompt, the strict answer parsers, a fresh agent and
its protocol, the env spec of a bot game, held-out evaluation requests and the outcome metrics.
Shared by the GRPO command (``tictactoe.train``), its opponents (``tictactoe.opponents``), the
position-level RL of the recipe (``tictactoe.position_rl``) and the data generators."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

from ludic.agents.agent import Agent
from ludic.context import make_context
from ludic.inference.client import ChatClient, SamplingParams
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import Parser, regex_parser, think_move_parser, xml_tag_parser
from ludic.rollouts.engine import RolloutEngine
from ludic.types import EnvSpec, Rollout, RolloutRequest

SYSTEM_PROMPT = (
    "You play tic-tac-toe. Rows are A-C (top to bottom), columns 1-3 (left to right). "
    "Three in a row wins; naming an occupied cell loses. "
    "Think briefly inside <think>...</think>, then answer with one move such as <move>B2</move>."
)
"""Short on purpose: every prompt token is paid for at every turn (TICTACTOE_RULES is the long form)."""


ANSWER_TOKENS = {"cell": 4, "move": 12, "kind": 20, "think": 40}
"""Reply limit per answer style (the teacher's longest answer plus a margin)."""


@dataclass
class TicTacToeBlock:
    """Game: the opponent and what the agent sees and must answer (training and evaluation)."""

    ctx: str = "full"
    """Context strategy: full (FullDialog), last (the latest observation) or truncated
    (TruncatedThinkingContext: earlier thinking replaced by [TRUNCATED])."""
    opponent: str = "random"
    """random, minimax or mixed (epsilon-random minimax)."""
    epsilon: float = 0.3
    """Random-move probability of the mixed opponent."""
    compact: bool = False
    """Compact board rendering (about a third fewer prompt tokens; evaluate with what the model trained on)."""
    show_opponent_move: bool = True
    """Start observations with the opponent's last move."""
    system_prompt: str = SYSTEM_PROMPT
    """The system turn (the recipe trains with the short "Tic-tac-toe.")."""
    answer: str = "think"
    """Answer format the parser demands: think or kind (<think>...</think><move>B2</move>) or move (<move>B2</move>)."""
    show_moves: bool = True
    """List the free cells in each observation."""


@dataclass
class ColdStartBlock:
    """Cold start: the SFT stage on solver-teacher records (both tic-tac-toe recipes)."""

    sft_epochs: float = 1.0
    """Passes over the teacher records."""
    sft_batch_size: int = 16
    """Teacher records per SFT step."""
    sft_lr: float = 2e-4
    """SFT learning rate (cosine decay)."""
    micro_token_budget: int = 4096
    """Most padded tokens in one forward/backward (SFT and RL)."""


def tictactoe_outcome(r: Rollout) -> str:
    """win / draw / loss / illegal / parse_error / truncated / failed for one episode."""
    if r.meta.get("failed"):
        return "failed"
    if not r.steps:
        return "truncated"
    last = r.steps[-1]
    if "result" in last.info:
        return str(last.info["result"])
    if last.parse_error:
        return "parse_error"
    return "truncated"


def tictactoe_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    n = max(len(rollouts), 1)
    outcomes = [tictactoe_outcome(r) for r in rollouts]
    moves = [s for r in rollouts for s in r.steps if s.parsed_action is not None]
    out = {f"{k}_rate": outcomes.count(k) / n for k in ("win", "draw", "loss", "illegal", "parse_error", "truncated")}
    out["non_loss_rate"] = (outcomes.count("win") + outcomes.count("draw")) / n
    out["forfeit_win_rate"] = sum(  # wins because the opponent moved illegally (self-play, league)
        1 for r, o in zip(rollouts, outcomes) if o == "win" and r.steps[-1].info.get("opponent_illegal")) / n
    out["optimal_move_rate"] = sum(bool(s.info.get("optimal_move")) for s in moves) / max(len(moves), 1)
    steps = [s for r in rollouts for s in r.steps]
    out["legal_move_rate"] = sum(
        1 for s in steps if s.parsed_action is not None and not s.info.get("illegal_move")
    ) / max(len(steps), 1)
    return out


def answer_parser(answer: str = "think") -> Parser:
    """The strict parser of an answer style: ``move`` takes exactly ``<move>B2</move>``; ``think``
    and ``kind`` take ``<think>...</think><move>B2</move>``; ``cell`` takes only a cell name
    such as ``B2`` (see ``ludic.tictactoe.synth.ANSWER_STYLES``)."""
    if answer == "cell":
        return regex_parser(r"[A-C][1-3]", feedback="Invalid answer: reply with one cell name only, such as B2.")
    if answer == "move":
        return xml_tag_parser("move", exact=True)
    if answer in ("think", "kind"):
        return think_move_parser()
    raise ValueError(f"answer must be think, kind, move or cell, got {answer!r}")


def make_agent(
    client: ChatClient, ctx: str, temperature: float, max_tokens: int, model_name: str | None = None, *,
    system_prompt: str = SYSTEM_PROMPT, answer: str = "think",
) -> Agent:
    """A fresh tic-tac-toe player: ``system_prompt``, context ``ctx``, the strict parser of ``answer``."""
    return Agent(
        client, make_context(ctx, system_prompt), answer_parser(answer),
        SamplingParams(temperature=temperature, max_tokens=max_tokens), model=model_name,
    )


def make_protocol_factory(
    client: ChatClient, ctx: str, temperature: float, max_tokens: int, model_name: str | None = None, **prompting: Any
):
    """Single-agent protocols over ``make_agent`` (``prompting``: its system_prompt and answer)."""
    def factory() -> SingleAgentProtocol:
        agent = make_agent(client, ctx, temperature, max_tokens, model_name, **prompting)
        return SingleAgentProtocol(agent, stop_on_parse_error=True)

    return factory


def prompting(cfg: Any) -> dict[str, Any]:
    """The agent-side prompt settings of a train or eval config (``make_agent``'s keywords)."""
    return {"system_prompt": cfg.system_prompt, "answer": cfg.answer}


def env_spec(
    opponent: str, epsilon: float, agent_starts: bool | None, compact: bool = False, show_opponent_move: bool = True,
    show_moves: bool = True,
) -> EnvSpec:
    return EnvSpec("tictactoe", {"opponent": opponent, "epsilon": epsilon, "agent_starts": agent_starts,
                                 "compact": compact, "show_opponent_move": show_opponent_move,
                                 "show_moves": show_moves})


def _starts(mode: str) -> bool | None:
    if mode not in ("x", "o", "mixed"):
        raise ValueError(f"agent_starts_as must be x, o or mixed, got {mode!r}")
    return {"x": True, "o": False, "mixed": None}[mode]


def eval_requests(
    episodes: int, opponent: str, epsilon: float = 0.0, compact: bool = False, show_opponent_move: bool = True,
    seed_base: int = 1_000_000, show_moves: bool = True,
) -> list[RolloutRequest]:
    """Half the episodes with the agent moving first, half second; fixed seeds."""
    return [
        RolloutRequest(env_spec(opponent, epsilon, i % 2 == 0, compact, show_opponent_move, show_moves), env_seed=seed_base + i,
                       sampling_seed=seed_base + i, max_steps=5)
        for i in range(episodes)
    ]


async def run_eval(engine: RolloutEngine, requests: list[RolloutRequest]) -> tuple[dict[str, float], list[Rollout]]:
    rollouts = await engine.generate_rollouts(requests, progress="eval")
    return tictactoe_metrics(rollouts), rollouts
