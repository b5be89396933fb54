"""The tic-tac-toe recipe's exact evaluations (``ludic recipe tictactoe``): every stage is measured against
minimax and random (both seats, every branch) and on the teacher positions, and its wrong decisions feed the
next RL round (``StageEval.focus`` and ``pool``); ``trainable_state`` keeps the best round's adapter in memory."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


class StageEval:
    """One stage's exact evaluation: metrics per opponent and teacher positions, the wrong
    decisions: ``focus`` (met against minimax: each one loses games the metric counts) and
    ``pool`` (met against random, or among the teacher positions), ``met``: every position the
    policy decided on in the evaluation's games, right or wrong (its own states, against every opponent), and
    ``tree``: those of its games against minimax (every branch of minimax's tie-breaks), the positions the
    minimax metric is made of, and ``reach``: how likely its games against minimax (in that position's seat) reach
    each of them, so a wrong decision there costs at most that share of the seat (``ExactResult.reach``)."""

    def __init__(self, metrics: dict[str, dict[str, float]], focus: list, pool: list, met: list,
                 tree: list | None = None, reach: dict | None = None) -> None:
        self.metrics, self.focus, self.pool, self.met = metrics, focus, pool, met
        self.tree, self.reach = tree or [], reach or {}

    def score(self) -> tuple[float, float, float]:
        """What RL maximises, in order: exact non-loss against minimax, then value-preserving and
        legal moves on the teacher positions (the rounds' checkpoints are compared by it); -1 for positions a
        round did not sweep, so a tie on minimax goes to the round measured on them too."""
        tp = self.metrics.get("teacher_positions") or {"value_preserving_rate": -1.0, "legal_rate": -1.0}
        return self.metrics["minimax"]["non_loss_rate"], tp["value_preserving_rate"], tp["legal_rate"]


def trainable_state(model: Any) -> dict[str, Any]:
    """A copy of the trainable parameters (the RL adapter): a checkpoint in memory."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_trainable_state(model: Any, state: dict[str, Any]) -> None:
    import torch

    params = dict(model.named_parameters())
    with torch.no_grad():
        for n, value in state.items():
            params[n].copy_(value)


class Evaluator:
    """Exact evaluations (vs minimax and random, both seats) and the teacher-position sweep,
    recorded for the report: ``stage_results[stage]`` and the ``curve`` of points over time."""

    def __init__(self, client: Any, view: Any, teacher: list, run_dir: Path) -> None:
        self.client, self.view, self.teacher, self.run_dir = client, view, teacher, run_dir
        self.t0 = time.perf_counter()
        self.stage_results: dict[str, dict[str, dict[str, float]]] = {}
        self.curve: list[dict[str, Any]] = []
        self.positions_seconds = 0.0
        self._last: tuple | None = None  # ((stage, step), results, wrong games, wrong positions, positions met)

    async def positions(self, stage: str, step: int = 0) -> tuple[dict[str, float], list]:
        """The policy's move on every teacher position: legal, best and value-preserving rates (a curve point)."""
        self.curve.append({"stage": stage, "step": step, "t": time.perf_counter() - self.t0})
        self._last = None
        return await self._sweep()

    async def _sweep(self) -> tuple[dict[str, float], list]:
        """The teacher positions' rates and wrong boards, added to the newest curve point."""
        from ludic.tictactoe.position_rl import score_positions

        t0 = time.perf_counter()
        score = await score_positions(self.client, self.teacher, self.view)
        self.positions_seconds = time.perf_counter() - t0
        rates = score.rates()
        self.curve[-1].update({k: rates[k] for k in ("best_move_rate", "value_preserving_rate")})
        return rates, score.wrong

    async def evaluate(self, stage: str, step: int = 0, opponents: tuple[str, ...] = ("minimax", "random"),
                       positions: str = "always") -> StageEval:
        """Exact evaluations against ``opponents``, and the teacher positions (``positions="always"``) or
        (``"if_no_loss"``, between RL rounds) only when those games lost nothing: while they lose, their losing
        decisions are what the next round trains on first and what keep-best ranks first, and the positions are two
        thirds of the evaluation's time. ``stage_results[stage]`` keeps the stage's latest full evaluation (both
        opponents and the positions). The same ``(stage, step)`` asked again (the closing evaluation right after the
        last RL round's) adds only what was not measured yet."""
        from ludic.tictactoe.exact import exact_eval

        if positions not in ("always", "if_no_loss"):
            raise ValueError(f"positions must be 'always' or 'if_no_loss', got {positions!r}")
        if self._last is None or self._last[0] != (stage, step):
            self.curve.append({"stage": stage, "step": step, "t": time.perf_counter() - self.t0})
            self._last = ((stage, step), {}, {"minimax": [], "random": []}, [], {"minimax": {}})
        out, wrong_games, wrong, met = self._last[1:]
        for opponent in opponents:
            if opponent in out:
                continue
            res = await exact_eval(self.client, ctx="last", system_prompt=self.view.system_prompt,
                                   compact=self.view.compact, show_opponent_move=False, show_moves=self.view.show_moves,
                                   opponent=opponent, max_tokens=self.view.max_tokens,
                                   parser=self.view.parser())
            out[opponent] = res.as_metrics()
            wrong_games[opponent] = [d.board for d in res.records if not d.value_preserving]
            # each position met, with how likely the games reach it (StageEval.reach)
            met[opponent] = {b: float(res.reach.get(b, 0)) for b in dict.fromkeys(d.board for d in res.records)}
            with open(self.run_dir / f"decisions_{stage}_{opponent}.jsonl", "w") as f:
                for d in res.records:
                    f.write(json.dumps(d.to_dict()) + "\n")
        lost = any(wrong_games[o] for o in opponents)
        if "teacher_positions" not in out and (positions == "always" or not lost):
            out["teacher_positions"], found = await self._sweep()
            wrong.extend(found)
        self.curve[-1].update({f"{o}_non_loss_rate": out[o]["non_loss_rate"] for o in opponents})
        self.curve[-1].update({f"{o}_{s}_non_loss_rate": out[o][f"{s}/non_loss_rate"]
                               for o in opponents for s in ("x", "o")})
        if set(opponents) >= {"minimax", "random"} and "teacher_positions" in out:
            self.stage_results[stage] = out
        said = [f"vs {o} non-loss X {out[o]['x/non_loss_rate']:.1%} O {out[o]['o/non_loss_rate']:.1%}"
                for o in opponents]
        rates = out.get("teacher_positions")
        print(f"[recipe] {stage} (step {step}): " + " | ".join(said) + (
            f" | teacher positions best {rates['best_move_rate']:.1%} value-preserving "
            f"{rates['value_preserving_rate']:.1%} legal {rates['legal_rate']:.1%}" if rates else
            " | teacher positions not swept (games lost)"), flush=True)
        every = list(dict.fromkeys(b for o in met for b in met[o]))
        return StageEval(dict(out), wrong_games["minimax"], wrong_games["random"] + wrong, every,
                         list(met["minimax"]), dict(met["minimax"]))
