"""What every recipe shares: the default name of its run directory, a clock for its stages and budget,
and a description of the machine its timings were taken on (for reports)."""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any


def default_run_dir(prefix: str, claim: bool = True) -> Path:
    """``runs/<prefix>-<YYYYmmdd-HHMMSS>``: where a run writes when ``--run-dir`` is not given. ``claim``: create it,
    taking ``-2``, ``-3``, ... when another run started in the same second (creating a folder is atomic, so two
    processes never get the same one)."""
    base = Path("runs") / f"{prefix}-{time.strftime('%Y%m%d-%H%M%S')}"
    if not claim:
        return base
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise RuntimeError(f"no free run directory name after {base}")


class Clock:
    """Stage wall times and the budget's deadline."""

    def __init__(self, budget_minutes: float) -> None:
        self.t0 = time.perf_counter()
        self.budget_s = budget_minutes * 60.0
        self.seconds: dict[str, float] = {}

    def elapsed(self) -> float:
        return time.perf_counter() - self.t0

    def left(self) -> float:
        return self.budget_s - self.elapsed() if self.budget_s else math.inf

    def add(self, stage: str, seconds: float) -> None:
        self.seconds[stage] = self.seconds.get(stage, 0.0) + seconds

    def steps_that_fit(self, step_s: float, reserve_s: float, most: int, left: float | None = None) -> int:
        """How many steps of ``step_s`` seconds the time left (or ``left`` seconds) holds after ``reserve_s`` (the
        evaluations still to come), at most ``most`` (a whole round); ``most`` without a budget."""
        if not self.budget_s:
            return most
        left = self.left() if left is None else left
        return max(0, min(most, math.floor((left - reserve_s) / max(step_s, 1e-9))))

    def round_that_fits(self, step_s: float, reserve_s: float, per_round: int, left: float | None = None) -> int:
        """The steps of the next round of a budgeted round loop: ``steps_that_fit``, or 0 (no round: the closing
        evaluation comes) when that is fewer than a quarter of ``per_round``."""
        steps = self.steps_that_fit(step_s, reserve_s, per_round, left)
        return steps if steps >= max(1, per_round // 4) else 0

    def batches_left(self, step_s: float, round_eval_s: float, final_s: float, per_round: int,
                     left: float | None = None) -> int:
        """The steps the rounds still to come will run in the time left (or ``left`` seconds), as a budgeted round
        loop runs them: each round ``round_that_fits`` before its evaluation (``round_eval_s``) and the closing one
        (``final_s``). The length of a learning-rate decay over the budget; 0 without a budget or before a step
        was timed."""
        if not self.budget_s or step_s <= 0:
            return 0
        left, total = self.left() if left is None else left, 0
        while steps := self.round_that_fits(step_s, round_eval_s + final_s, per_round, left):
            total, left = total + steps, left - steps * step_s - round_eval_s
        return total


VAL_SHARE = 0.25
"""Most of ``StepBudget``'s training time that validation evaluations may take."""


class StepBudget:
    """A run fitted to a time budget (``ludic train env --budget-minutes``): training steps go on while the time
    left holds one more step (its mean wall time so far, validation evaluations included) and the end of the run
    (``closing``: the last validation and the closing evaluations, paced by the opening one and the latest
    validation); validation evaluations come every ``1 / evals`` of
    the budget, so a run of any length is measured about ``evals`` times, counted from the end of the last one, and
    a slow one waits for ``(1 - VAL_SHARE) / VAL_SHARE`` times its own duration of training: validation takes at most
    about ``VAL_SHARE`` of the training time, however long an episode is. The clock's start is kept in
    ``<run_dir>/budget.json`` with the seconds spent, so a resumed run spends what is left.

    Args:
        minutes: the whole run's budget (set-up, evaluations and training).
        path: ``budget.json``.
        evals: validation evaluations over the budget.
    """

    def __init__(self, minutes: float, path: Path, evals: int = 8) -> None:
        self.budget_s, self.path, self.evals = minutes * 60.0, path, evals
        spent = 0.0
        try:
            spent = float(__import__("json").loads(path.read_text())["spent_s"])
        except (OSError, ValueError, KeyError, TypeError):
            pass
        self.t0 = time.monotonic() - spent
        self.train_t0: float | None = None
        self.steps = 0
        self.last_eval = time.monotonic()
        """When the last validation ended (or training started)."""
        self.last_eval_s = 0.0
        """How long the last validation took."""
        self.per_eval_s = 0.0
        """Seconds one opening test evaluation took (``plan_closing``)."""
        self.closing_evals = 1
        """Test evaluations at the end of the run (a two-player run adds its league snapshot's)."""
        self.test_per_val = 0.0
        """Test episodes per validation episode: the latest validation, scaled, paces a closing evaluation."""

    def spent(self) -> float:
        return time.monotonic() - self.t0

    def left(self) -> float:
        return self.budget_s - self.spent()

    def eval_due(self) -> bool:
        """Whether a validation evaluation is due: ``budget / evals`` seconds of training since the last one ended,
        and at least ``(1 - VAL_SHARE) / VAL_SHARE`` times its duration. Call ``eval_done`` after it."""
        wait = max(self.budget_s / max(1, self.evals), self.last_eval_s * (1 - VAL_SHARE) / VAL_SHARE)
        return time.monotonic() - self.last_eval >= wait

    def eval_done(self, seconds: float) -> None:
        """A validation evaluation of ``seconds`` just ended."""
        self.last_eval, self.last_eval_s = time.monotonic(), seconds

    def after_step(self) -> bool:
        """Count a training step (and save the clock); whether another one and the closing evaluation still fit."""
        import json

        if self.train_t0 is None:
            self.start_training()
        self.steps += 1
        self.path.write_text(json.dumps({"spent_s": self.spent(), "budget_s": self.budget_s}))
        per_step = (time.monotonic() - self.train_t0) / self.steps
        return self.left() > per_step + self.closing()

    def plan_closing(self, opening_s: float, opening_evals: int, closing_evals: int, test_per_val: float) -> None:
        """What the end of the run will cost, from what its start measured: ``opening_evals`` test evaluations took
        ``opening_s``; the run ends with ``closing_evals`` of them, of ``test_per_val`` times a validation's episodes."""
        self.per_eval_s = opening_s / max(1, opening_evals)
        self.closing_evals, self.test_per_val = closing_evals, test_per_val

    def closing(self) -> float:
        """Seconds the end of the run is expected to take: keep-best's validation of the last step (the latest
        validation's duration) and the closing test evaluations, each at the pace of the opening one or of the
        latest validation scaled to the test episodes, whichever is slower (a trained policy's episodes can run
        longer than the base's), with a 20% margin."""
        per_eval = max(self.per_eval_s, self.test_per_val * self.last_eval_s)
        return 1.2 * per_eval * self.closing_evals + self.last_eval_s

    def start_training(self) -> None:
        """Training begins now: step times count from here."""
        self.train_t0 = time.monotonic()
        self.last_eval = self.train_t0
        self.steps = 0


def machine() -> dict[str, Any]:
    """What the timings were taken on: the CPU (its model name: two machines with the same flags can differ 1.5x in
    steps per minute), its vector extensions and the ones torch was limited to, threads, torch and the GPU."""
    import os
    import platform

    import torch

    flags, model = "", ""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        flags = next((ln for ln in lines if ln.startswith("flags")), "")
        model = next((ln.split(":", 1)[1].strip() for ln in lines if ln.startswith("model name")), "")
    except OSError:
        pass
    isa = [f for f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16") if f" {f}" in flags]
    limited = {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
               if k in os.environ}
    return {"cpus": os.cpu_count(), "torch_threads": torch.get_num_threads(), "isa": isa,
            "kernels": torch.backends.cpu.get_cpu_capability(), "isa_limits": limited,
            "processor": platform.processor() or platform.machine(), "cpu_model": model or None,
            "torch": torch.__version__,
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}


async def train_until_stop(trainer: Any, steps: int, on_step: Any = None) -> tuple[dict[str, Any], BaseException | None]:
    """``trainer.train(steps, on_step)``: (the last step's metrics, the exception that ended it), the exception
    returned instead of raised: the recipe saves its final weights and writes its summary (``trainer.stopped``
    says why it stopped) before raising it, so a stopped run keeps its results. A stop that is not a failure
    (a saturated task) gives None."""
    metrics: dict[str, Any] = {}
    failure: BaseException | None = None
    try:
        metrics = await trainer.train(steps, on_step)
    except BaseException as e:  # noqa: B036  (Ctrl-C too: the recipe still saves, then re-raises)
        failure = e
    if trainer.stopped:
        print(f"[ludic] training stopped at step {trainer.step} ({trainer.stopped['reason']}): "
              f"{trainer.stopped['message']}", flush=True)
    return metrics, failure


def may_evaluate(failure: BaseException | None) -> bool:
    """Whether a run that ``failure`` stopped should still run its closing evaluation: yes after the trainer's own
    stops (no signal, non-finite steps, empty batches) and none, not after Ctrl-C or another exception."""
    from ludic.training.signal import TrainingStopped

    return failure is None or isinstance(failure, TrainingStopped)
