"""Position-level RL for tic-tac-toe: GRPO on the decisions the policy still gets wrong.

A greedy policy with history-free prompts (ctx ``last``) is a function from
positions to moves. ``greedy_moves`` asks it for its move on many positions
at once (one batched generation); ``PositionScore.wrong`` keeps those where the
move is not value-preserving. ``PositionGRPO`` then trains on those positions: each
becomes a GRPO group of single-decision episodes (``TicTacToePositionEnv``)
sampled at temperature 1 and scored by the solver (``solver_move_reward``),
so every group compares the policy's own alternatives on exactly the decision
it got wrong. Rounds of (find failures -> train) form a curriculum built
from failures: once a decision is fixed, the games it unlocks expose the next.

    score = await score_positions(client, boards, view)
    rl = PositionGRPO(model, tok, client, view, PositionRLConfig(), run_dir)
    await rl.run(steps=4, pool=score.wrong, replay=boards)  # focus=...: positions every batch takes first
"""

from __future__ import annotations

import asyncio
import math
import random
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import ludic.tictactoe.board as ttt
from ludic.tictactoe.env import format_observation
from ludic.agents.agent import Agent
from ludic.tictactoe.positions import BEST, GIVES_AWAY, board_from_string, board_to_string
from ludic.inference.client import ChatClient, ChatRequest, ChatResponse, FunctionClient
from ludic.interaction import SingleAgentProtocol
from ludic.parsers import Parser
from ludic.tictactoe.prompts import answer_parser, make_agent
from ludic.tictactoe.synth import random_cell_reply
from ludic.training.config import TrainerConfig
from ludic.types import EnvSpec, RolloutRequest


@dataclass(frozen=True)
class View:
    """How the policy sees a position (must match its games): prompt text and answer parser."""

    system_prompt: str | None
    compact: bool = True
    show_moves: bool = True
    max_tokens: int = 16
    answer: str = "move"
    """Answer style (``answer_parser``)."""

    def parser(self) -> Parser:
        return answer_parser(self.answer)

    def agent(self, client: ChatClient, temperature: float) -> Agent:
        return make_agent(client, "last", temperature, self.max_tokens, system_prompt=self.system_prompt,
                          answer=self.answer)

    def env_kwargs(self, board: ttt.Board) -> dict[str, Any]:
        return {"board": board_to_string(board), "compact": self.compact, "show_moves": self.show_moves}


async def greedy_moves(client: ChatClient, boards: Sequence[ttt.Board], view: View) -> list[int | None]:
    """The greedy policy's move on each board (None: unparsable or illegal), all requests at once."""

    async def one(board: ttt.Board) -> int | None:
        agent = view.agent(client, temperature=0.0)
        agent.reset()
        agent.observe(format_observation(board, ttt.to_move(board), None, None, view.compact, view.show_moves))
        turn = await agent.act()
        move = ttt.parse_coord(turn.parse.action) if turn.parse.action is not None else None
        return move if move is not None and board[move] == ttt.EMPTY else None

    return list(await asyncio.gather(*(one(b) for b in boards)))


@dataclass
class PositionScore:
    """Greedy decisions on a set of positions, judged by the solver."""

    boards: list[ttt.Board]
    moves: list[int | None]

    @property
    def wrong(self) -> list[ttt.Board]:
        """Boards where the move is illegal, unparsable or gives game value away."""
        return [b for b, m in zip(self.boards, self.moves) if m is None or m not in ttt.optimal_moves(b)]

    def rates(self) -> dict[str, float]:
        n = max(len(self.boards), 1)
        legal = [m is not None for m in self.moves]
        ok = [m is not None and m in ttt.optimal_moves(b) for b, m in zip(self.boards, self.moves)]
        best = [m is not None and m in ttt.best_moves(b) for b, m in zip(self.boards, self.moves)]
        return {"positions": float(len(self.boards)), "legal_rate": sum(legal) / n,
                "value_preserving_rate": sum(ok) / n, "best_move_rate": sum(best) / n}


async def score_positions(client: ChatClient, boards: Sequence[ttt.Board], view: View) -> PositionScore:
    return PositionScore(list(boards), await greedy_moves(client, boards, view))


EXPLORE_MODES = ("hotter", "uniform")
"""How a group's exploring samples are drawn (``PositionRLConfig.explore``)."""
REPLAY_FROM = ("teacher", "trained", "all", "played", "failed", "tree")
"""Where a batch's replay share is drawn from (``PositionRLConfig.replay``)."""
FOCUS_BY = ("uniform", "reach")
"""How a batch's focus slots are drawn from the focus positions (``PositionRLConfig.focus_by``)."""


class UniformCellClient(FunctionClient):
    """A sampler that answers a tic-tac-toe prompt with a uniformly random legal cell of the board it shows,
    in the policy's answer style (``cell`` or ``move``), seeded by the request's sampling seed. Its log-probs
    are NaN (unknown: the policy did not sample the reply), so the loss scores the reply with an importance
    ratio of 1. ``PositionRLConfig(explore="uniform")`` draws a group's exploring samples from it."""

    def __init__(self, policy: ChatClient, answer: str = "cell") -> None:
        super().__init__(policy.tokenizer, self._reply, logprob=math.nan)
        self.answer = answer
        self._rng = random.Random(0)

    def _reply(self, messages: Sequence[Any]) -> str:
        board = ttt.parse_board(next((m["content"] for m in reversed(messages) if m["role"] == "user"), ""))
        if board is None or not ttt.legal_moves(board):
            return ""  # no board to move on: an unparsable reply, scored as the env scores one
        return random_cell_reply(board, self._rng, self.answer)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        self._rng = random.Random(request.sampling.seed)  # reply() runs before the first await
        return await super().complete(request)


@dataclass
class PositionRLConfig:
    """Position-level GRPO settings."""

    positions_per_step: int = 16
    """Distinct positions (GRPO groups) per batch: the focus positions, then the failure pool (fewer if both are smaller)."""
    replay_fraction: float = 0.25
    """Share of each batch drawn from ``replay`` positions (already right: sampled mistakes
    there are corrected too, which guards against forgetting)."""
    replay: str = "teacher"
    """Where the replay share comes from (``round_sets``): ``teacher``, the ``replay`` positions ``run`` is
    given (uniform over them); ``trained``, the focus positions of earlier ``run`` calls (the decisions earlier
    rounds fixed, which a round that never draws them overwrites), the given ones only while there are none;
    ``all``, every given position, the focus and pool ones included (a batch that is mostly replay is then a
    uniform sample of the positions, not one of those already right: it cannot move a bias shared by all
    positions toward whatever the last evaluation's failures have in common); ``played``, the same over the given
    positions, which the recipe makes the teacher positions and every position its policy met in its games;
    ``failed``, every given position and every position an evaluation found wrong so far (this round's focus and
    pool and earlier rounds' focus): the failures off the given set are replayed too, not only through the batch's
    few failure slots, without the thousand positions ``played`` adds that the policy already gets right;
    ``tree``, every given position, which the recipe makes the teacher positions and the policy's own tree against
    minimax (every position it decided on in its last evaluation's games against minimax, right or wrong), and
    every position found wrong against minimax so far (this round's focus, earlier rounds' focus): the decisions
    the minimax metric is made of, most of them off the teacher's line once the policy's moves differ from the
    teacher's, are replayed while they are still right, not only once found wrong; the pool's failures (the
    cold start's against random, mostly) keep only the batch's failure slots."""
    replay_priority: float = 0.0
    """Share of the replay draws made in proportion to each position's ``Shortfalls`` (how far the policy's own
    samples there fell short of the best reward lately) instead of uniformly: the visits go where samples still
    earn less, away from positions whose groups all score alike. Only rewards enter it, never a move."""
    focus_share: float = 0.0
    """Least share of each batch's groups given to ``focus`` positions: when there are fewer focus
    positions than that, they are repeated (several groups of the same decision), so the last few
    mistakes get most of the signal instead of one group in sixteen."""
    focus_by: str = "uniform"
    """How the focus slots are drawn when there are more focus positions than slots: ``uniform``, or ``reach``, in
    proportion to the weight ``run`` is given for each (the recipe gives how likely the last evaluation's games
    against minimax reach it: a wrong decision every game of a seat passes through costs the whole seat, one
    deep in a rare branch a sliver of it). The weights come from the policy's own games and the solver's verdict
    on them, never from a move shown."""
    group_size: int = 8
    temperature: float = 1.0
    explore_samples: int = 0
    """The last samples of every group explore (``explore``): once the policy answers a position the same way
    8 times out of 8 the group carries no signal, and these samples still try other cells."""
    explore: str = "hotter"
    """How the exploring samples are drawn: ``hotter``, the policy at ``explore_temperature`` (the loss scores
    each at its own temperature; a policy that sharpens faster than the temperature flattens still agrees with
    itself), or ``uniform``, a uniformly random legal cell (``UniformCellClient``: no move preferred, so no
    strategy shown; trained with an importance ratio of 1, as if the policy had sampled it, and only when it beat
    its group: ``GroupNormalizedReturn(explored_gains_only=True)``)."""
    explore_temperature: float = 2.0
    algorithm: str = "grpo"
    kl_coef: float = 0.0
    """KL penalty to the policy RL started from (the adapter switched off). When > 0, groups whose
    samples all score the same are kept: they carry no advantage but their KL term anchors the
    decisions already right while the wrong ones move."""
    entropy_coef: float = 0.0
    """Entropy bonus (keeps the sampled policy from collapsing onto one answer per position)."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-4, max_grad_norm=1.0))
    seed: int = 0


class Shortfalls:
    """How far the policy's own samples on each position fell short of the best reward lately: an exponential
    moving average over the position's visits of ``BEST - reward`` (``rate``: the newest visit's weight), and
    ``prior`` before its first visit, so unvisited positions are drawn early. Exploring samples are left out (the
    policy did not choose them). Calling it gives a position's weight for ``PositionRLConfig.replay_priority``, at
    least ``floor``, so a position the policy plays right is still revisited now and then. Built from the rewards
    of sampled moves only: it says where the policy earns less, never which move is better. Not checkpointed: a
    resumed run starts again from ``prior``."""

    def __init__(self, rate: float = 0.5, prior: float = BEST - GIVES_AWAY, floor: float = 0.05) -> None:
        self.rate, self.prior, self.floor = rate, prior, floor
        self.values: dict[ttt.Board, float] = {}

    def __call__(self, board: ttt.Board) -> float:
        return max(self.values.get(board, self.prior), self.floor)

    def update(self, rollouts: Sequence[Any]) -> None:
        """One batch's rollouts (one decision each, on the board its env was reset to; an unparsable reply scores
        the parser's penalty): each position's mean shortfall over its policy samples, folded into its average."""
        visits: dict[ttt.Board, list[float]] = {}
        for r in rollouts:
            board = (r.meta.get("reset_info") or {}).get("board")
            if board is not None and not r.meta.get("explore"):
                visits.setdefault(board_from_string(board), []).append(BEST - r.total_reward)
        for board, gaps in visits.items():
            now, old = sum(gaps) / len(gaps), self.values.get(board)
            self.values[board] = now if old is None else (1 - self.rate) * old + self.rate * now


class PositionGRPO:
    """GRPO on single decisions: each batch draws positions from ``pool`` (and ``replay``), each
    position becomes a group of ``group_size`` one-move episodes of ``TicTacToePositionEnv``
    sampled at ``temperature`` and rewarded by the solver. Groups whose samples all score the
    same carry no signal and are dropped before the loss. The pool changes between calls of
    ``run`` (a curriculum); the optimizer state lives on."""

    def __init__(self, model: Any, tokenizer: Any, client: ChatClient, view: View, cfg: PositionRLConfig,
                 run_dir: Path, *, publisher: Any = None, logger: Any = None, total_steps: int = 0) -> None:
        self.cfg, self.view = cfg, view
        self.focus: list[ttt.Board] = []
        self.pool: list[ttt.Board] = []
        self.replay: list[ttt.Board] = []
        self.rng = random.Random(cfg.seed)
        self.steps = 0
        self.past_focus: list[ttt.Board] = []
        """Focus positions of earlier ``run`` calls, first seen first (``replay="trained"`` replays them)."""
        self.shortfalls = Shortfalls()
        """Each position's recent shortfall from the best reward (``replay_priority`` draws by it)."""

        if cfg.explore not in EXPLORE_MODES:
            raise ValueError(f"PositionRLConfig.explore must be one of {EXPLORE_MODES}, got {cfg.explore!r}")
        if not 0.0 <= cfg.replay_priority <= 1.0:
            raise ValueError(f"PositionRLConfig.replay_priority must be in [0, 1], got {cfg.replay_priority}")
        if cfg.focus_by not in FOCUS_BY:
            raise ValueError(f"PositionRLConfig.focus_by must be one of {FOCUS_BY}, got {cfg.focus_by!r}")
        self.focus_weights: dict[ttt.Board, float] = {}
        """The weight of each focus position (``focus_by="reach"``), from the last ``run`` call."""

        def factory(temperature: float = cfg.temperature, sampler: ChatClient = client) -> Callable[[], SingleAgentProtocol]:
            return lambda: SingleAgentProtocol(view.agent(sampler, temperature))

        explore = None
        if cfg.explore_samples:
            explore = (factory(cfg.explore_temperature) if cfg.explore == "hotter"
                       else factory(sampler=UniformCellClient(client, view.answer)))
        self.trainer = group_trainer(model, tokenizer, factory(), cfg, run_dir, self._requests, self._metrics,
                                     cfg.positions_per_step * cfg.group_size, publisher=publisher, logger=logger,
                                     total_steps=total_steps, explore=explore,
                                     explored_gains_only=cfg.explore == "uniform")

    def _requests(self) -> list[RolloutRequest]:
        by_reach = (lambda b: max(self.focus_weights.get(b, 0.0), 1e-6)) if self.cfg.focus_by == "reach" else None
        boards = batch_boards(self.focus, self.pool, self.replay, self.cfg, self.rng, self.shortfalls,
                              focus_weight=by_reach)
        return [RolloutRequest(EnvSpec("tictactoe_position", self.view.env_kwargs(b)), max_steps=1) for b in boards]

    def _metrics(self, rollouts: Sequence[Any]) -> dict[str, float]:
        """A batch's ``_position_metrics``; its rewards also update ``shortfalls`` before the next batch is drawn."""
        self.shortfalls.update(rollouts)
        out = _position_metrics(rollouts)
        if self.cfg.replay_priority and self.shortfalls.values:
            out["shortfall_mean"] = sum(self.shortfalls.values.values()) / len(self.shortfalls.values)
        return out

    async def run(self, steps: int, pool: Sequence[ttt.Board], replay: Sequence[ttt.Board] = (),
                  focus: Sequence[ttt.Board] = (), on_step: Callable[[int, dict], Any] | None = None,
                  focus_weights: Mapping[ttt.Board, float] | None = None) -> dict[str, Any]:
        """``steps`` batches (optimizer steps when any group carries signal). A batch takes the
        ``focus`` positions first (all of them when they fit; else drawn by ``cfg.focus_by``, with
        ``focus_weights``), fills up from ``pool``, and adds ``replay_fraction`` of ``replay`` positions."""
        self.focus, self.pool, self.replay = round_sets(focus, pool, replay, self.past_focus, self.cfg)
        self.focus_weights = dict(focus_weights or {})
        self.past_focus = list(dict.fromkeys(self.past_focus + self.focus))
        if not self.focus and not self.pool:
            return {}
        return await train_batches(self, steps, on_step)


def round_sets(focus: Sequence[ttt.Board], pool: Sequence[ttt.Board], replay: Sequence[ttt.Board],
               past_focus: Sequence[ttt.Board], cfg: PositionRLConfig) -> tuple[list, list, list]:
    """One round's (focus, pool, replay) positions, each without repeats and (but for ``"all"``, ``"played"``,
    ``"failed"`` and ``"tree"``) disjoint. The replay
    is ``replay`` (``cfg.replay="teacher"``) or the ``past_focus`` positions (``"trained"``: the decisions earlier
    rounds trained on, so a fix survives the rounds that do not draw it, taken out of the pool, where a batch
    full of focus positions would never draw them; ``replay`` while there are none)."""
    if cfg.replay not in REPLAY_FROM:
        raise ValueError(f"PositionRLConfig.replay must be one of {REPLAY_FROM}, got {cfg.replay!r}")
    focus = list(dict.fromkeys(focus))
    in_focus = set(focus)
    if cfg.replay in ("all", "played", "failed", "tree"):
        wrong = {"failed": [*past_focus, *focus, *pool], "tree": [*past_focus, *focus]}.get(cfg.replay, [])
        return focus, [b for b in dict.fromkeys(pool) if b not in in_focus], list(dict.fromkeys([*replay, *wrong]))
    past = [b for b in dict.fromkeys(past_focus) if b not in in_focus] if cfg.replay == "trained" else []
    # an earlier focus position still in the pool (it keeps every old mistake) is replayed instead
    not_pooled = in_focus | set(past)
    pool = [b for b in dict.fromkeys(pool) if b not in not_pooled]
    taken = in_focus | set(pool)
    return focus, pool, [b for b in dict.fromkeys(past or replay) if b not in taken]


def group_trainer(model: Any, tokenizer: Any, protocol: Callable[[], SingleAgentProtocol], cfg: Any, run_dir: Path,
                  requests: Callable[[], list[RolloutRequest]], metrics: Callable[[Sequence[Any]], dict[str, float]],
                  concurrency: int, *, publisher: Any = None, logger: Any = None, total_steps: int = 0,
                  explore: Callable[[], SingleAgentProtocol] | None = None, explored_gains_only: bool = False) -> Any:
    """The trainer of a tic-tac-toe RL stage (``PositionGRPO``, ``game_rl.GameGRPO``): each batch plays
    ``requests()`` with ``protocol()`` in GRPO groups of ``cfg.group_size`` (the last ``cfg.explore_samples`` of
    each group with ``explore()``, learned from only when they beat their group if ``explored_gains_only``; rollouts
    in ``run_dir/rollouts.jsonl``),
    credits them with ``cfg.algorithm``, drops groups without signal (unless ``cfg.kl_coef``: their KL term still
    anchors) and logs ``metrics`` of the rollouts. A batch with no signal at all is expected, not an error;
    ``trainer.max_no_signal_steps`` of them in a row stop it (``TrainingStopped``): the sampling policy collapsed."""
    from ludic.rollouts.batch import RolloutBatchSource, drop_zero_weight
    from ludic.rollouts.credit import GroupNormalizedReturn
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.algorithms import algorithm_for
    from ludic.training.trainer import Trainer

    algo = algorithm_for(cfg)
    if explored_gains_only and isinstance(algo.credit, GroupNormalizedReturn):
        # replies the policy did not sample: learn from the ones that beat the group, push none down
        algo = replace(algo, credit=replace(algo.credit, explored_gains_only=True))
    run_dir.mkdir(parents=True, exist_ok=True)
    n_explore = cfg.explore_samples if explore is not None else 0
    protocols = {"single_agent": protocol, **({"explore": explore} if n_explore else {})}
    engine = RolloutEngine(protocols, concurrency=concurrency, jsonl_path=run_dir / "rollouts.jsonl")
    strategy = GRPORequestStrategy(cfg.group_size, cfg.seed, explore=n_explore)
    source = RolloutBatchSource(engine, requests, algo.credit, strategy=strategy,
                                sample_filter=None if cfg.kl_coef else drop_zero_weight, metrics_fn=metrics)
    tcfg = replace(cfg.trainer, total_steps=cfg.trainer.total_steps or total_steps)
    trainer = Trainer(model, algo, source, tcfg, publisher=publisher, logger=logger, tokenizer=tokenizer,
                      pad_token_id=tokenizer.pad_token_id, checkpoint_dir=None)
    # a batch whose groups all lack signal is empty after the filter: expected now and then, but
    # max_no_signal_steps of them in a row mean the sampling policy collapsed (the trainer stops)
    trainer.cfg.max_empty_steps = trainer.cfg.max_no_signal_steps or 10**9
    return trainer


def no_signal_why(stopped: str, metrics: dict[str, Any]) -> str:
    """Why an RL stage's batches carried no signal, from the last batch's ``metrics``: every sample succeeded
    (``saturated``), every sampled move was illegal or unparsable (the policy never found the format or the free
    cells), or the sampling policy collapsed onto one move per position (all samples alike)."""
    if stopped == "saturated":
        return "every sample succeeded"
    if metrics.get("sampled_illegal_rate") == 1.0 or metrics.get("forfeit_rate") == 1.0:  # positions; games
        return "every sample was an illegal or unparsable move: the policy never found a free cell in the format"
    return "every group's samples scored alike: the sampling policy has collapsed onto one move per position"


async def train_batches(rl: Any, steps: int, on_step: Callable[[int, dict], Any] | None = None) -> dict[str, Any]:
    """``steps`` batches of ``rl.trainer``, counted in ``rl.steps``; ``on_step(steps, metrics)`` after each."""
    last: dict[str, Any] = {}
    for _ in range(steps):
        try:
            last = await rl.trainer.train_step()
        finally:  # a batch that stops the run (no signal) was sampled too
            rl.steps += 1
        if on_step is not None:
            on_step(rl.steps, last)
    return last


def batch_boards(focus: Sequence[ttt.Board], pool: Sequence[ttt.Board], replay: Sequence[ttt.Board],
                 cfg: PositionRLConfig, rng: random.Random,
                 weight: Callable[[ttt.Board], float] | None = None,
                 focus_weight: Callable[[ttt.Board], float] | None = None) -> list[ttt.Board]:
    """One batch's positions (one GRPO group each): the ``focus`` positions first (those that fit drawn in
    proportion to ``focus_weight`` when given, else uniformly), repeated up to ``cfg.focus_share`` of the batch,
    then ``pool`` positions, then ``cfg.replay_fraction`` of ``replay`` positions (none when there is nothing to
    fix), ``cfg.replay_priority`` of those drawn in proportion to ``weight`` (``Shortfalls``) and the rest
    uniformly, all distinct."""
    n = cfg.positions_per_step
    n_replay = min(len(replay), round(n * cfg.replay_fraction)) if focus or pool else 0
    k = min(n - n_replay, len(focus))
    if focus_weight is not None and k < len(focus):
        boards = weighted_sample(focus, [focus_weight(b) for b in focus], k, rng)
    else:
        boards = rng.sample(list(focus), k)
    if boards:
        want = min(n - n_replay, math.ceil(n * cfg.focus_share))
        boards += [focus[i % len(focus)] for i in range(max(0, want - len(boards)))]
    boards += rng.sample(list(pool), min(n - n_replay - len(boards), len(pool)))
    n_weighted = round(n_replay * cfg.replay_priority) if weight is not None else 0
    if not n_weighted:
        return boards + rng.sample(list(replay), n_replay)
    weighted = weighted_sample(replay, [weight(b) for b in replay], n_weighted, rng)
    drawn = set(weighted)
    return boards + weighted + rng.sample([b for b in replay if b not in drawn], n_replay - n_weighted)


def weighted_sample(items: Sequence[Any], weights: Sequence[float], k: int, rng: random.Random) -> list[Any]:
    """``k`` distinct items, each draw in proportion to the weights (positive) of the items not yet drawn
    (Efraimidis and Spirakis: the ``k`` largest of ``u ** (1 / weight)``, compared as ``log(u) / weight``, which
    orders them alike without ``u ** (1 / weight)`` rounding to 0 for every small weight)."""
    keys = [((math.log(u) if (u := rng.random()) > 0 else -math.inf) / w, i) for i, w in enumerate(weights)]
    return [items[i] for _, i in sorted(keys, reverse=True)[:k]]


def _position_metrics(rollouts: Sequence[Any]) -> dict[str, float]:
    """Shares of the policy's own samples that were best / value-preserving / illegal; with exploring samples,
    the same shares of those (``explored_*``)."""
    out: dict[str, float] = {}
    for prefix, keep in (("sampled", False), ("explored", True)):
        steps = [s for r in rollouts if bool(r.meta.get("explore")) is keep for s in r.steps]
        if keep and not steps:
            continue
        n = max(len(steps), 1)
        out.update({f"{prefix}_best_rate": sum(bool(s.info.get("best_move")) for s in steps) / n,
                    f"{prefix}_value_preserving_rate": sum(bool(s.info.get("optimal_move")) for s in steps) / n,
                    f"{prefix}_illegal_rate": sum(bool(s.info.get("illegal_move")) for s in steps) / n})
    return out
