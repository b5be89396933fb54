"""Synthetic SFT data for multi-turn games: rejection sampling and a solver teacher.

Both routes produce chat SFT records, one per agent turn::

    {"messages": [system, user(obs 1), assistant(reply 1), ..., user(obs t)],
     "completion": "<think>...</think><move>B2</move>", "meta": {...}}

``messages`` is the prompt exactly as the agent's context showed it (earlier
assistant turns rewritten to ``<think>[TRUNCATED]</think>answer`` unless
``transform=False``), and ``completion`` is the reply kept intact.

- ``rejection_sample``: roll out a model with ``FullDialog``, keep episodes
  that pass a filter (wins; or wins and draws), convert their steps.
- ``teacher_episodes``: moves come from the perfect solver with templated
  thoughts, so a cold start exists before any model can play.
"""

from __future__ import annotations

import random
from typing import Callable, Collection, Iterable, Sequence

from ludic.context import ContextStrategy, FullDialog, LastObservationContext, TruncatedThinkingContext
from ludic.tictactoe import board as ttt
from ludic.tictactoe.env import TicTacToeEnv, format_observation
from ludic.tictactoe.board import move_kind
from ludic.types import JSON, Rollout

RolloutFilter = Callable[[Rollout], bool]


def keep_results(*results: str) -> RolloutFilter:
    """Keep episodes whose last step's ``info["result"]`` is one of ``results``."""

    def keep(r: Rollout) -> bool:
        return bool(r.steps) and not r.meta.get("failed") and r.steps[-1].info.get("result") in results

    return keep


def filter_rollouts(rollouts: Iterable[Rollout], keep: RolloutFilter) -> list[Rollout]:
    """Rejection sampling's filter step (generic over envs)."""
    return [r for r in rollouts if keep(r)]


def _context(ctx: str, transform: bool, placeholder: str) -> ContextStrategy:
    """The agent's context strategy for a record view: ``"last"``, else the full dialog."""
    if ctx == "last":
        return LastObservationContext()
    return TruncatedThinkingContext(placeholder=placeholder) if transform else FullDialog()


def episode_records(
    system_prompt: str,
    turns: Sequence[tuple[str, str]],
    *,
    ctx: str = "full",
    transform: bool = True,
    placeholder: str = "[TRUNCATED]",
    meta: JSON | None = None,
    feedback: Collection[int] = (),
) -> list[JSON]:
    """SFT records for one episode given its (observation, reply) turns.

    The prompts come from the agent's own context strategy, so each record
    shows what the agent saw. ``feedback`` holds the indices of turns whose
    observation is parser feedback on the previous reply (a retry), not an
    env observation.
    """
    context = _context(ctx, transform, placeholder)
    context.reset(system_prompt)
    records = []
    for i, (obs, reply) in enumerate(turns):
        if i in feedback:
            context.add_feedback(obs)
        else:
            context.add_observation(obs)
        records.append({"messages": context.messages(), "completion": reply, "meta": {**(meta or {}), "turn": i}})
        context.add_response(reply)
    return records


def rollouts_to_records(
    rollouts: Iterable[Rollout], system_prompt: str, *, ctx: str = "full", transform: bool = True,
    placeholder: str = "[TRUNCATED]",
) -> list[JSON]:
    """Convert kept rollouts (parse-failure steps included, as the agent saw them) to SFT records."""
    out = []
    for r in rollouts:
        turns = [(s.prev_obs, s.action) for s in r.steps]
        retries = {i + 1 for i, s in enumerate(r.steps) if s.parse_error and not s.terminated}
        meta = {"rollout_id": r.id, "env_seed": r.meta.get("env_seed"), "total_reward": r.total_reward}
        out.extend(episode_records(system_prompt, turns, ctx=ctx, transform=transform,
                                   placeholder=placeholder, meta=meta, feedback=retries))
    return out


# --------------------------------------------------------------- tic-tac-toe teacher

_ANY_CELL = ("Play {c}.", "{c} is the best move.", "{c} keeps me safe.")
_THOUGHTS = {  # by move_kind(..., forks=True); the first template of each kind is the deterministic teacher's
    "win": ("Win at {c}.", "{c} completes my line.", "Three in a row with {c}."),
    "block": ("Block {c}.", "{o} threatens {c}; block it.", "I must stop {o} at {c}."),
    "fork": ("Fork at {c}.", "{c} makes two threats.", "{c} creates a double threat."),
    "centre": ("Take the centre.", "The centre is strongest.", "B2 controls the board."),
    "corner": _ANY_CELL,
    "edge": _ANY_CELL,
}


PREFERENCE = (4, 0, 2, 6, 8, 1, 3, 5, 7)
"""Deterministic tie-break among equally good moves: centre, corners, edges."""


def preferred_best_move(board: ttt.Board) -> int:
    best = ttt.best_moves(board)
    return next(m for m in PREFERENCE if m in best)


ANSWER_STYLES = ("think", "kind", "move", "cell")
"""How the teacher answers: ``think`` a templated sentence then the move
(``<think>Block the O line at A1.</think><move>A1</move>``), ``kind`` the move's
kind as the thought (``<think>block</think><move>A1</move>``), ``move`` the move
alone (``<move>A1</move>``), ``cell`` the bare cell name (``A1``: 2 tokens + end of turn)."""


def teacher_reply(board: ttt.Board, rng: random.Random | None = None, thoughts: bool = True,
                  style: str | None = None) -> str:
    """The solver's move (fastest win, slowest loss) in an answer ``style`` (ANSWER_STYLES;
    None: ``think`` if ``thoughts`` else ``move``).

    With ``rng`` ties and templates are drawn at random (diverse data); without
    it the teacher is deterministic (centre-first tie-break, one template per
    kind), which keeps the set of positions it ever faces small.
    """
    style = style or ("think" if thoughts else "move")
    if style not in ANSWER_STYLES:
        raise ValueError(f"answer style must be one of {ANSWER_STYLES}, got {style!r}")
    move = rng.choice(ttt.best_moves(board)) if rng is not None else preferred_best_move(board)
    c = ttt.coord(move)
    if style == "cell":
        return c
    answer = f"<move>{c}</move>"
    if style == "move":
        return answer
    kind = move_kind(board, move, forks=True)
    if style == "kind":
        return f"<think>{kind}</think>{answer}"
    templates = _THOUGHTS[kind]
    template = rng.choice(templates) if rng is not None else templates[0]
    return f"<think>{template.format(c=c, o=ttt.other(ttt.to_move(board)))}</think>{answer}"


def random_cell_records(system_prompt: str | None, *, compact: bool = True, style: str = "cell",
                        show_moves: bool = False, per_position: int = 4, seed: int = 0) -> list[JSON]:
    """A format cold start that carries no strategy (``ludic recipe tictactoe --teacher none``): each teacher
    position ``per_position`` times, answered with a uniformly random legal cell in the answer ``style``
    (``cell`` or ``move``: the styles without the solver's reasoning). The positions are every position the
    game can reach with the deterministic teacher's moves on one side; nothing pairs one with its best move
    more often than a uniform choice does (``tests/test_rewards_only.py`` checks it)."""
    if style not in ("cell", "move"):
        raise ValueError(f"--teacher none answers with a bare cell or <move>cell</move>, not style {style!r}")
    rng = random.Random(seed)
    out = []
    for board in teacher_positions():
        mark = ttt.to_move(board)
        obs = format_observation(board, mark, None, None, compact, show_moves)
        system = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        for _ in range(per_position):
            out.append({"messages": [*system, {"role": "user", "content": obs}],
                        "completion": random_cell_reply(board, rng, style),
                        "meta": {"source": "random_cells", "mark": mark, "board": list(board)}})
    return out


def random_cell_reply(board: ttt.Board, rng: random.Random, style: str = "cell") -> str:
    """A uniformly random legal cell of ``board`` as a reply in ``style``: ``B2`` (cell) or ``<move>B2</move>``."""
    c = ttt.coord(rng.choice(ttt.legal_moves(board)))
    return c if style == "cell" else f"<move>{c}</move>"


def teacher_positions(marks: Sequence[str] = ("X", "O")) -> list[ttt.Board]:
    """Every position the deterministic teacher can face, against any opponent, for each seat.

    The teacher plays ``preferred_best_move``; the opponent may play anything.
    (335 positions: 68 as X, 267 as O.) Learning these exactly is enough to
    never lose, against any opponent, at temperature 0.
    """
    seen: dict[ttt.Board, None] = {}

    def visit(board: ttt.Board, me: str) -> None:
        if ttt.is_over(board):
            return
        if ttt.to_move(board) == me:
            if board in seen:
                return
            seen[board] = None
            visit(ttt.play(board, preferred_best_move(board)), me)
        else:
            for m in ttt.legal_moves(board):
                visit(ttt.play(board, m), me)

    for mark in marks:
        visit(ttt.EMPTY_BOARD, mark)
    return list(seen)


def teacher_position_records(system_prompt: str | None, *, compact: bool = True, thoughts: bool = True,
                             style: str | None = None, show_moves: bool = True) -> list[JSON]:
    """One SFT record per teacher position, with the observation the env renders (no history);
    ``system_prompt`` None leaves the system turn out, ``style`` picks the answer (``teacher_reply``)."""
    out = []
    for board in teacher_positions():
        mark = ttt.to_move(board)
        obs = format_observation(board, mark, None, None, compact, show_moves)
        system = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
        out.append({
            "messages": [*system, {"role": "user", "content": obs}],
            "completion": teacher_reply(board, None, thoughts, style),
            "meta": {"source": "teacher_positions", "mark": mark, "pieces": 9 - board.count(ttt.EMPTY),
                     "board": list(board)},
        })
    return out


def teacher_episodes(
    episodes: int,
    *,
    opponents: Sequence[tuple[str, float]] = (("random", 0.0), ("mixed", 0.3), ("minimax", 0.0)),
    seed: int = 0,
    compact: bool = False,
    thoughts: bool = True,
) -> list[tuple[list[tuple[str, str]], JSON]]:
    """Play ``episodes`` solver-vs-bot games (both seats, cycling over ``opponents``).

    Returns ``(turns, meta)`` per episode, turns being (observation, reply) pairs.
    """
    rng = random.Random(seed)
    out = []
    for i in range(episodes):
        name, eps = opponents[i % len(opponents)]
        env = TicTacToeEnv(agent_starts=(i // len(opponents)) % 2 == 0, opponent=name, epsilon=eps,
                               compact=compact)
        obs, _ = env.reset(seed=rng.getrandbits(31))[env.agent_id]
        turns, result = [], None
        while env.active_agents:
            reply = teacher_reply(env.board, rng, thoughts)
            turns.append((obs, reply))
            out_step = env.step({env.agent_id: reply.split("<move>")[1].split("</move>")[0]})[env.agent_id]
            obs, result = out_step.obs, out_step.info.get("result")
        out.append((turns, {"opponent": name, "result": result, "agent_mark": env.mark, "source": "teacher"}))
    return out


def teacher_records(
    episodes: int,
    system_prompt: str,
    *,
    ctx: str = "full",
    transform: bool = True,
    keep: Sequence[str] = ("win", "draw"),
    seed: int = 0,
    compact: bool = False,
    thoughts: bool = True,
) -> list[JSON]:
    """SFT records from solver-played episodes whose result is in ``keep``."""
    records = []
    for turns, meta in teacher_episodes(episodes, seed=seed, compact=compact, thoughts=thoughts):
        if meta["result"] in keep:
            records.extend(episode_records(system_prompt, turns, ctx=ctx, transform=transform, meta=meta))
    return records
