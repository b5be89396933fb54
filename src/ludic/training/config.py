"""The trainer section of every training recipe's config (a plain dataclass, no heavy imports)."""

from __future__ import annotations

from dataclasses import dataclass


LR_SCHEDULES = ("constant", "linear", "cosine")
"""The learning-rate schedules ``TrainerConfig.lr_schedule`` names (``precision.lr_factor``)."""


@dataclass
class TrainerConfig:
    """Trainer: how each step optimises (learning rate, clipping, micro-batches, checkpoints, stops).

    The section every training recipe embeds (``trainer: TrainerConfig``), so each recipe takes the
    same flags (``--lr``, ``--max-grad-norm``, ...) and hands the whole section to the ``Trainer``."""

    lr: float = 1e-5
    """AdamW learning rate (peak, after warmup)."""
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.999)
    """AdamW betas."""
    max_grad_norm: float = 1.0
    """Clip the global gradient norm to this."""
    lr_schedule: str = "constant"
    """One of ``LR_SCHEDULES``: "constant", "linear" or "cosine" decay to ``lr_floor`` over ``total_steps`` (after
    warmup)."""
    lr_floor: float = 0.0
    """Where a decay ends, as a fraction of ``lr`` (0: at 0): the step falls from ``lr`` to ``lr * lr_floor``, so the
    last steps still learn what the last ones find (``precision.lr_factor``)."""
    warmup_steps: int = 0
    """Linear warmup from lr/warmup_steps to lr."""
    total_steps: int = 0
    """Length of the decay schedule (0: the recipe's number of steps)."""
    micro_token_budget: int = 0
    """Most padded tokens (longest sequence x rows) in one forward/backward; 0 (default): micro-batches sized by
    ``micro_batch_mb`` instead. (It was a fixed 8192: with prompts of several hundred tokens, over 10 GB.)"""
    micro_batch_mb: float = 1024
    """With ``micro_token_budget`` 0: the MiB one micro-batch may keep for its backward (the trained layers'
    activations, the scored tokens' logits), estimated from the model's shape and the micro-batch's layout
    (``training.memory``): the peak a step adds to the model. SmolLM2-135M in fp32: one item with a 400-token
    prompt of its own takes 580 MiB, a GRPO group of 8 replies of 20 tokens behind one 280-token prompt 730."""
    max_seq_len: int = 1024
    """Longer items lose completion tokens beyond this length."""
    norm_max_tokens: int | None = None
    """Dr.GRPO constant normaliser L (default: the most trained tokens of an item in the batch)."""
    gradient_checkpointing: bool = False
    """Recompute activations in backward (less memory, ~30% more compute)."""
    cache_frozen_bottom: str = "off"
    """With the bottom layers frozen (``freeze_bottom``, or a LoRA on the top layers only), compute their output
    once and run only the trainable top on later visits (``training.frozen_cache``; exact up to float rounding,
    capped at 1 GiB): ``item`` per distinct item (offline data seen for many epochs; True means this), ``prompt``
    per distinct prompt (RL revisiting prompts with new replies: the bottom then runs over the replies only),
    ``off`` (False)."""
    max_lag: int | None = None
    """Drop items sampled more than this many policy versions ago (async pipelines)."""
    publish_every: int = 1
    """Publish weights to the inference engine every N optimizer steps."""
    reset_server_version: bool = False
    """At start, force the inference servers back to this trainer's policy version (default: adopt a
    higher server version, publishing the starting weights as the next one)."""
    checkpoint_every: int = 0
    """Save every N steps (0: only on request / final save)."""
    max_to_keep: int = 2
    """Checkpoints kept on disk."""
    max_empty_steps: int = 5
    """Stop the run after this many batches in a row with no trainable item on any rank."""
    max_no_signal_steps: int = 10
    """Stop the run after this many steps in a row in which every trained token had advantage 0 (every
    GRPO group had zero variance: a format the model never produces, a reward that never varies), with
    an error naming the likely causes; 0: never stop. ``zero_var_group_share`` and
    ``zero_adv_token_share`` are logged every step."""
    max_nonfinite_steps: int = 3
    """A step whose loss or gradient norm is not finite (NaN or inf: a NaN advantage, a reward that
    overflowed, a diverging policy) is skipped, weights and optimizer state unchanged, and counted;
    this many in a row stop the run."""
    scale_lr_by_signal: bool = False
    """Scale each optimizer step's learning rate by the share of its trained tokens whose advantage is not 0
    (logged as ``lr_scale``). Adam moves every weight by about ``lr`` per step whatever the batch holds, so
    from a good policy, where most GRPO groups have zero variance, a full step rests on the one or two
    groups that differ; and a step with no signal at all still moves the weights on Adam's momentum. With
    this on, a step moves as far as its evidence: half the tokens informative, half the step; none, none.
    Tokens a sample filter dropped (``drop_zero_weight``: DAPO, MMD) count as tokens without signal, so a
    filter does not undo the scale."""
    full_step_signal: float = 1.0
    """With ``scale_lr_by_signal``: the share of tokens with signal at which a step is full size; the scale
    is min(1, share / full_step_signal). 1.0: proportional to the share; 0.5: full steps from half the
    tokens informative, smaller steps below that, none without signal."""
    master_weights: bool = True
    """Mixed precision for a bf16 / fp16 model (``--dtype``): the optimizer keeps fp32 master weights and
    fp32 AdamW state, gradients sum and clip in fp32, the model computes in its dtype. --no-master-weights
    is pure low-precision training: AdamW updates the bf16 weights in place and every update under half
    a bf16 ulp (about 0.4% of a weight) is lost; measured on the tic-tac-toe recipe's SFT, 55.8% best
    move against 91.3% in fp32. No effect on fp32 parameters (LoRA adapters are fp32)."""
    fast_path: bool = True
    """Ludic's hand-written CPU fast path (``ludic.fastpath``: the flat scoring pass, fused LoRA linears,
    token log-probs with a hand-written backward, the static decoder and LoRA decode view, fp32
    attention for bf16). --no-fast-path runs stock transformers, peft and SDPA, as LUDIC_FAST_PATH=0
    does. The fast path runs on CPU only either way."""
    kl_target: float | None = None
    """Adaptive KL controller (PPO): after each batch the loss's ``kl_coef`` is multiplied by
    1 + clip(kl / kl_target - 1, -0.2, 0.2) * items / kl_horizon (Ziegler et al.); None: fixed."""
    kl_horizon: int = 10000
    """The adaptive KL controller's horizon, in samples."""
    ppo_epochs: int = 1
    """PPO inner loop: passes over each collected batch (the importance ratio moves away from 1)."""
    num_minibatches: int = 1
    """PPO inner loop: optimizer steps per pass (the batch is shuffled and split)."""

    def __post_init__(self) -> None:
        if isinstance(self.cache_frozen_bottom, bool):
            self.cache_frozen_bottom = "item" if self.cache_frozen_bottom else "off"
        if self.cache_frozen_bottom not in ("off", "item", "prompt"):
            raise ValueError(f"cache_frozen_bottom must be off, item or prompt, got {self.cache_frozen_bottom!r}")
        if not 0.0 <= self.lr_floor < 1.0:
            raise ValueError(f"lr_floor must be in [0, 1) (a fraction of lr), got {self.lr_floor}")
        if not 0.0 < self.full_step_signal <= 1.0:
            raise ValueError(f"full_step_signal must be in (0, 1], got {self.full_step_signal}")
        if self.ppo_epochs < 1 or self.num_minibatches < 1:
            raise ValueError(
                f"ppo_epochs ({self.ppo_epochs}) and num_minibatches ({self.num_minibatches}) must be >= 1"
            )
