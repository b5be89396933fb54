"""Keep-best (``Trainer(keep_best=...)``): the trainable weights of the best evaluation so far, so a run ends on
them, and every best a resume could need on disk.

The snapshot is a full-precision copy (the fp32 master where a parameter has one) held on the CPU: under full
fine-tuning on a GPU it would otherwise cost 4 bytes a parameter of GPU memory. Each new best is written as
``<checkpoints>/best/step_<N>.safetensors`` (weights, with the record in the metadata; written aside, then
renamed). A file is kept while a checkpoint that a resume could start from precedes the next best: with a best
at step 5, a checkpoint at 10, a new best at 15 and a crash at 17, the run resumed at 10 knows step 5's best.
Bests from after the checkpoint a run resumes from belong to a future the resumed run replays, and are removed.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import torch

BEST_DIR = "best"
LEGACY_BEST_FILE = "best_weights.safetensors"
"""Where runs before the per-step files kept their one best (still read on resume)."""
_NAME = re.compile(r"^step_(\d+)\.safetensors$")


def better(spec: str, value: float, best: dict[str, Any]) -> bool:
    """Whether ``value`` beats (or ties: the later step wins) ``best`` under ``spec`` (``metric``: higher is
    better; ``-metric``: lower is better)."""
    if not best.get("eval"):
        return True
    sign = -1.0 if spec.startswith("-") else 1.0
    return sign * value >= sign * best["value"]


class KeepBest:
    """The best evaluation's record (``best``) and weights (``state``, on the CPU), and their files.

    Args:
        root: the checkpoint directory (None: in memory only).
    """

    def __init__(self, root: str | Path | None) -> None:
        self.root = Path(root) if root is not None else None
        self.best: dict[str, Any] = {}
        """``{"step", "metric", "value", "eval", "last_step", "last_eval", "start"}``: the best and the last evaluation,
        and the first one's ``{"step", "value"}``."""
        self.state: dict[str, torch.Tensor] | None = None
        """The best evaluation's trainable weights at full precision, on the CPU."""

    def consider(self, spec: str, step: int, result: dict[str, Any], snapshot: Any, write: bool = True) -> bool:
        """Record an evaluation at ``step``; when it is the best so far take ``snapshot()`` (name -> tensor) and,
        with ``write``, save it. Returns whether it was the best."""
        key = spec.lstrip("-")
        if key not in result:
            raise KeyError(f"keep_best={spec!r}: the evaluator returned no such metric ({sorted(result)})")
        self.best.update(last_step=step, last_eval=result)
        self.best.setdefault("start", {"step": step, "value": float(result[key])})  # the first evaluation
        if not better(spec, float(result[key]), self.best):
            return False
        self.best.update(step=step, metric=key, value=float(result[key]), eval=result)
        self.state = {n: t.detach().to("cpu", copy=True) for n, t in snapshot().items()}
        if write and self.root is not None:
            self._write()
        return True

    def _write(self) -> None:
        from safetensors.torch import save_file

        assert self.state is not None
        folder = self.root / BEST_DIR
        folder.mkdir(parents=True, exist_ok=True)
        name = f"step_{int(self.best['step']):06d}.safetensors"
        tmp = folder / f".tmp_{name}"
        save_file({k: v.contiguous() for k, v in self.state.items()}, str(tmp),
                  metadata={"best": json.dumps(self.best, default=float)})
        os.replace(tmp, folder / name)
        self.prune()

    def files(self) -> list[tuple[int, Path]]:
        """The saved bests, oldest first."""
        folder = self.root / BEST_DIR if self.root is not None else None
        if folder is None or not folder.is_dir():
            return []
        found = [(int(m.group(1)), p) for p in folder.iterdir() if (m := _NAME.match(p.name))]
        return sorted(found)

    def prune(self) -> None:
        """Remove the bests no resume can need: of those at or before the oldest checkpoint, all but the newest
        (without checkpoints: all but the newest)."""
        from ludic.training.checkpoint import checkpoint_steps

        steps = checkpoint_steps(self.root) if self.root is not None else []
        oldest = min(steps) if steps else None
        files = self.files()
        keep_from = max((i for i, (s, _) in enumerate(files) if oldest is None or s <= oldest), default=0)
        for _, path in files[:keep_from]:
            path.unlink(missing_ok=True)

    def load(self, step: int) -> None:
        """The record and weights of the newest best at or before ``step`` (a run resumed there); bests from
        after it are removed. ({}, None) when there is none."""
        from safetensors import safe_open

        self.best, self.state = {}, None
        files = self.files()
        for s, path in files:
            if s > step:
                path.unlink(missing_ok=True)
        usable = [p for s, p in files if s <= step]
        legacy = self.root / LEGACY_BEST_FILE if self.root is not None else None
        if not usable and legacy is not None and legacy.exists():
            usable = [legacy]
        for path in reversed(usable):
            with safe_open(str(path), framework="pt") as st:
                best = json.loads((st.metadata() or {}).get("best", "{}"))
                if int(best.get("step", step + 1)) <= step:
                    self.best, self.state = best, {k: st.get_tensor(k) for k in st.keys()}
                    return
