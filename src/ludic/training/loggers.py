"""Metric sinks: JSONL in the run directory (always), rich console, wandb, TensorBoard.

``make_logger("rich,wandb", run_dir, config)`` combines them; a sink that
fails (wandb not installed, disk full) is reported once and dropped instead
of killing the run.
"""

from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path
from typing import Any, Protocol

from ludic.progress import Progress, format_seconds


class MetricsLogger(Protocol):
    def log(self, step: int, metrics: dict[str, Any]) -> None: ...

    def close(self) -> None: ...


def _scalars(metrics: dict[str, Any]) -> dict[str, float]:
    out = {}
    for k, v in metrics.items():
        if isinstance(v, bool):
            out[k] = float(v)
        elif isinstance(v, (int, float)):
            out[k] = float(v)
        elif hasattr(v, "item") and getattr(v, "numel", lambda: 0)() == 1:
            out[k] = float(v.item())
    return out


class JsonlLogger:
    """One JSON object per logged step in ``<run_dir>/metrics.jsonl``."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._f = self.path.open("a")

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        rec = {"step": step, "time": time.time(), **_scalars(metrics)}
        rec = {k: (None if isinstance(v, float) and not math.isfinite(v) else v) for k, v in rec.items()}
        self._f.write(json.dumps(rec) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


KEY_METRICS = (
    "loss", "reward_mean", "win_rate", "draw_rate", "loss_rate", "illegal_rate",
    "parse_error_rate", "zero_var_group_share", "grad_norm", "lr", "step_s", "train_tokens_per_s", "episodes_per_s",
)
"""Shown on the console every step, with every ``env/*`` metric (an environment's own, e.g. its success
rate) and every ``eval/*`` one."""


class RichLogger:
    """The console view of a training run: a line per step with the key metrics above a progress bar
    (count, ETA, loss/reward) on a terminal; off a terminal, a ``ludic.progress`` line (with the ETA) at
    the first and last step, at every step with eval metrics, and otherwise at most every
    ``LUDIC_PROGRESS_EVERY`` seconds, so CI logs stay short."""

    def __init__(self, total_steps: int | None = None, keys: tuple[str, ...] = KEY_METRICS, desc: str = "train",
                 label: str = "") -> None:
        self.keys, self.label = keys, label
        """``label``: a stage's name before each step line (``[format demos] step 1/10``), so a cold start's SFT
        steps do not read as RL steps."""
        self.progress = Progress(desc, total_steps, unit="step", stream=sys.stdout)
        self._first = True

    @property
    def total(self) -> int | None:
        return self.progress.total

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        vals = _scalars(metrics)
        if "planned_steps" in vals:  # a time-budgeted stage learns its step count after calibrating
            self.progress.set_total(int(vals["planned_steps"]))
        shown = {k: vals[k] for k in self.keys if k in vals}
        evals = {k: v for k, v in vals.items() if k.startswith(("env/", "eval/"))}
        bar = self.progress
        first, self._first = self._first, False
        if first:  # the ETA counts the steps after this one, in this process: not the evaluations and set-up
            bar.n, bar.start, bar.t0 = step - 1, step, time.monotonic()  # before it (a resumed run starts mid-way)
        head = (f"[{self.label}] " if self.label else "") + f"step {step}" + (f"/{self.total}" if self.total else "")
        text = "  ".join(f"{k}={v:.4g}" for k, v in {**shown, **evals}.items())
        brief = {k: shown[k] for k in ("loss", "reward_mean", "win_rate") if k in shown}
        if bar.mode == "bar":
            bar.console.print(f"[bold cyan]{head}[/]  {text}", highlight=False)
            bar.update(step - bar.n, **brief)
        elif bar.mode == "lines":
            last = self.total is not None and step >= self.total
            bar.n, bar.metrics = step, brief
            if first or last or evals or bar.due():
                eta = bar.eta_s()
                bar.write_line(f"{head}  {text}" + (f"  eta {format_seconds(eta)}" if eta is not None and not last else ""))

    def close(self) -> None:
        if self.progress.mode == "bar":
            self.progress.close()
        self.progress.closed = True


class WandbLogger:
    """Weights & Biases sink (set WANDB_MODE=offline to run without network)."""

    def __init__(self, run_dir: Path, config: dict[str, Any], project: str | None = None, name: str | None = None):
        import os

        import wandb

        self.wandb = wandb
        self.run = wandb.init(
            project=project or os.environ.get("WANDB_PROJECT", "ludic"), name=name or run_dir.name,
            dir=str(run_dir), config=config, reinit=True,
        )

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        self.run.log(_scalars(metrics), step=step)

    def close(self) -> None:
        self.run.finish()


class TensorBoardLogger:
    def __init__(self, run_dir: Path) -> None:
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(run_dir / "tensorboard"))

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for k, v in _scalars(metrics).items():
            self.writer.add_scalar(k, v, step)

    def close(self) -> None:
        self.writer.close()


class MultiLogger:
    """Fan out to several sinks; a failing sink is reported once and dropped."""

    def __init__(self, loggers: list[Any]) -> None:
        self.loggers = loggers

    def log(self, step: int, metrics: dict[str, Any]) -> None:
        for lg in list(self.loggers):
            try:
                lg.log(step, metrics)
            except Exception as e:
                print(f"[ludic] logger {type(lg).__name__} failed and is disabled: {e}", file=sys.stderr)
                self.loggers.remove(lg)

    def close(self) -> None:
        for lg in self.loggers:
            try:
                lg.close()
            except Exception as e:  # a sink that cannot close (a report that cannot render) never kills the run
                print(f"[ludic] logger {type(lg).__name__} failed to close: {type(e).__name__}: {e}", file=sys.stderr)


LOGGER_NAMES = ("rich", "print", "wandb", "tensorboard", "none")


def logger_names(spec: str) -> list[str]:
    """The sinks of a ``--logger`` spec (comma- or plus-separated); an unknown one is a ValueError
    naming it, so a recipe can check its flag before minutes of work, not when it first logs."""
    names = [s.strip() for s in spec.replace("+", ",").split(",") if s.strip()]
    for name in names:
        if name not in LOGGER_NAMES:
            raise ValueError(f"unknown logger {name!r} in --logger {spec!r}: use {', '.join(LOGGER_NAMES)}")
    return names


def make_logger(spec: str, run_dir: Path, config: dict[str, Any], total_steps: int | None = None) -> MultiLogger:
    """``spec``: comma- or plus-separated from {rich, print, wandb, tensorboard, none}; JSONL is always on,
    and ``report.html`` (``ludic.report``) is written when the logger closes."""
    from ludic.report import ReportLogger

    loggers: list[Any] = [JsonlLogger(run_dir / "metrics.jsonl")]
    for name in logger_names(spec):
        if name in ("rich", "print"):
            loggers.append(RichLogger(total_steps, desc=run_dir.name or "train"))
        elif name == "wandb":
            loggers.append(WandbLogger(run_dir, config))
        elif name == "tensorboard":
            loggers.append(TensorBoardLogger(run_dir))
    return MultiLogger(loggers + [ReportLogger(run_dir)])
