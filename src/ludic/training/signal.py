"""No silent non-learning, and why a run stopped: the share of trained tokens whose advantage is 0, the stop after
``TrainerConfig.max_no_signal_steps`` steps in a row without any signal (``Trainer.train_step``), which is a
success when every sample succeeded (a saturated task) and a failure otherwise, and the record of any stop
(``Trainer.stopped``)."""

from __future__ import annotations

from typing import Any

from ludic import errors
from ludic.distributed import reduce_floats
from ludic.errors import TrainingStopped
from ludic.training.keep_best import better
from ludic.types import SAWItem


def _zero_and_total(items: list[SAWItem]) -> tuple[float, float]:
    """This rank's (action tokens whose weight is 0, action tokens)."""
    zero = total = 0
    for it in items:
        total += it.num_action_tokens
        if it.token_weights is None:  # one weight for the item: no per-token pass
            zero += it.num_action_tokens if it.weight == 0.0 else 0
        else:
            mask = it.action_mask or (1,) * len(it.completion_ids)
            zero += sum(1 for m, w in zip(mask, it.token_weights) if m and w == 0.0)
    return zero, total


def zero_adv_token_share(items: list[SAWItem]) -> float:
    """The share of the action tokens (over all ranks) whose weight is 0; 1.0 for no tokens."""
    zero, total = reduce_floats(list(_zero_and_total(items)))
    return zero / total if total else 1.0


def batch_signal(items: list[SAWItem], meta: dict[str, Any]) -> tuple[float, float]:
    """A batch's (zero_adv_token_share, the share of its action tokens its sample filter kept), over all
    ranks, in one reduction. The tokens a sample filter removed (``filtered_action_tokens`` in the batch
    meta: ``drop_zero_weight`` under DAPO, MMD, tic-tac-toe's position RL) count as tokens without signal,
    so the share is the same with the filter as without it; 1.0 for no tokens."""
    zero, total, dropped = reduce_floats([*_zero_and_total(items), float(meta.get("filtered_action_tokens", 0.0))])
    everything = total + dropped
    return ((zero + dropped) / everything, total / everything) if everything else (1.0, 1.0)


def lr_scale(items: list[SAWItem], kept_token_share: float, cfg: Any) -> float:
    """The factor on one optimizer step's learning rate (``TrainerConfig.scale_lr_by_signal``): the share of
    its tokens with signal (those ``items`` carry, times the share of the batch the filter kept), over
    ``full_step_signal``, at most 1; 1.0 when the option is off."""
    if not cfg.scale_lr_by_signal:
        return 1.0
    return min(1.0, (1.0 - zero_adv_token_share(items)) * kept_token_share / cfg.full_step_signal)


def no_signal_message(streak: int, metrics: dict[str, Any]) -> str:
    """Why ``streak`` steps in a row trained nothing, and what to change."""
    groups = metrics.get("zero_var_group_share")
    why = (f"every group had zero variance (zero_var_group_share={groups:.2f}: all its episodes scored the "
           "same), so " if groups is not None else "")
    return (
        f"{streak} steps in a row had no learning signal: {why}every advantage was 0 and the "
        "policy gradient was 0 (last batch: "
        f"{ {k: metrics[k] for k in ('reward_mean', 'parse_error_rate', 'failed_rate') if k in metrics} }).\n"
        "Likely causes: a format the model never produces (its replies never parse or never contain the "
        "tag the reward looks for: read rollouts.jsonl), a reward that never varies on these prompts (too "
        "hard: every episode fails; too easy: every one succeeds), or groups of one.\n"
        "Fixes: a format cold start (a short SFT on example replies before RL: --format-demos, or "
        "format_demos= in Python), an easier task or curriculum, a larger group or a higher temperature. "
        "max_no_signal_steps sets this limit (0: never stop)."
    )


def saturated(metrics: dict[str, Any]) -> bool:
    """Whether every sampled episode of the batch succeeded (``success_rate`` of the batch metrics)."""
    return metrics.get("success_rate") == 1.0


def no_signal_stop(streak: int, metrics: dict[str, Any]) -> TrainingStopped:
    """The stop after ``streak`` steps without signal: ``saturated`` (a success) when every sample of the last
    batch succeeded, else ``no_signal`` (a failure, with what to change, unless the run had learned:
    ``learned_before_no_signal``)."""
    if saturated(metrics):
        return TrainingStopped(
            "saturated", f"{streak} steps in a row had no learning signal because every sampled episode succeeded "
            "(success_rate 1.0): the task is solved at this sampling temperature, so the run ends here, on its "
            "best weights. A harder task or curriculum gives RL something left to learn.", failed=False,
            metrics=metrics)
    return TrainingStopped("no_signal", no_signal_message(streak, metrics), metrics=metrics)


def nonfinite_stop(streak: int, loss: float, grad_norm: float, scaler: Any = None) -> TrainingStopped:
    """The stop after ``streak`` optimizer steps in a row skipped as non-finite (``max_nonfinite_steps``); under
    fp16, ``scaler`` (``precision.LossScaler``) says whether the last was an overflow at its floor."""
    last = (f", the last an fp16 overflow at loss scale {scaler.scale * 2:g} (1 or less: the unscaled gradient itself is "
            "past fp16's range, which no scale fixes)" if scaler is not None and scaler.past_range else "")
    return TrainingStopped(
        "nonfinite", f"{streak} optimizer steps in a row had a non-finite loss or gradient norm{last} (last: loss {loss}, "
        f"gradient norm {grad_norm}); the weights are those before them. "
        "Likely causes: a NaN or infinite reward or advantage (check the env's rewards and rollouts.jsonl), a "
        "learning rate that made the policy diverge, or fp16 without room in its range (bf16 or fp32 have it). "
        "max_nonfinite_steps sets the limit.")


def stop_record(exc: BaseException, step: int) -> dict[str, Any]:
    """``Trainer.stopped``: ``{"reason", "failed", "step", "message"}`` for a stop by ``exc`` at ``step``
    (``interrupted`` for Ctrl-C or a cancelled task, ``error`` for any other exception)."""
    import asyncio

    if isinstance(exc, TrainingStopped):
        reason, failed = exc.reason, exc.failed
    elif isinstance(exc, (KeyboardInterrupt, asyncio.CancelledError)):
        reason, failed = "interrupted", True
    else:
        reason, failed = "error", True
    message = str(exc) or type(exc).__name__
    if reason == "interrupted" and errors.TERMINATED_BY:  # a Ctrl-C's path, taken for a scheduler's stop
        message = f"stopped by {errors.TERMINATED_BY} at step {step} (kill, a scheduler's time limit or eviction)"
    return {"reason": reason, "failed": failed, "step": step, "message": message}


COLLAPSED_SHARE = 0.9
"""A policy whose evaluation gave one answer in at least this share of its episodes has collapsed onto that answer
(a validation score that rose so is the answers' base rate, likely not the task); ``eval.samples`` warns by it too."""


def learned_before_no_signal(stopped: dict[str, Any], best: dict[str, Any], keep_best: str) -> dict[str, Any]:
    """``stopped`` (``stop_record``) as a success when it is a no-signal stop after keep-best (``keep_best``, its
    record ``best``) kept a step better than the start (``best["start"]``): the policy learned, then its groups
    stopped carrying anything to compare (near-deterministic answers per prompt at this temperature), so the run ends
    on that step, ``failed`` false and ``learned`` true. A no-signal stop that never beat the start (a tie included:
    keep-best keeps the later of two equal steps) stays a failure: a format the model never writes, a reward that
    never varies."""
    start = best.get("start")
    if stopped["reason"] != "no_signal" or not keep_best or start is None or better(keep_best, start["value"], best):
        return stopped  # the start ties or beats the kept step (the start itself, when nothing beat it)
    kept, ev = best["step"], best.get("eval") or {}
    collapsed = ev.get("top_answer_share", 0.0) >= COLLAPSED_SHARE  # the score rose by one answer to everything
    if collapsed:
        head = (f"The run's {best['metric']} rose to {best['value']:.4g} at step {kept} against {start['value']:.4g} "
                f"at the start (step {start['step']}), with one answer ({ev.get('top_answer')!r}) in "
                f"{ev['top_answer_share'] * 100:.0f}% of the validation episodes: the answers' base rate, likely not "
                f"the task (compare with the best constant answer); it ends on step {kept}. ")
    else:
        head = (f"The run learned, then lost its signal: {best['metric']} {best['value']:.4g} at step {kept} against "
                f"{start['value']:.4g} at the start (step {start['step']}), so it ends on step {kept}, not as a "
                "failure. ")
    return {**stopped, "failed": False, "learned": True, **({"collapsed": True} if collapsed else {}),
            "message": head + stopped["message"]}
