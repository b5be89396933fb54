"""The learner side of the Tinker backend: SAW items -> ``tinker.types.Datum`` -> ``forward_backward`` +
``optim_step`` on the service, then new weights for the sampler.

Rollouts, credit and batching are Ludic's (``RolloutBatchSource``); only the gradient step and the
weights live on the service. One datum per SAW item::

    model_input    prompt + completion, minus the last token
    target_tokens  the same sequence shifted by one
    logprobs       the sampler's log-prob at each sampled (action_mask 1) position, 0 elsewhere
    advantages     the token's credit at sampled positions, 0 elsewhere (prompt, env and template
                   tokens are not trained)

Tinker's losses sum over tokens; the advantages are divided by the batch's sampled-token count so a
step is the token mean, as Ludic's own ``token`` normaliser. ``importance_sampling`` is REINFORCE with
the ratio to the sampler; ``ppo`` clips it.
"""

from __future__ import annotations

import math
import time
from typing import Any, Sequence

from ludic.training.losses import refuse_truncated_sampling
from ludic.types import SAWItem

LOSSES = ("importance_sampling", "ppo", "cross_entropy")
RATIO_LOSSES = ("importance_sampling", "ppo")
"""The Tinker losses that divide by the sampler's probabilities."""


def saw_to_datum(item: SAWItem, scale: float = 1.0, loss_fn: str = "importance_sampling") -> Any:
    """One ``tinker.types.Datum`` for ``item``; ``scale`` multiplies every advantage (the normaliser).
    ``cross_entropy`` gets ``weights`` (``scale`` at sampled positions) instead of logprobs/advantages."""
    from tinker import types

    tokens = list(item.prompt_ids) + list(item.completion_ids)
    if len(tokens) < 2 or not item.completion_ids:
        raise ValueError(f"SAW item {item.meta.get('rollout_id', '?')} has no completion to train on")
    n, p = len(tokens) - 1, len(item.prompt_ids)
    mask = item.action_mask or (1,) * len(item.completion_ids)
    weights = item.token_weights or (item.weight,) * len(item.completion_ids)
    sampled = item.logprobs or (0.0,) * len(item.completion_ids)
    adv, logp, ce = [0.0] * n, [0.0] * n, [0.0] * n
    for j, m in enumerate(mask):
        if m:
            adv[p - 1 + j] = float(weights[j]) * scale
            logp[p - 1 + j] = float(sampled[j])
            ce[p - 1 + j] = scale

    def tensor(values: list, dtype: str) -> Any:
        return types.TensorData(data=values, dtype=dtype, shape=[n])

    inputs = {"target_tokens": tensor(tokens[1:], "int64")}
    if loss_fn == "cross_entropy":
        inputs["weights"] = tensor(ce, "float32")
    else:
        inputs.update(logprobs=tensor(logp, "float32"), advantages=tensor(adv, "float32"))
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=inputs)


def refuse_unknown_logprobs(items: Sequence[SAWItem], loss_name: str) -> None:
    """Raise for an item with no sampler log-prob at a trained token (None, or NaN: a reply the policy did not
    sample, such as ``FunctionClient(logprob=nan)``'s exploring moves). The local ``Trainer`` scores those with a
    ratio of 1 (the new log-prob as the old), which one Tinker call cannot do: the service divides by what it is
    sent, so a NaN would poison the batch's loss and a stand-in 0.0 would weight the token by its probability."""
    for it in items:
        mask = it.action_mask or (1,) * len(it.completion_ids)
        if it.logprobs is None or any(m and math.isnan(lp) for m, lp in zip(mask, it.logprobs)):
            raise ValueError(
                f"item {it.meta.get('rollout_id', '?')} (step {it.meta.get('step_index', '?')}) has an unknown "
                f"sampler log-prob at a trained token, and the {loss_name!r} loss divides by it. Sample every "
                "trained reply from the policy (e.g. explore='hotter' instead of 'uniform'), or use the "
                "cross_entropy loss.")


class TinkerLearner:
    """Trains a ``tinker.TrainingClient`` on SAW batches and hands each new version to the sampler.

    Args:
        training_client: from ``ServiceClient.create_lora_training_client``.
        client: the ``TinkerChatClient`` the agents sample from (its sampler is replaced after a step).
        loss_fn: importance_sampling | ppo | cross_entropy.
        lr: Adam learning rate; ``grad_clip_norm`` 0 is off.
    """

    def __init__(self, training_client: Any, client: Any, *, loss_fn: str = "importance_sampling", lr: float = 4e-5,
                 grad_clip_norm: float = 0.0, name: str = "ludic") -> None:
        if loss_fn not in LOSSES:
            raise ValueError(f"unknown Tinker loss {loss_fn!r}: use {', '.join(LOSSES)}")
        self.training_client, self.client = training_client, client
        self.loss_fn, self.lr, self.grad_clip_norm, self.name = loss_fn, lr, grad_clip_norm, name
        self.version = 0

    async def publish(self) -> dict[str, Any]:
        """New sampler weights from the current training state (version + 1)."""
        t0 = time.perf_counter()
        self.version += 1
        sampler = await self.training_client.save_weights_and_get_sampling_client(name=f"{self.name}-v{self.version}")
        self.client.set_sampler(sampler, self.version)
        return {"policy_version": self.version, "publish_s": time.perf_counter() - t0}

    async def step(self, items: Sequence[SAWItem]) -> dict[str, Any]:
        """One optimizer step on ``items`` (one forward_backward, one optim_step), then publish."""
        from tinker import types

        t0 = time.perf_counter()
        if not items:
            return {"skipped_empty_batch": 1.0, **await self.publish()}
        if self.loss_fn in RATIO_LOSSES:
            refuse_truncated_sampling(items, self.loss_fn)
            refuse_unknown_logprobs(items, self.loss_fn)
        tokens = sum(it.num_action_tokens for it in items)
        data = [saw_to_datum(it, 1.0 / max(1, tokens), self.loss_fn) for it in items]
        fb = self.training_client.forward_backward(data, self.loss_fn)  # both submitted before waiting
        opt = self.training_client.optim_step(types.AdamParams(learning_rate=self.lr, grad_clip_norm=self.grad_clip_norm))
        out = await fb
        await opt
        t1 = time.perf_counter()
        metrics: dict[str, Any] = {f"tinker/{k}": float(v) for k, v in (out.metrics or {}).items()}
        new_lp, old_lp = [], []
        for it, o in zip(items, out.loss_fn_outputs):  # the service's log-probs vs the sampler's: drift
            lp = o["logprobs"].tolist()
            p = len(it.prompt_ids)
            mask = it.action_mask or (1,) * len(it.completion_ids)
            for j, m in enumerate(mask):
                if m and it.logprobs is not None:
                    new_lp.append(lp[p - 1 + j])
                    old_lp.append(it.logprobs[j])
        if new_lp:
            metrics["sampler_logprob_gap"] = sum(abs(a - b) for a, b in zip(new_lp, old_lp)) / len(new_lp)
        metrics.update({"items": float(len(items)), "action_tokens": float(tokens), "train_s": t1 - t0})
        metrics.update(await self.publish())
        return metrics
