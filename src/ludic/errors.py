"""Episode failures: an exception ends its episode as a failed rollout, not the run.

When an env, a reward function, a chat template, a context strategy or a
parser raises, the interaction protocol ends that episode: the agents'
rollouts keep the steps recorded so far and get ``meta`` entries
``failed=True``, ``error`` (``"ValueError: ..."``), ``error_stage`` (where it
happened) and ``error_traceback``; training skips them and the metrics count
them. Code that runs inside an episode names its stage::

    with stage("reward"):
        r = reward_fn(prompt, completion)

Stages used by Ludic: ``env.reset``, ``env.step``, ``reward``, ``context``,
``chat_template`` (rendering or tokenising the prompt), ``parser``, and in the
rollout engine ``env.make``, ``protocol.make`` and ``protocol`` (anything
else that escaped the protocol). Only ``Exception`` is caught:
``asyncio.CancelledError`` and ``KeyboardInterrupt`` still stop the run.
"""

from __future__ import annotations

import logging
import traceback
from contextlib import contextmanager
from typing import Iterator

from ludic.types import JSON

logger = logging.getLogger(__name__)

TRACEBACK_FRAMES = 6
"""Innermost frames kept in ``meta["error_traceback"]``."""


class UsageError(ValueError):
    """A wrong flag or spec from the user (an unknown env kind, kwargs that are not JSON): the command
    line prints its message and exits with status 2, without a traceback."""


class TrainingStopped(RuntimeError):
    """The trainer stopped before its last step (``ludic.training.signal``). ``reason``: ``no_signal``,
    ``saturated`` (every sample right: too easy, not a failure), ``nonfinite`` or ``empty_batches``; ``failed``:
    whether the run failed (the command line then exits with status 3, its results saved; the trainer does not
    raise a ``no_signal`` stop after keep-best kept a step better than the start: ``signal.learned_before_no_signal``);
    ``metrics``: the last batch's metrics (what a caller needs to say why, e.g. every sample illegal rather than
    all alike)."""

    def __init__(self, reason: str, message: str, failed: bool = True, metrics: dict | None = None) -> None:
        super().__init__(message)
        self.reason, self.failed, self.metrics = reason, failed, dict(metrics or {})


class Terminated(KeyboardInterrupt):
    """A SIGTERM (``kill``, ``timeout``, a scheduler's time limit or eviction: Slurm, Kubernetes) under the
    ``ludic`` command: the run stops as after Ctrl-C (checkpoint, final weights and ``summary.json`` saved, its
    ``stopped`` record saying SIGTERM), then the command exits 143. ``cli.stop_on_sigterm`` installs it."""


TERMINATED_BY: str | None = None
"""The signal's name once one stopped the command (``cli.stop_on_sigterm``); the trainer's stop record names it."""


class EpisodeError(Exception):
    """An exception raised in one stage of an episode (the original is ``cause``)."""

    def __init__(self, stage: str, cause: Exception) -> None:
        super().__init__(f"{stage}: {describe(cause)}")
        self.stage = stage
        self.cause = cause


def describe(exc: BaseException) -> str:
    """``"ValueError: message"``."""
    return f"{type(exc).__name__}: {exc}"


@contextmanager
def stage(name: str) -> Iterator[None]:
    """Tag an exception raised inside with the stage ``name`` (the innermost stage wins)."""
    try:
        yield
    except EpisodeError:
        raise
    except Exception as e:
        raise EpisodeError(name, e) from e


def episode_failure(exc: Exception, default_stage: str) -> JSON:
    """Rollout meta for an episode ended by ``exc`` (logged as a warning).

    ``default_stage`` names where an exception that no ``stage`` tagged was caught.
    """
    where, cause = (exc.stage, exc.cause) if isinstance(exc, EpisodeError) else (default_stage, exc)
    error = describe(cause)
    logger.warning("episode failed in %s: %s", where, error)
    frames = traceback.format_exception(type(cause), cause, cause.__traceback__, limit=-TRACEBACK_FRAMES)
    return {"failed": True, "error": error, "error_stage": where, "error_traceback": "".join(frames)}
