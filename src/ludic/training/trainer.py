"""Trainer: the optimisation loop, and only that.

Before the first step the starting weights are published (``publish_start``). One ``train_step``:
    1. pull a SAWBatch from the batch source (sync rollouts, offline data or Redis);
    2. drop items older than ``max_lag`` policy versions; cut items to ``max_seq_len``
       (both counted); a batch empty on every rank is not a step;
    3. ``ppo_epochs`` x ``num_minibatches`` optimizer steps (one by default), each:
       whole-batch normalisers (trained tokens, episodes; all-reduced across ranks);
       micro-batches sized by ``micro_batch_mb`` (``training.memory``; or ``micro_token_budget``), each scored
       at its sampling temperature, ``compute_loss``, ``backward`` (micro-batch losses sum to the batch loss);
       gradients all-reduced across ranks (data parallel, every rank joins; FSDP2 does its own); clip; AdamW
       step; fp32 master weights of low-precision parameters rounded back into the model (``precision``);
    4. LR schedule; bump the policy version and publish weights; 5. checkpoint and log.

Everything algorithm-specific lives in the ``Algorithm`` (credit + LossConfig). Beside the trainer: ``objective``
(score a micro-batch, apply the loss), ``data_parallel`` (sums over ranks), ``reference`` (the KL reference),
``precision`` (fp32 masters, AdamW, LR schedule), ``keep_best``, ``signal`` (stops) and ``checkpoint``.
"""

from __future__ import annotations

import math
import random
import time
import dataclasses
from dataclasses import asdict
from pathlib import Path
from typing import Any, Awaitable, Callable

import torch

from ludic import fastpath
from ludic.distributed import broadcast_float, is_rank0, is_sharded, reduce_floats
from ludic.inference.models import mark_trained
from ludic.training.fsdp import full_state_dict
from ludic.rollouts.batch import BatchSource
from ludic.training.algorithms import Algorithm
from ludic.training.frozen_cache import FrozenBottomCache
from ludic.training.microbatch import admit_items, collate, split_by_token_budget
from ludic.training.checkpoint import kill_point, latest_checkpoint, load_checkpoint, load_master_weights, save_checkpoint
from ludic.training.config import TrainerConfig
from ludic.training.data_parallel import (all_reduce_grads, global_totals, idle_forward_backward, sum_over_ranks,
                                          token_means_over_ranks)
from ludic.training.losses import refuse_truncated_sampling
from ludic.training.memory import micro_batch_budget
from ludic.training.objective import SUMMED_STATS, Objective, policy_gradient_objective
from ludic.tokenization import pad_token_id_for
from ludic.training.packed import packable
from ludic.training.precision import MasterWeights, lr_scaled, make_optimizer, make_scheduler, needs_loss_scaling
from ludic.training.reference import REFERENCE_FILE, ReferencePolicy, adapt_kl
from ludic.training.keep_best import KeepBest
from ludic.training.signal import TrainingStopped, batch_signal, lr_scale, no_signal_stop, nonfinite_stop, stop_record
from ludic.training.signal import learned_before_no_signal
from ludic.types import SAWItem


class Trainer:
    """Optimises ``model`` on batches from ``batch_source`` with ``algorithm``'s loss.

    Args:
        model: HF causal LM (peft-wrapped for LoRA); trainable params are those with requires_grad. Weights loaded
            into it mid-run become the fp32 masters of a bf16 / fp16 model, with a warning (``precision.MasterWeights.sync``).
        algorithm: credit + loss (the batch source applies the credit).
        batch_source: ``async next_batch() -> SAWBatch``.
        config: TrainerConfig.
        publisher: object with ``publish(model, version) -> dict`` (in-process engine, vLLM servers).
        logger: metrics sink (``log(step, metrics)``).
        checkpoint_dir: where checkpoints go (None disables them).
        tokenizer: saved with checkpoints so they load as HF folders.
        ref_model: frozen reference for a KL penalty (or DPO). Default: the policy at the first optimizer step of
            a fresh run, so a cold start trained before it is part of the reference (``training.reference``: the
            base with adapters off while the adapter is fresh, else a snapshot; a frozen copy with full fine-tuning).
        pad_token_id: padding id for collation (default: the tokenizer's pad id, else its or the
            model's eos id; an error when none can be found).
        evaluator: ``async () -> {metric: value}`` on held-out data, called every ``eval_every``
            steps and at the last step of ``train`` (logged as ``eval/<metric>``).
        eval_every: evaluate every this many steps (0: only at the last step of ``train``).
        keep_best: keep the best weights by this evaluator metric (``success_rate``: higher is better;
            ``-nash_conv``: lower is better; a tie goes to the later step): ``train`` ends on the best
            evaluation's weights, the start among them (saved in ``checkpoint_dir`` when found, so a resume keeps
            them); ``trainer.best`` says which step and what the last scored. Evaluate on validation data. "": off.
        objective: per-micro-batch ``(trainer, micro_batch, totals) -> (loss, stats)``;
            defaults to the policy-gradient objective of ``algorithm.loss`` (DPO supplies its own).
        group_key: item meta key whose items must share a micro-batch (e.g. DPO pairs).
    """

    def __init__(
        self,
        model: Any,
        algorithm: Algorithm,
        batch_source: BatchSource,
        config: TrainerConfig | None = None,
        *,
        publisher: Any | None = None, logger: Any | None = None,
        checkpoint_dir: str | Path | None = None,
        tokenizer: Any | None = None, ref_model: Any | None = None,
        pad_token_id: int | None = None,
        objective: Objective | None = None,
        group_key: str | None = None,
        evaluator: Callable[[], Awaitable[dict[str, float]]] | None = None,
        eval_every: int = 0,
        keep_best: str = "",
    ) -> None:
        self.model, self.algorithm, self.source, self.cfg = model, algorithm, batch_source, config or TrainerConfig()
        loss = getattr(algorithm, "loss", None)
        if getattr(loss, "behavior_is", None) and (self.cfg.ppo_epochs > 1 or self.cfg.num_minibatches > 1):
            raise ValueError(
                f"behavior_is={loss.behavior_is!r} takes the learner's log-probs at the start of a batch from "
                f"the pass that scores it, so it needs one pass per batch: ppo_epochs={self.cfg.ppo_epochs} and "
                f"num_minibatches={self.cfg.num_minibatches} must both be 1")
        self.publisher = publisher
        self.logger = logger
        self.checkpoint_dir = Path(checkpoint_dir) if checkpoint_dir else None
        self.tokenizer = tokenizer
        self.reference = ReferencePolicy(model, algorithm, ref_model)
        """The KL / DPO reference policy, fixed at the first optimizer step of a fresh run."""
        self.pad_token_id = pad_token_id_for(pad_token_id, tokenizer, model)
        self.evaluator, self.eval_every, self.keep_best = evaluator, eval_every, keep_best
        self.keeper = KeepBest(self.checkpoint_dir)
        """keep_best's best evaluation: its record (``trainer.best``), weights on the CPU, and files."""
        self.stopped: dict[str, Any] | None = None
        """Why the last ``train`` ended before its last step (``signal.stop_record``); None when it ran them all."""
        self.objective = objective or policy_gradient_objective
        self.group_key = group_key
        self.step = 0
        self.policy_version = 0
        self.empty_streak = 0
        """Batches in a row that had no trainable item on any rank."""
        self.nonfinite_streak = 0
        """Optimizer steps in a row skipped for a non-finite loss or gradient norm."""
        self.no_signal_streak = 0
        """Steps in a row in which every trained token had advantage 0 (``max_no_signal_steps``)."""
        self.nonfinite_total = 0  # the four counters are checkpointed (``_streaks``)
        self.started = False
        """Whether the starting weights were published (``publish_start``)."""
        self.device = next(model.parameters()).device
        if self.cfg.gradient_checkpointing and hasattr(model, "gradient_checkpointing_enable"):
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        params = [p for p in model.parameters() if p.requires_grad]
        if not params:
            raise ValueError("Trainer: the model has no trainable parameters")
        self.bottom_cache = FrozenBottomCache.of(model, self.cfg.cache_frozen_bottom)
        """Outputs of the frozen bottom layers per item or prompt (``TrainerConfig.cache_frozen_bottom``)."""
        self.masters = MasterWeights(params, enabled=self.cfg.master_weights, loss_scaling=needs_loss_scaling(model))
        """fp32 master weights of the low-precision trainable parameters (``training.precision``)."""
        self.optimizer = make_optimizer(self.masters.params, self.cfg)
        self.scheduler = make_scheduler(self.optimizer, self.cfg)

    # -- one optimizer step ---------------------------------------------------
    async def train_step(self) -> dict[str, Any]:
        """Pull one batch and take one optimizer step on it.

        A batch with no trainable item on any rank (every rollout failed, every
        item stale or too long) is not a step: the step counter, LR schedule,
        policy version and publish stay put, ``empty_batch`` is logged, and
        ``max_empty_steps`` such batches in a row stop the run with an error.
        """
        with fastpath.scoped(self.cfg.fast_path):  # the rollouts too, when the source samples in process
            return await self._train_step()

    async def _train_step(self) -> dict[str, Any]:
        t0 = time.perf_counter()
        if not self.started:
            self.publish_start()
        batch = await self.source.next_batch()
        t_data = time.perf_counter() - t0
        items, admitted = admit_items(batch.items, self.policy_version, self.cfg.max_lag, self.cfg.max_seq_len)
        metrics: dict[str, Any] = {k: v for k, v in batch.meta.items() if isinstance(v, (int, float, bool))}
        metrics.update(admitted, data_s=t_data)
        if reduce_floats([len(items)])[0] == 0:  # no trainable item on any rank
            return self._empty_step(metrics)
        self.empty_streak = 0
        share, kept = batch_signal(items, batch.meta)
        self.no_signal_streak = self.no_signal_streak + 1 if share == 1.0 else 0
        metrics.update(zero_adv_token_share=share, no_signal_streak=self.no_signal_streak)
        metrics.update(self.optimize_batch(items, kept))
        self.algorithm = adapt_kl(self.algorithm, self.cfg, metrics, len(items))
        self.scheduler.step()
        self.step += 1
        self.policy_version += 1
        if self.publisher is not None and self.step % self.cfg.publish_every == 0:
            pub = self.publisher.publish(self.model, self.policy_version) or {}
            metrics.update({f"publish_{k}": v for k, v in pub.items()})
        if self.checkpoint_dir and self.cfg.checkpoint_every and self.step % self.cfg.checkpoint_every == 0:
            self.save()
        metrics.update(step_s=time.perf_counter() - t0, policy_version=self.policy_version)
        if self.logger is not None:
            self.logger.log(self.step, metrics)
        kill_point(self.step)
        if self.cfg.max_no_signal_steps and self.no_signal_streak >= self.cfg.max_no_signal_steps:
            raise no_signal_stop(self.no_signal_streak, metrics)
        return metrics

    def publish_start(self) -> dict[str, Any]:
        """Publish the starting weights (fresh, resumed or ``--adapter``) before the first rollout.

        A reused inference server may be ahead (an earlier run pushed version 7): the trainer
        adopts it and publishes its weights as the next version, so every later push is newer and
        versions stay monotonic. ``reset_server_version`` forces the server back to this
        trainer's version instead. In-process engines (no ``server_version``) just take the version.
        A resumed learner whose dead predecessor announced versions past the checkpoint (the
        pipeline) takes the next number too: the versions in between name weights that no longer
        exist, and a batch source with ``discard_versions`` drops what they sampled.
        """
        self.started = True
        if self.publisher is None:
            return {}
        remote = self.publisher.server_version() if hasattr(self.publisher, "server_version") else None
        remote = int(broadcast_float(remote if remote is not None else -1))  # only rank 0 talks to servers
        force = self.cfg.reset_server_version and remote >= 0
        if remote >= self.policy_version and not force:
            if remote > self.policy_version and hasattr(self.source, "discard_versions"):
                self.source.discard_versions(self.policy_version + 1, remote)
            self.policy_version = remote + 1
        out = self.publisher.publish(self.model, self.policy_version, **({"force": True} if force else {})) or {}
        return {f"publish_{k}": v for k, v in out.items()}

    def _empty_step(self, metrics: dict[str, Any]) -> dict[str, Any]:
        self.empty_streak += 1
        metrics.update(empty_batch=True, empty_streak=self.empty_streak, policy_version=self.policy_version)
        if self.logger is not None:
            self.logger.log(self.step, metrics)
        if self.empty_streak >= self.cfg.max_empty_steps:
            raise TrainingStopped(
                "empty_batches", f"{self.empty_streak} empty batches in a row (no trainable item on any rank; last batch: "
                f"{ {k: metrics[k] for k in ('num_rollouts', 'failed_rate', 'stale_dropped', 'seq_dropped') if k in metrics} }). "
                "Check rollouts.jsonl for failed episodes, max_lag, max_seq_len; max_empty_steps sets the limit.",
                metrics=metrics)
        return metrics

    def optimize_batch(self, items: list[SAWItem], kept_token_share: float = 1.0) -> dict[str, Any]:
        """All optimizer steps on one collected batch: ``ppo_epochs`` shuffled passes of
        ``num_minibatches`` steps each (one step when both are 1, the default). ``kept_token_share``: the
        share of the batch's action tokens its sample filter kept (``signal.batch_signal``).

        Returns the metrics of the steps averaged, with the clip fraction, ratio and loss of
        each pass under ``<name>/epoch_<e>``.
        """
        c = self.cfg
        if c.ppo_epochs == 1 and c.num_minibatches == 1:
            return self.optimize(items, kept_token_share)
        steps: list[dict[str, Any]] = []
        out: dict[str, Any] = {}
        for epoch in range(c.ppo_epochs):
            order = list(items)
            random.Random(self.step * 1_000_003 + epoch).shuffle(order)  # same on every rank, resumable
            k, r = divmod(len(order), c.num_minibatches)
            bounds = [i * k + min(i, r) for i in range(c.num_minibatches + 1)]
            epoch_steps = [self.optimize(order[bounds[i]:bounds[i + 1]], kept_token_share) for i in range(c.num_minibatches)]
            steps += epoch_steps
            for key in ("clip_frac", "ratio_mean", "ratio_max", "loss"):
                vals = [m[key] for m in epoch_steps if key in m]
                if vals:
                    out[f"{key}/epoch_{epoch}"] = max(vals) if key == "ratio_max" else sum(vals) / len(vals)
        for key in steps[0]:
            vals = [m[key] for m in steps if isinstance(m.get(key), (int, float))]
            if vals:
                out.setdefault(key, sum(vals) / len(vals))
        train_s = sum(m["train_s"] for m in steps)
        train_tokens = sum(m["train_tokens"] for m in steps)
        out.update(num_items=len(items), optimizer_steps=len(steps), train_s=train_s, train_tokens=train_tokens,
                   action_tokens=sum(m["action_tokens"] for m in steps[: c.num_minibatches]),
                   train_tokens_per_s=train_tokens / train_s if train_s > 0 else 0.0)
        return out

    def optimize(self, items: list[SAWItem], kept_token_share: float = 1.0) -> dict[str, Any]:
        """One optimizer step on ``items`` (synchronous; the LR schedule is stepped by the caller)."""
        with fastpath.scoped(self.cfg.fast_path):
            return self._optimize(items, kept_token_share)

    def _optimize(self, items: list[SAWItem], kept_token_share: float) -> dict[str, Any]:
        t0 = time.perf_counter()
        self.reference.anchor(self.model)  # the first step of a fresh run fixes the KL reference
        loss_cfg = getattr(self.algorithm, "loss", None)
        if loss_cfg is not None and loss_cfg.uses_importance_ratio:  # not against top-p / top-k log-probs
            refuse_truncated_sampling(items, loss_cfg.kind)
        self.model.train()
        totals = global_totals(items, self.cfg.norm_max_tokens)
        metrics: dict[str, Any] = {"num_items": len(items), "action_tokens": totals["tokens"]}
        sums: dict[str, float] = {}
        tok_weighted: dict[str, float] = {}
        n_tok = 0
        train_tokens = 0
        flat, c = packable(self.model), self.cfg
        budget, memory = micro_batch_budget(self.model, c.micro_token_budget, c.micro_batch_mb, c.gradient_checkpointing)
        for group in split_by_token_budget(items, budget, self.group_key, share_prefix=flat or not c.gradient_checkpointing,
                                           flat=flat, memory=memory):
            mb = collate(group, self.pad_token_id, self.device)
            train_tokens += int(mb.attention_mask.sum())
            loss, stats = self.objective(self, mb, totals)
            self.masters.backward(loss)
            n = int(mb.targets.numel())
            n_tok += n
            for k, v in stats.items():
                val = float(v)
                if k in SUMMED_STATS:
                    sums[k] = sums.get(k, 0.0) + val
                elif k != "num_tokens":
                    tok_weighted[k] = tok_weighted.get(k, 0.0) + val * n
        if not items and is_sharded(self.model) and totals["segments_raw"] > 0:
            idle_forward_backward(self.model, self.pad_token_id, self.device)  # FSDP's all-gathers / reduce-scatters need every rank
        all_reduce_grads(self.model, self.optimizer)
        params = [p for g in self.optimizer.param_groups for p in g["params"]]
        grad_norm = torch.tensor(0.0)
        loss = sum_over_ranks({"loss": sums.get("loss", 0.0)}).get("loss", 0.0)  # every rank, in lockstep
        if totals["segments_raw"] > 0 and self.masters.before_step(math.isfinite(loss)):  # every rank steps alike
            grads = [p.grad for p in params if p.grad is not None]
            grad_norm = torch.nn.utils.get_total_norm(grads) if grads else grad_norm  # the same on every rank
            norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: a DTensor
            if bool(torch.isfinite(norm)) and math.isfinite(loss):
                torch.nn.utils.clip_grads_with_norm_(params, self.cfg.max_grad_norm, grad_norm)
                scale = lr_scale(items, kept_token_share, self.cfg)
                with lr_scaled(self.optimizer, scale):
                    self.optimizer.step()
                metrics["lr_scale"] = scale
                self.masters.to_model()
                mark_trained(self.model)  # an in-process engine's decode view refreshes on it
                self.nonfinite_streak = 0
            else:
                self._nonfinite(metrics, loss, float(norm))
        elif totals["segments_raw"] > 0:  # fp16: the scaled gradients overflowed; the scale was lowered
            grad_norm = torch.tensor(float("inf"))
            metrics["skipped_overflow"] = 1
            if self.masters.scaler.past_range:  # at a scale of 1 or less: the scale cannot fix it
                self._nonfinite(metrics, loss, math.inf)
        if self.masters.scaler is not None:
            metrics["loss_scale"] = self.masters.scaler.scale
        self.optimizer.zero_grad(set_to_none=True)
        metrics.update(nonfinite_streak=self.nonfinite_streak, nonfinite_total=self.nonfinite_total)
        lr = self.scheduler.get_last_lr()[0]
        dt = time.perf_counter() - t0
        metrics.update(sum_over_ranks(sums))
        metrics.update(token_means_over_ranks(tok_weighted, n_tok))
        metrics.update(
            grad_norm=float(grad_norm), lr=lr, train_s=dt, train_tokens=train_tokens,
            train_tokens_per_s=train_tokens / dt if dt > 0 else 0.0,
        )
        return metrics

    def _nonfinite(self, metrics: dict[str, Any], loss: float, grad_norm: float) -> None:
        """A non-finite loss or gradient norm, or an fp16 overflow past the scale's reach: no optimizer step (the
        caller zeroes the gradients), counted; ``max_nonfinite_steps`` in a row raise."""
        self.nonfinite_streak += 1
        self.nonfinite_total += 1
        metrics["nonfinite_skipped"] = 1
        if self.nonfinite_streak >= self.cfg.max_nonfinite_steps:
            raise nonfinite_stop(self.nonfinite_streak, loss, grad_norm, self.masters.scaler)

    def _streaks(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in ("empty_streak", "nonfinite_streak", "no_signal_streak", "nonfinite_total")}

    def ref_logp(self, mb: Any) -> torch.Tensor:
        """Reference log-probs of the action tokens (``self.reference``), before the policy's own forward."""
        return self.reference.logp(self.model, mb)

    ref_model = property(lambda self: self.reference.ref_model, doc="The frozen reference model, where there is one.")

    # -- loop, checkpoints --------------------------------------------------------
    async def train(
        self, num_steps: int, on_step: Callable[[int, dict[str, Any]], Awaitable[None] | None] | None = None
    ) -> dict[str, Any]:
        """Run until ``self.step == num_steps`` (resumed runs continue from their step) and return the last
        step's metrics ({} when no step was left to run). ``on_step(step, metrics)`` runs after each step.
        With an evaluator: evaluate every ``eval_every`` steps and at the last, and with ``keep_best`` end
        on the best evaluated weights (``self.best``), the start of a fresh run (step 0) evaluated first,
        after its weights are published.

        A stop before ``num_steps`` (``signal.TrainingStopped``: no signal, a saturated task, non-finite or
        empty steps; or any exception) still ends on the best weights, the step it stopped on evaluated
        first for a trainer's own stop, and records why in ``self.stopped``; it raises only when the run
        failed (a saturated task, every sample right, is not a failure)."""
        if self.keep_best and self.evaluator is None:
            raise ValueError(f"keep_best={self.keep_best!r} needs an evaluator (Trainer(evaluator=...))")
        self.stopped, metrics = None, {}
        try:
            if self.keep_best and self.step == 0 and not self.best:
                if not self.started:
                    self.publish_start()  # score the start as the inference engine serves it
                await self.evaluate()  # the start is a candidate: RL that only makes a good policy worse keeps it
            while self.step < num_steps:
                metrics = await self.train_step()
                every = self.eval_every
                if self.evaluator is not None and ((every and self.step % every == 0) or self.step == num_steps):
                    metrics.update(await self.evaluate())
                if on_step is not None:
                    res = on_step(self.step, metrics)
                    if hasattr(res, "__await__"):
                        await res  # type: ignore[misc]
        except BaseException as e:  # noqa: B036  (a Ctrl-C too: the run ends on its best weights)
            self.stopped = stop_record(e, self.step)
            if isinstance(e, TrainingStopped) and self.keep_best and self.best.get("last_step") != self.step:
                metrics.update(await self.evaluate())  # the step it stopped on is a candidate too
            self._end_on_best()
            self.stopped = learned_before_no_signal(self.stopped, self.best, self.keep_best)
            if self.stopped["failed"]:
                raise
            return metrics
        self._end_on_best()
        return metrics

    @property
    def best(self) -> dict[str, Any]:
        """keep_best's record (``KeepBest.best``): the best, the last and the first evaluation."""
        return self.keeper.best

    @best.setter
    def best(self, value: dict[str, Any]) -> None:
        self.keeper.best = value

    async def evaluate(self) -> dict[str, Any]:
        """Run the evaluator now (under ``cfg.fast_path``); log ``eval/<metric>`` at the current step and track the best."""
        if self.evaluator is None:
            return {}
        was_training = self.model.training
        self.model.eval()
        try:
            with fastpath.scoped(self.cfg.fast_path):
                result = dict(await self.evaluator())
        finally:
            self.model.train(was_training)
        out = {f"eval/{k}": v for k, v in result.items() if isinstance(v, (int, float))}
        if self.logger is not None:
            self.logger.log(self.step, out)
        if self.keep_best:
            self.keeper.consider(self.keep_best, self.step, result, lambda: self.masters.snapshot(self.model),
                                 write=self.checkpoint_dir is not None and is_rank0())  # a resumed run still knows it
        return out

    @torch.no_grad()
    def _end_on_best(self) -> None:
        """Under keep_best, load the best evaluation's trainable weights (fp32 masters too) and publish them; the
        last step's own checkpoint is written first (a later ``save`` of this step leaves it be), so a folder
        named for a step holds that step's weights and a resume continues from them."""
        if not self.keep_best or self.keeper.state is None or self.best.get("step") == self.step:
            return
        self._kept_at = self.save() and self.step
        self.masters.restore(self.model, self.keeper.state)
        mark_trained(self.model)  # an in-process engine refreshes its decode view
        self.policy_version += 1
        if self.publisher is not None:
            self.publisher.publish(self.model, self.policy_version)

    def save(self) -> Path | None:
        if getattr(self, "_kept_at", None) == self.step:  # this step's own weights are saved; the model holds kept ones
            return latest_checkpoint(self.checkpoint_dir) if self.checkpoint_dir else None
        model_state = optimizer_state = None
        if is_sharded(self.model) and self.checkpoint_dir is not None:  # every rank joins the gathers
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

            model_state = full_state_dict(self.model)
            optimizer_state = get_optimizer_state_dict(
                self.model, self.optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        reference = self.reference.full_snapshot() if self.checkpoint_dir is not None else None  # all ranks gather
        if self.checkpoint_dir is None or not is_rank0():
            return None
        state = {"policy_version": self.policy_version, "algorithm": self.algorithm.name,
                 "trainer_config": asdict(self.cfg), "kl_coef": self.algorithm.loss.kl_coef,
                 "reference": self.reference.state(), "streaks": self._streaks(),
                 "loss_scaler": self.masters.scaler_state()}
        if hasattr(self.source, "state_dict"):
            state["source_state"] = self.source.state_dict()
        path = save_checkpoint(
            self.checkpoint_dir, self.step, model=self.model, optimizer=self.optimizer,
            scheduler=self.scheduler, tokenizer=self.tokenizer, state=state, max_to_keep=self.cfg.max_to_keep,
            model_state=model_state, optimizer_state=optimizer_state,
            master_weights=self.masters.state_dict(self.model) if self.masters.active else None,
            tensor_files={REFERENCE_FILE: reference} if reference else None,
        )
        self.keeper.prune()  # the bests no retained checkpoint can resume to are gone
        if hasattr(self.source, "on_checkpoint"):  # e.g. the pipeline acknowledges what this checkpoint holds
            self.source.on_checkpoint(path)
        return path

    def resume(self, path: str | Path | None = None) -> bool:
        """Load ``path`` (or the latest checkpoint in ``checkpoint_dir``); True if one was loaded."""
        if path is None:
            if self.checkpoint_dir is None:
                return False
            path = latest_checkpoint(self.checkpoint_dir)
            if path is None:
                return False
        state = load_checkpoint(path, model=self.model, optimizer=self.optimizer, scheduler=self.scheduler)
        if self.masters.active:  # the fp32 masters, not the rounding of them the model folder holds
            self.masters.load_state_dict(self.model, load_master_weights(path) or {})
        self.reference.load(path, state.get("reference"), self.model)
        self.step = int(state["step"])
        self.keeper.root = Path(path).parent
        self.keeper.load(self.step)  # used when keep_best is set, now or later
        self.policy_version = int(state.get("policy_version", self.step))
        for k, v in state.get("streaks", {}).items():  # a resumed run stops where the uninterrupted one would
            setattr(self, k, int(v))
        self.masters.load_scaler_state(state.get("loss_scaler"))  # fp16: the scale and its clean steps
        if "kl_coef" in state and self.cfg.kl_target is not None:  # the adaptive controller's position
            self.algorithm = dataclasses.replace(
                self.algorithm, loss=dataclasses.replace(self.algorithm.loss, kl_coef=float(state["kl_coef"])))
        if "source_state" in state and hasattr(self.source, "load_state_dict"):
            self.source.load_state_dict(state["source_state"])
        self.started = False  # the resumed weights are published before the next rollout
        return True
