"""Who the policy plays in ``ludic train tictactoe``: self-play, a league of its earlier selves, bots.

    --opponent self                                   every group is self-play
    --opponent-pool self:0.4,league:0.3,minimax:0.2,random:0.1
                                                      each GRPO group draws one opponent

What a draw becomes (``OpponentRequests``):

    self     TicTacToeGame with both seats played by the policy (MultiAgentProtocol; the two
             agents share one client, so their model calls batch together). Both seats'
             rollouts are trained; group credit normalises each seat within its group.
    league   TicTacToeGame with the trained seat played by the policy and the other by a
             frozen snapshot (``ludic.training.league``). The snapshot's rollout is recorded
             with ``meta["trainable"] = False``: no training items, no credit.
    random, minimax, mixed
             TicTacToeEnv with the built-in bot (SingleAgentProtocol), as ``--opponent``.

The trained seat alternates X, O, X, ... from group to group (league and bots). Rollouts carry
``meta["opponent"]`` (and ``opponent_snapshot`` for league games); ``opponent_metrics`` breaks the
training metrics down by it.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

from ludic.tictactoe.board import other
from ludic.inference.client import ChatClient
from ludic.interaction import MultiAgentProtocol
from ludic.tictactoe.prompts import env_spec, make_agent, prompting, tictactoe_metrics
from ludic.rollouts.engine import RolloutEngine
from ludic.training.league import League, OpponentDraw, OpponentSampler, frozen_copy_clients, parse_mixture
from ludic.types import EnvSpec, Rollout, RolloutRequest

if TYPE_CHECKING:
    from ludic.tictactoe.train import TrainTicTacToeConfig

SEATS = ("X", "O")
BOTS = ("random", "minimax", "mixed")
OPPONENTS = ("self", "league") + BOTS
"""Names an --opponent-pool may use."""
SELF_PLAY = "self_play"
"""Protocol key of self-play games (both seats trained)."""


def game_spec(cfg: TrainTicTacToeConfig) -> EnvSpec:
    """The two-seat game, with the same observations the single-agent env gives."""
    return EnvSpec("tictactoe_selfplay", {"compact": cfg.compact, "show_opponent_move": cfg.show_opponent_move,
                                          "show_moves": cfg.show_moves})


def selfplay_protocol_factory(
    client: ChatClient, cfg: TrainTicTacToeConfig, *, frozen_seat: str | None = None,
    frozen_client: Callable[[], ChatClient] | None = None,
) -> Callable[[], MultiAgentProtocol]:
    """Fresh agents for both seats per episode, all on ``client``, except ``frozen_seat``, which
    plays on ``frozen_client()`` (resolved per episode) and is not trained."""

    def factory() -> MultiAgentProtocol:
        clients = {seat: client for seat in SEATS}
        if frozen_seat is not None:
            assert frozen_client is not None
            clients[frozen_seat] = frozen_client()
        agents = {seat: make_agent(c, cfg.ctx, cfg.train_temperature, cfg.max_completion_tokens, **prompting(cfg))
                  for seat, c in clients.items()}
        return MultiAgentProtocol(agents, stop_on_parse_error=True, frozen=() if frozen_seat is None else (frozen_seat,))

    return factory


class OpponentRequests:
    """``requests_fn`` for the batch source: one base request (one GRPO group) per drawn opponent.

    Registers the protocols it needs in ``engine.protocols`` (self-play once; one key per league
    snapshot and frozen seat, removed when the snapshot leaves the league). ``state_dict`` is the
    sampler's (its RNG and the league's snapshot list), so a resumed run keeps its league.
    """

    def __init__(self, cfg: TrainTicTacToeConfig, sampler: OpponentSampler, engine: RolloutEngine,
                 client: ChatClient) -> None:
        self.cfg = cfg
        self.sampler = sampler
        self.engine = engine
        self.client = client
        engine.protocols[SELF_PLAY] = selfplay_protocol_factory(client, cfg)

    @property
    def league(self) -> League | None:
        return self.sampler.league

    def __call__(self) -> list[RolloutRequest]:
        self._forget_dropped_snapshots()
        return [self.request(self.sampler.draw()) for _ in range(self.cfg.rollouts_per_update // self.cfg.group_size)]

    def request(self, draw: OpponentDraw) -> RolloutRequest:
        cfg, seat = self.cfg, SEATS[draw.seat]
        if draw.kind == "self":
            return RolloutRequest(game_spec(cfg), SELF_PLAY, max_steps=cfg.max_steps_per_episode,
                                  meta={"opponent": "self"})
        if draw.kind == "league":
            snap, league = draw.snapshot, self.league
            assert snap is not None and league is not None
            key = f"league:{snap.name}:{other(seat)}"
            if key not in self.engine.protocols:
                self.engine.protocols[key] = selfplay_protocol_factory(
                    self.client, cfg, frozen_seat=other(seat), frozen_client=lambda: league.client(snap))
            return RolloutRequest(game_spec(cfg), key, max_steps=cfg.max_steps_per_episode,
                                  meta={"opponent": "league", "opponent_snapshot": snap.name, "trained_seat": seat})
        if draw.kind not in BOTS:
            raise ValueError(f"unknown tic-tac-toe opponent {draw.kind!r}; choose from {list(OPPONENTS)}")
        spec = env_spec(draw.kind, cfg.epsilon, seat == "X", cfg.compact, cfg.show_opponent_move, cfg.show_moves)
        return RolloutRequest(spec, "single_agent", max_steps=cfg.max_steps_per_episode,
                              meta={"opponent": draw.kind, "trained_seat": seat})

    def _forget_dropped_snapshots(self) -> None:
        live = {s.name for s in self.league.snapshots} if self.league is not None else set()
        for key in [k for k in self.engine.protocols if k.startswith("league:")]:
            if key.split(":")[1] not in live:
                del self.engine.protocols[key]

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


def opponent_requests(cfg: TrainTicTacToeConfig, engine: RolloutEngine, client: ChatClient, model: Any,
                      tokenizer: Any, run_dir: Path) -> OpponentRequests | None:
    """The requests_fn for ``--opponent self`` or ``--opponent-pool`` (None for a bot ``--opponent``).

    A pool with ``league`` keeps its snapshots in ``<run_dir>/league``, played by frozen in-process
    copies of ``model``.
    """
    if cfg.opponent_pool:
        mixture = parse_mixture(cfg.opponent_pool, OPPONENTS)
    elif cfg.opponent == "self":
        mixture = {"self": 1.0}
    elif cfg.opponent in BOTS:
        return None
    else:
        raise ValueError(f"unknown tic-tac-toe opponent {cfg.opponent!r}; use {', '.join(BOTS)} or self")
    league = None
    if "league" in mixture:
        league = League(Path(run_dir) / "league", max_size=cfg.league_size, every=cfg.league_every,
                        make_client=frozen_copy_clients(model, tokenizer))
    return OpponentRequests(cfg, OpponentSampler(mixture, league, seats=len(SEATS), seed=cfg.seed), engine, client)


def opponent_metrics(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """``tictactoe_metrics`` over all rollouts, and ``vs_<opponent>/<rate>`` for each opponent kind."""
    out = tictactoe_metrics(rollouts)
    by_kind: dict[str, list[Rollout]] = defaultdict(list)
    for r in rollouts:
        by_kind[str(r.meta.get("opponent", "unknown"))].append(r)
    for kind, rs in sorted(by_kind.items()):
        m = tictactoe_metrics(rs)
        for k in ("win_rate", "draw_rate", "loss_rate", "non_loss_rate", "illegal_rate", "parse_error_rate"):
            out[f"vs_{kind}/{k}"] = m[k]
        out[f"vs_{kind}/rollouts"] = float(len(rs))
    return out
