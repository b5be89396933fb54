"""Game-level RL for tic-tac-toe: GRPO on whole games, rewarded by their outcome only.

The rewards-only recipe's second reward kind (``ludic recipe tictactoe --teacher none --reward outcome``).
Where ``PositionGRPO`` asks the solver to score each sampled move, ``GameGRPO`` never consults it:
the policy plays whole games (``TicTacToeEnv``, the same history-free prompts as the exact evaluation)
and each game is worth its result (win 1, draw 0.5, loss 0, an illegal or unparsable move -1). Every
turn of a game gets the game's advantage within its group (``GroupNormalizedReturn``: the games of one
group share the seat and the opponent's random seed), so credit over the turns is the outcome alone.

Opponents come from a ladder (``OutcomeRLConfig.ladder``, weakest first: random, a random/minimax mix,
minimax with random tie-breaks). The policy starts at the bottom and moves up a rung when its sampled
games against the current rung lose at most ``1 - promote_at`` of the time; ``replay_fraction`` of each
batch's games stay against the rungs below (so beating random is not forgotten). The minimax rung is the
solver playing the opponent's side: its moves reach the policy only as the board it must answer, never as
a target.

    rl = GameGRPO(model, tok, client, view, OutcomeRLConfig(), run_dir)
    await rl.run(steps=4)
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

from ludic.inference.client import ChatClient
from ludic.interaction import SingleAgentProtocol
from ludic.tictactoe.position_rl import View, group_trainer, train_batches
from ludic.tictactoe.prompts import tictactoe_outcome
from ludic.training.config import TrainerConfig
from ludic.types import EnvSpec, RolloutRequest


def parse_rung(rung: str) -> tuple[str, float]:
    """``"random"``, ``"minimax"`` or ``"mixed:EPS"`` (EPS: the share of random moves) -> (opponent, epsilon)."""
    name, _, eps = rung.partition(":")
    if name not in ("random", "mixed", "minimax") or (eps and name != "mixed"):
        raise ValueError(f"opponent ladder rung {rung!r}: use random, minimax or mixed:EPS (EPS in [0, 1])")
    try:
        epsilon = float(eps) if eps else 0.5
    except ValueError:
        raise ValueError(f"opponent ladder rung {rung!r}: EPS must be a number in [0, 1]") from None
    if not 0.0 <= epsilon <= 1.0:
        raise ValueError(f"opponent ladder rung {rung!r}: EPS must be in [0, 1]")
    return name, epsilon


@dataclass
class OutcomeRLConfig:
    """Game-level GRPO settings (outcome reward, an opponent ladder)."""

    games_per_step: int = 16
    """GRPO groups per batch: each is ``group_size`` games from one start (seat and opponent seed)."""
    group_size: int = 8
    ladder: tuple[str, ...] = ("random", "mixed:0.5", "minimax")
    """Opponents, weakest first (``parse_rung``)."""
    promote_at: float = 0.9
    """Move up a rung when the last batch's games against the current rung were non-losses at least this often."""
    replay_fraction: float = 0.25
    """Share of each batch's groups played against the rungs below the current one (none on the first rung)."""
    temperature: float = 1.0
    algorithm: str = "grpo"
    kl_coef: float = 0.0
    entropy_coef: float = 0.0
    max_turns: int = 5
    """A game has at most 5 decisions per side."""
    trainer: TrainerConfig = field(default_factory=lambda: TrainerConfig(lr=1e-4, max_grad_norm=1.0))
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.ladder:
            raise ValueError("OutcomeRLConfig.ladder: name at least one opponent")
        for rung in self.ladder:
            parse_rung(rung)
        if not 0.0 < self.promote_at <= 1.0:
            raise ValueError(f"OutcomeRLConfig.promote_at must be in (0, 1], got {self.promote_at}")


class OpponentLadder:
    """Where the policy stands on the opponent ladder: the current rung, and when it moved up.

    ``observe(rollouts, batch)`` reads one batch's sampled games: when those against the current rung were
    non-losses at least ``promote_at`` of the time, the next batch plays the next rung."""

    def __init__(self, ladder: Sequence[str], promote_at: float, replay_fraction: float, seed: int = 0) -> None:
        self.names = list(ladder)
        self.rungs = [parse_rung(r) for r in ladder]
        self.promote_at, self.replay_fraction = promote_at, replay_fraction
        self.level = 0
        self.promotions: list[tuple[int, str]] = []
        """(RL batch after which it moved up, rung reached)."""
        self.rng = random.Random(seed)

    @property
    def rung(self) -> str:
        return self.names[self.level]

    def batch_levels(self, groups: int) -> list[int]:
        """The rung of each group of a batch: the current one, and ``replay_fraction`` from the rungs below."""
        n_replay = round(groups * self.replay_fraction) if self.level else 0
        return [self.level] * (groups - n_replay) + [self.rng.randrange(self.level) for _ in range(n_replay)]

    def observe(self, rollouts: Sequence[Any], batch: int) -> dict[str, float]:
        current = [r for r in rollouts if r.meta.get("rung") == self.level]
        rate = game_metrics(current)["non_loss_rate"] if current else 0.0
        metrics = {"rung": float(self.level), "rung_non_loss_rate": rate}
        if current and rate >= self.promote_at and self.level + 1 < len(self.names):
            self.level += 1
            self.promotions.append((batch, self.rung))
            print(f"[recipe] RL: non-loss {rate:.0%} against {self.names[self.level - 1]} -> "
                  f"next opponent {self.rung}", flush=True)
        return metrics


class GameGRPO:
    """GRPO on whole games against a ladder of opponents, with the game's outcome as the only reward.

    Same interface as ``PositionGRPO`` (``run(steps, pool, replay, focus)``, ``steps``, ``trainer``), so the
    recipe's rounds (train, evaluate exactly, keep the best) drive either; the positions it is given are
    ignored: games always start from the empty board."""

    def __init__(self, model: Any, tokenizer: Any, client: ChatClient, view: View, cfg: OutcomeRLConfig,
                 run_dir: Path, *, publisher: Any = None, logger: Any = None, total_steps: int = 0) -> None:
        self.cfg, self.view = cfg, view
        self.ladder = OpponentLadder(cfg.ladder, cfg.promote_at, cfg.replay_fraction, cfg.seed)
        self.steps = 0
        self._next_seed = 0

        def factory() -> SingleAgentProtocol:
            return SingleAgentProtocol(view.agent(client, cfg.temperature), stop_on_parse_error=True)

        self.trainer = group_trainer(model, tokenizer, factory, cfg, run_dir, self._requests, self._metrics,
                                     cfg.games_per_step * cfg.group_size, publisher=publisher, logger=logger,
                                     total_steps=total_steps)

    @property
    def promotions(self) -> list[tuple[int, str]]:
        return self.ladder.promotions

    def _requests(self) -> list[RolloutRequest]:
        out = []
        for level in self.ladder.batch_levels(self.cfg.games_per_step):
            opponent, epsilon = self.ladder.rungs[level]
            kwargs = {"opponent": opponent, "epsilon": epsilon, "agent_starts": None, "compact": self.view.compact,
                      "show_moves": self.view.show_moves, "show_opponent_move": False}
            seed = self.cfg.seed * 1_000_003 + self._next_seed  # the seat and the opponent's dice
            self._next_seed += 1
            out.append(RolloutRequest(EnvSpec("tictactoe", kwargs), env_seed=seed, max_steps=self.cfg.max_turns,
                                      meta={"rung": level}))
        return out

    def _metrics(self, rollouts: Sequence[Any]) -> dict[str, float]:
        return {**game_metrics(rollouts), **self.ladder.observe(rollouts, self.steps + 1)}

    async def run(self, steps: int, pool: Sequence[Any] = (), replay: Sequence[Any] = (),
                  focus: Sequence[Any] = (), on_step: Callable[[int, dict], Any] | None = None,
                  focus_weights: Any = None) -> dict[str, Any]:
        """``steps`` batches of games (optimizer steps when any group's games ended differently); the positions
        and their weights are ``PositionGRPO``'s (a game starts from the empty board)."""
        return await train_batches(self, steps, on_step)


def game_metrics(rollouts: Sequence[Any]) -> dict[str, float]:
    """Sampled games' results (``prompts.tictactoe_outcome``): win, draw and loss rates; a forfeit is any other end
    (an illegal or unparsable move, a game cut short, a failed episode)."""
    results = [tictactoe_outcome(r) for r in rollouts]
    n = max(len(results), 1)
    count = {k: results.count(k) for k in ("win", "draw", "loss")}
    return {"win_rate": count["win"] / n, "draw_rate": count["draw"] / n, "loss_rate": count["loss"] / n,
            "forfeit_rate": (len(results) - sum(count.values())) / n,
            "non_loss_rate": (count["win"] + count["draw"]) / n}
