"""Exact evaluation of a greedy tic-tac-toe agent: every opponent branch, no sampling noise.

A greedy agent (temperature 0) is a deterministic function of its prompt, and
the built-in opponents are known distributions over moves (minimax: uniform
over the solver's ``best_moves``; random: uniform over the legal moves; mixed:
their epsilon-mixture). So the game tree of agent against opponent can be
enumerated for each seat: a branch is one sequence of opponent choices, with
its exact probability (a ``Fraction``), and the outcome probabilities are sums
over the leaves. They are exact under the opponent's uniform tie-breaking.

What is evaluated is the real pipeline, as in training: ``Agent`` (context +
parser + ChatClient) against the real ``TicTacToeEnv``. At each decision the
agent's context holds the branch's own history; a branch point copies the
agent's context and the env, and forces the opponent's reply (its opening move
too when the agent plays O). The tree grows breadth-first: every decision of one
depth goes to the client at once (``asyncio.gather``), so an in-process engine
serves them in a few batched forwards. Decisions are cached by exact prompt:
with ctx ``last`` many branches share one, and the policy stays one function of
its prompt even where batches of other sizes would tip a near-tie of the greedy
argmax the other way. An unparsable (or cut-off) reply or
an illegal move ends the branch as a forfeit, as the sampled evaluation's
protocol does (``parse_error``, ``illegal``; not counted in ``loss``).

Per-position optimality, for each side to move. A move is *optimal* when it is
among the solver's ``best_moves`` (fastest win, slowest loss: what the minimax
bot plays) and *value-preserving* when it keeps the game-theoretic value
(``optimal_moves``: the sense of the env's ``optimal_move`` flag and of the
sampled ``optimal_move_rate``). With ``all_positions=True`` and a history-free
context (``last``, ``raw``) the policy answers every reachable position (4,520
boards; with ``show_opponent_move`` once for each opponent mark that can have
been the last move, 13,306 prompts), and the enumeration then reuses those
answers. Otherwise the shares are over the positions met in the enumeration,
which ``ExactResult.all_positions`` says. A board answered under several prompts
counts once, as the mean over its prompts.

    result = await exact_eval(engine, ctx="last", opponent="minimax", all_positions=True)
    print(result.table())
    logger.log(step, result.as_metrics())
"""

from __future__ import annotations

import asyncio
import copy
import dataclasses
import json
import time
from collections import defaultdict
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Any, Callable, Hashable

from ludic.agents.agent import Agent, AgentTurn
from ludic.context import make_context
from ludic.tictactoe.board import (EMPTY_BOARD, TICTACTOE_RULES, Board, best_moves, is_over, opponent_distribution,
                                   optimal_moves, play, reachable_positions, to_move)
from ludic.tictactoe.env import TicTacToeEnv, format_observation, judge_move, opponent_note
from ludic.tictactoe.positions import board_to_string
from ludic.inference.client import ChatClient, ChatRequest, ChatResponse, SamplingParams
from ludic.parsers import Parser, think_move_parser
from ludic.progress import Progress

OUTCOMES = ("win", "draw", "loss", "illegal", "parse_error", "failed")
"""How a branch ends; the probabilities of one seat sum to 1 over these."""
SEATS = ("X", "O")


@dataclass(frozen=True)
class SeatResult:
    """Exact outcome probabilities of the agent in one seat (or the mean of both seats)."""

    win: Fraction
    draw: Fraction
    loss: Fraction
    """Lost on the board (forfeits are counted apart)."""
    illegal: Fraction
    """Forfeit by naming an occupied cell or a non-cell."""
    parse_error: Fraction
    """Forfeit by a reply the parser rejects (a cut-off reply included)."""
    failed: Fraction
    """The inference call failed: no outcome (0 unless the backend errs)."""
    decisions: int
    """Distinct prompts the agent answered in this seat's tree (both trees for the mean)."""
    nodes: int
    """Agent decisions in the tree; branches share prompts, so ``nodes >= decisions``."""

    @property
    def non_loss(self) -> Fraction:
        """Win or draw."""
        return self.win + self.draw


@dataclass(frozen=True)
class PositionStats:
    """How the policy moves over a set of positions of one side to move; each board weighs 1."""

    positions: int
    """Distinct boards."""
    prompts: int
    """Distinct prompts over those boards (more than one per board when the observation
    names the opponent's last move, or when the context carries history)."""
    legal: float
    """Share of positions answered with a legal move."""
    optimal: float
    """Share answered with one of the solver's ``best_moves`` (fastest win, slowest loss)."""
    value_preserving: float
    """Share answered with a move that keeps the game-theoretic value (``optimal_moves``)."""


@dataclass(frozen=True)
class Decision:
    """One distinct prompt the policy answered."""

    board: Board
    """The position (the agent is to move)."""
    observation: str
    """The latest observation in the prompt."""
    completion: str
    """The model's reply."""
    action: str | None
    """What the parser extracted (None: parse error or failed request)."""
    move: int | None
    """The cell played, None unless the action is a legal move."""
    optimal: bool
    """``move`` is one of the solver's ``best_moves``."""
    value_preserving: bool
    """``move`` keeps the game-theoretic value."""

    def to_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "board": board_to_string(self.board)}


@dataclass(frozen=True)
class ExactResult:
    """Exact evaluation of a greedy policy against one opponent."""

    opponent: str
    seats: dict[str, SeatResult]
    """``"X"`` / ``"O"``: the agent playing that mark (only the seats asked for)."""
    both: SeatResult
    """The mean of the seats evaluated (what a 50/50 choice of seat gives)."""
    positions: dict[str, PositionStats]
    """``"X"`` / ``"O"``: positions with that side to move (absent when none was met); ``"all"``: together."""
    all_positions: bool
    """True: ``positions`` covers every reachable position; False: those met in the enumeration."""
    decisions: int
    """Distinct prompts sent to the client (the sweep included)."""
    seconds: float
    """Wall time of the whole evaluation."""
    sweep_seconds: float = 0.0
    """Of which the all-positions sweep."""
    records: list[Decision] = field(default_factory=list, repr=False)
    """Every distinct decision, in the order they were first answered."""
    reach: dict[Board, Fraction] = field(default_factory=dict, repr=False)
    """Each position decided on in the games: the probability its seat's games reach it (over the opponent's
    branches; a seat's games have mass 1). A wrong decision there loses at most that share of the seat."""

    def as_metrics(self) -> dict[str, float]:
        """A flat dict of floats: ``win_rate`` ... for the mean of the seats, ``x/win_rate`` ...
        per seat, ``x/optimal_rate`` ... per side to move, ``optimal_rate`` ... over all positions."""
        out: dict[str, float] = {}
        for prefix, seat in [("", self.both)] + [(f"{s.lower()}/", r) for s, r in self.seats.items()]:
            out.update({f"{prefix}{k}_rate": float(getattr(seat, k)) for k in (*OUTCOMES, "non_loss")})
            out[f"{prefix}decisions"], out[f"{prefix}nodes"] = float(seat.decisions), float(seat.nodes)
        for side, st in self.positions.items():
            prefix = "" if side == "all" else f"{side.lower()}/"
            out.update({f"{prefix}legal_rate": st.legal, f"{prefix}optimal_rate": st.optimal,
                        f"{prefix}value_preserving_rate": st.value_preserving,
                        f"{prefix}positions": float(st.positions), f"{prefix}position_prompts": float(st.prompts)})
        out.update(decisions=float(self.decisions), positions_all=float(self.all_positions),
                   seconds=self.seconds, sweep_seconds=self.sweep_seconds)
        return out

    def table(self) -> str:
        """The human-readable report (``format_table`` of ``as_metrics``)."""
        return format_table(self.as_metrics(), self.opponent)


def format_table(metrics: dict[str, float], opponent: str) -> str:
    """Outcome and position tables from ``ExactResult.as_metrics()`` (what ``ludic eval tictactoe --exact`` prints)."""
    m = metrics
    seats = [s for s in SEATS if f"{s.lower()}/win_rate" in m]
    cols = (*OUTCOMES, "non_loss")
    lines = [f"Exact evaluation against {opponent} (greedy policy, every opponent branch enumerated)",
             f"{'seat':<6}" + "".join(f"{c.replace('_', ' '):>12}" for c in cols) + f"{'prompts':>9}"]
    for name, prefix in [(s, f"{s.lower()}/") for s in seats] + [("mean", "")]:
        lines.append(f"{name:<6}" + "".join(f"{m[prefix + c + '_rate'] * 100:11.2f}%" for c in cols)
                     + f"{int(m[prefix + 'decisions']):>9}")
    scope = "every reachable position" if m["positions_all"] else "positions met in the enumeration"
    lines += ["", f"Moves over {scope} (each board weighs 1)",
              f"{'to move':<10}{'positions':>10}{'prompts':>9}{'legal':>9}{'optimal':>9}{'value-preserving':>18}"]
    for name, prefix in [("X", "x/"), ("O", "o/"), ("all", "")]:
        if f"{prefix}positions" in m:
            lines.append(f"{name:<10}{int(m[prefix + 'positions']):>10}{int(m[prefix + 'position_prompts']):>9}"
                         + "".join(f"{m[prefix + k] * 100:8.1f}%" for k in ("legal_rate", "optimal_rate"))
                         + f"{m[prefix + 'value_preserving_rate'] * 100:17.1f}%")
    sweep = f" (sweep {m['sweep_seconds']:.1f} s)" if m["sweep_seconds"] else ""
    lines += ["", f"{int(m['decisions'])} distinct prompts answered in {m['seconds']:.1f} s{sweep}"]
    return "\n".join(lines)


class DecisionCache:
    """A ChatClient wrapper that answers each distinct request once.

    Requests are keyed by model, prompt (token ids when the agent sent them,
    else the messages) and sampling; concurrent duplicates wait for the one
    call. Every response carries ``info["decision"]``, the index of its
    distinct request. A failing call becomes a failed response (cached too).
    """

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self._calls: dict[Hashable, tuple[int, asyncio.Task]] = {}

    @property
    def tokenizer(self) -> Any:
        return self.client.tokenizer

    def __len__(self) -> int:
        return len(self._calls)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        prompt = request.prompt_ids if request.prompt_ids is not None else json.dumps(request.messages)
        key = (request.model, prompt, request.sampling)
        if key not in self._calls:
            self._calls[key] = (len(self._calls), asyncio.ensure_future(self._call(request)))
        index, task = self._calls[key]
        resp = await asyncio.shield(task)
        return dataclasses.replace(resp, info={**resp.info, "decision": index})

    async def _call(self, request: ChatRequest) -> ChatResponse:
        try:
            return await self.client.complete(request)
        except Exception as e:  # a failed request is data, not a crash
            return ChatResponse.failed(f"{type(e).__name__}: {e}", request.prompt_ids or ())


class _Forced:
    """The opponent of one branch: plays the move the enumerator set."""

    def __init__(self, name: str, move: int | None = None) -> None:
        self.__name__ = name  # what the env reports as its opponent
        self.move = move

    def __call__(self, board: Board, rng: Any) -> int:
        if self.move is None:
            raise RuntimeError("exact evaluation: the opponent's move was not set for this branch")
        return self.move


@dataclass
class _Branch:
    """One path through the tree: the agent and env in that path's state, and its probability."""

    seat: str
    agent: Agent
    env: TicTacToeEnv
    forced: _Forced
    prob: Fraction

    def fork(self, reply: int, prob: Fraction) -> "_Branch":
        """A copy whose opponent answers with ``reply`` (env, opponent and agent context are copied)."""
        env, forced = copy.deepcopy((self.env, self.forced))
        forced.move = reply
        agent = copy.copy(self.agent)  # the context is the agent's only per-episode container
        agent.ctx = copy.deepcopy(self.agent.ctx)
        return _Branch(self.seat, agent, env, forced, prob)


async def exact_eval(
    client: ChatClient,
    *,
    ctx: str = "last",
    system_prompt: str | None = None,
    compact: bool = False,
    show_opponent_move: bool = True,
    show_moves: bool = True,
    opponent: str = "minimax",
    epsilon: float = 0.2,
    max_tokens: int = 48,
    parser: Parser | None = None,
    temperature: float = 0.0,
    model: str | None = None,
    seats: tuple[str, ...] = SEATS,
    all_positions: bool = False,
    agent_factory: Callable[[ChatClient], Agent] | None = None,
) -> ExactResult:
    """Evaluate the greedy policy behind ``client`` exactly against ``opponent``.

    Args:
        client: the policy's inference backend (an in-process engine batches the
            concurrent decisions of each depth).
        ctx: context strategy name (``make_context``), with ``system_prompt``
            (None: the env's rules, as the protocol does).
        compact, show_opponent_move, show_moves: the env's observation settings (use the training ones).
        opponent: ``"minimax"``, ``"random"`` or ``"mixed"`` (with ``epsilon``).
        max_tokens: reply limit; a cut-off reply is a parse error.
        parser: action parser (default: the recipe's strict ``think_move_parser()``).
        temperature: must be 0: a sampled policy is not one tree.
        model: model or adapter name, for servers that host several.
        seats: the agent's marks to evaluate.
        all_positions: first answer every reachable position (history-free contexts
            only; others report the positions met in the enumeration).
        agent_factory: builds a custom agent on the client it is given (a caching
            wrapper of ``client``); then ctx, system_prompt, parser, max_tokens and
            model are the factory's business, and its sampling must be greedy.
    """
    if not seats or set(seats) - set(SEATS):
        raise ValueError(f"seats must be a non-empty subset of {SEATS}, got {seats!r}")
    dist = opponent_distribution(opponent, epsilon)
    cache = DecisionCache(client)
    parser = parser or think_move_parser()
    sampling = SamplingParams(temperature=temperature, max_tokens=max_tokens)

    def new_agent() -> Agent:
        if agent_factory is not None:
            return agent_factory(cache)
        return Agent(cache, make_context(ctx, system_prompt), parser, sampling, model=model)

    if (t := new_agent().sampling.temperature) != 0:
        raise ValueError(
            f"exact evaluation needs a greedy policy (temperature 0), got temperature {t}: a sampled "
            "policy has no single answer per prompt. Use the sampled evaluation (ludic eval tictactoe without "
            "--exact) for temperature > 0; it reports 95% confidence intervals."
        )
    view = {"compact": compact, "show_opponent_move": show_opponent_move, "show_moves": show_moves}
    t0 = time.perf_counter()
    records: dict[int, Decision] = {}
    sweep = all_positions and getattr(new_agent().ctx, "history_free", False)
    if sweep:
        await _sweep(new_agent, records, view)
    sweep_seconds = time.perf_counter() - t0 if sweep else 0.0

    starts = [b for seat in seats for b in _starts(seat, new_agent, dist, opponent, view)]
    tally: dict[str, dict[str, Fraction]] = {s: dict.fromkeys(OUTCOMES, Fraction(0)) for s in seats}
    met: dict[str, set[int]] = {s: set() for s in seats}
    reach: dict[Board, Fraction] = {}
    nodes = dict.fromkeys(seats, 0)
    frontier = starts
    bar = Progress(f"exact eval vs {opponent}", unit="decision")
    while frontier:  # one depth: every branch's next decision, sent together
        turns = await asyncio.gather(*(b.agent.act() for b in frontier))
        bar.update(len(frontier), depth=bar.metrics.get("depth", 0) + 1)
        nxt: list[_Branch] = []
        for b, turn in zip(frontier, turns):
            key = _record(records, b, turn)
            nodes[b.seat] += 1
            met[b.seat].add(key)
            reach[b.env.board] = reach.get(b.env.board, Fraction(0)) + b.prob
            for prob, result, child in _expand(b, turn, dist):
                if child is None:
                    tally[b.seat][result] += prob
                else:
                    nxt.append(child)
        frontier = nxt
    bar.close()

    seat_results = {s: SeatResult(**tally[s], decisions=len(met[s]), nodes=nodes[s]) for s in seats}
    both = SeatResult(
        **{k: sum((tally[s][k] for s in seats), Fraction(0)) / len(seats) for k in OUTCOMES},
        decisions=len(set().union(*met.values())), nodes=sum(nodes.values()),
    )
    shown = list(records.values()) if sweep else [records[k] for k in sorted(set().union(*met.values()))]
    positions = {side: _position_stats([r for r in shown if to_move(r.board) == side]) for side in SEATS}
    positions = {side: st for side, st in positions.items() if st.positions}  # a seat not played meets none
    positions["all"] = _position_stats(shown)
    return ExactResult(opponent, seat_results, both, positions, sweep, len(cache), time.perf_counter() - t0,
                       sweep_seconds, list(records.values()), reach)


def _starts(seat: str, new_agent: Callable[[], Agent], dist: Callable, opponent: str,
            view: dict[str, bool]) -> list[_Branch]:
    """The roots of one seat's tree: one game as X; one per opening move (with its probability) as O."""
    openings = [(None, Fraction(1))] if seat == "X" else dist(EMPTY_BOARD)
    out = []
    for opening, prob in openings:
        forced = _Forced(opponent, opening)
        env = TicTacToeEnv(agent_starts=seat == "X", opponent=forced, **view)
        obs, _ = env.reset(seed=0)[env.agent_id]
        forced.move = None
        agent = new_agent()
        agent.reset(env.suggested_sysprompt)
        agent.observe(obs)
        out.append(_Branch(seat, agent, env, forced, prob))
    return out


def _expand(b: _Branch, turn: AgentTurn, dist: Callable) -> list[tuple[Fraction, str, _Branch | None]]:
    """What follows the agent's ``turn`` on branch ``b``: ``(probability, result, None)`` for an
    ended game, ``(probability, "", child)`` for each opponent reply that continues it."""
    if turn.failed_request:
        return [(b.prob, "failed", None)]
    action = turn.parse.action
    if action is None:
        return [(b.prob, "parse_error", None)]
    aid = b.env.agent_id
    move = judge_move(b.env.board, action, [0, 0])[0]
    if move is None or is_over(play(b.env.board, move)):  # no reply to branch on
        return [(b.prob, str(b.env.step({aid: action})[aid].info["result"]), None)]
    out: list[tuple[Fraction, str, _Branch | None]] = []
    for reply, p in dist(play(b.env.board, move)):
        child = b.fork(reply, b.prob * p)
        step = child.env.step({aid: action})[aid]
        child.forced.move = None  # played; a later unforced call would raise
        if step.terminated:
            out.append((child.prob, str(step.info["result"]), None))
        else:
            child.agent.observe(step.obs)
            out.append((child.prob, "", child))
    return out


def _record(records: dict[int, Decision], b: _Branch, turn: AgentTurn) -> int:
    """Remember the decision ``turn`` made on ``b``'s position (once per prompt); its key."""
    key = int(turn.info["decision"])
    if key not in records:
        obs, _ = b.agent.ctx.latest_observation()
        records[key] = _decision(b.env.board, obs or "", turn)
    return key


def _decision(board: Board, observation: str, turn: AgentTurn) -> Decision:
    action = None if turn.failed_request else turn.parse.action
    move = None if action is None else judge_move(board, action, [0, 0])[0]
    return Decision(board, observation, turn.text, action, move,
                    move in best_moves(board), move is not None and move in optimal_moves(board))


async def _sweep(new_agent: Callable[[], Agent], records: dict[int, Decision], view: dict[str, bool]) -> None:
    """Answer every reachable position, each observation as a game would show it (a fresh agent
    per observation: the context is history-free, so this is the prompt it has in any game)."""
    agents, shown = [], []
    for board in reachable_positions():
        mark = to_move(board)
        lasts = [i for i, c in enumerate(board) if c not in (mark, " ")] if view["show_opponent_move"] else []
        for last in lasts or [None]:
            obs = format_observation(board, mark, opponent_note(mark, last), None, view["compact"], view["show_moves"])
            agent = new_agent()
            agent.reset(TICTACTOE_RULES)
            agent.observe(obs)
            agents.append(agent)
            shown.append((board, obs))
    with Progress("exact eval: all positions", len(agents), unit="prompt") as bar:
        async def act(agent: Agent) -> Any:
            turn = await agent.act()
            bar.update(1)
            return turn

        turns = await asyncio.gather(*(act(a) for a in agents))
    for (board, obs), turn in zip(shown, turns):
        records.setdefault(int(turn.info["decision"]), _decision(board, obs, turn))


def _position_stats(records: list[Decision]) -> PositionStats:
    """Shares over boards, a board's prompts averaged."""
    by_board: dict[Board, list[Decision]] = defaultdict(list)
    for r in records:
        by_board[r.board].append(r)
    n = len(by_board)

    def share(flag: Callable[[Decision], bool]) -> float:
        return sum(sum(map(flag, rs)) / len(rs) for rs in by_board.values()) / n if n else 0.0

    return PositionStats(n, len(records), share(lambda r: r.move is not None), share(lambda r: r.optimal),
                         share(lambda r: r.value_preserving))
