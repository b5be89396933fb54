"""A curriculum over tasks: stages of rising difficulty, and replay of past failures.

    cur = Curriculum([Stage("easy", {"opponent": "random"}), Stage("hard", {"opponent": "mcts"})])
    task, replayed = cur.draw(lambda rng: {"task_id": rng.randrange(10**8)})
    kwargs = {**task, **cur.stage.overrides}     # the stage's settings reach the env
    ...
    cur.update(task, score=0.2)                   # after the episode

- **Progression**: once the last ``window`` episodes of the current stage reach ``threshold``
  success (score > 0.5), the next stage starts (its window starts empty).
- **Replay**: with probability ``replay_share`` (and a non-empty buffer) a task is drawn from
  past failures (score < 0.5 or no success), weighted by 1 - score; the buffer keeps the last
  ``buffer_size`` failures.
- ``metrics()`` gives the stage index, the window's success rate and the replay share of the
  draws since the last call; ``state_dict()`` holds everything, for checkpoints.

Nothing here knows the env: tasks are plain JSON dicts (env kwargs), stages are dicts of
overrides. ``ludic.recipes.games`` builds the easy -> medium -> hard opponent ladder on it.
"""

from __future__ import annotations

import random
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

from ludic.rollouts.engine import rng_state, set_rng_state


@dataclass(frozen=True)
class Stage:
    name: str
    overrides: dict[str, Any] = field(default_factory=dict)
    """Settings every task of this stage gets (e.g. the opponent)."""


class Curriculum:
    def __init__(self, stages: list[Stage], *, threshold: float = 0.7, window: int = 100, replay_share: float = 0.3,
                 buffer_size: int = 1000, seed: int = 0) -> None:
        if not stages:
            raise ValueError("Curriculum needs at least one stage")
        if not 0.0 <= replay_share <= 1.0:
            raise ValueError(f"replay_share must be in [0, 1], got {replay_share}")
        self.stages, self.threshold, self.window = stages, threshold, window
        self.replay_share, self.buffer_size = replay_share, buffer_size
        self.rng = random.Random(seed)
        self.index = 0
        self.recent: deque[bool] = deque(maxlen=window)
        self.failures: deque[tuple[dict[str, Any], float]] = deque(maxlen=buffer_size)
        self._draws = self._replays = 0

    @property
    def stage(self) -> Stage:
        return self.stages[self.index]

    def draw(self, fresh: Callable[[random.Random], dict[str, Any]]) -> tuple[dict[str, Any], bool]:
        """A task: a weighted past failure (``replay_share`` of the time) or ``fresh(rng)``."""
        self._draws += 1
        if self.failures and self.rng.random() < self.replay_share:
            weights = [max(1.0 - score, 1e-3) for _, score in self.failures]
            task, _ = self.rng.choices(list(self.failures), weights=weights)[0]
            self._replays += 1
            return dict(task), True
        return fresh(self.rng), False

    def update(self, task: dict[str, Any], score: float, success: bool | None = None) -> None:
        """Record an episode of ``task``; may advance the stage."""
        success = score > 0.5 if success is None else success
        if not success or score < 0.5:
            self.failures.append((dict(task), float(score)))
        self.recent.append(bool(success))
        if (len(self.recent) == self.window and sum(self.recent) / self.window >= self.threshold
                and self.index + 1 < len(self.stages)):
            self.index += 1
            self.recent.clear()
            print(f"[curriculum] stage {self.index}: {self.stage.name}", flush=True)

    def metrics(self) -> dict[str, float]:
        out = {"curriculum/stage": float(self.index),
               "curriculum/window_success": sum(self.recent) / len(self.recent) if self.recent else 0.0,
               "curriculum/replay_share": self._replays / self._draws if self._draws else 0.0,
               "curriculum/failures": float(len(self.failures))}
        self._draws = self._replays = 0
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"index": self.index, "recent": list(self.recent), "rng": rng_state(self.rng),
                "failures": [[t, s] for t, s in self.failures]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.index = int(state["index"])
        self.recent = deque((bool(x) for x in state["recent"]), maxlen=self.window)
        self.failures = deque(((dict(t), float(s)) for t, s in state["failures"]), maxlen=self.buffer_size)
        set_rng_state(self.rng, state["rng"])
