"""The memory a micro-batch's scored forward keeps for its backward (``MicroBatchMemory``), by which the trainer
cuts batches into micro-batches (``TrainerConfig.micro_batch_mb``, when ``micro_token_budget`` is 0: the default).

A training step's peak is the model (and the engine's packed decode copy of it) plus one micro-batch's saved
activations. Per trained layer the flat pass (``training.packed``) keeps, for each token it computes: the inputs
of the linears (norm outputs, ``o_proj``'s input) and the MLP's four ``[T, intermediate]`` tensors (gate, up,
activation, product) in the compute dtype, and in fp32 the norms' inputs and the attention's queries, keys and
values; for each padded query position of its attention blocks the fp32 queries and output, for each padded key
position the fp32 keys and values, and the mask for each (item query, key) pair. Each scored token adds its
logits (kept by the log-prob's backward) and their gradient. On SmolLM2-135M (30 layers, hidden 576, MLP 1536,
3 key/value heads of 64) in fp32 that is about 1.4 MB a token, within 3% of what autograd saved
(``torch.autograd.graph.saved_tensors_hooks``) on the layouts measured: the old fixed budget of 8192 padded
tokens could hold over 10 GB, and ``ludic train env`` on TextArena's Kuhn poker (prompts of several hundred
tokens) peaked at 9 GB. A budget in bytes holds the peak where a laptop can, whatever the model, dtype and
prompt lengths, and counts what the flat pass shares: a GRPO group's prompt once, so a group of long prompts
and short replies stays in one micro-batch.
"""

from __future__ import annotations

from typing import Any

from ludic.training.packed import TreeCost


def _config(model: Any) -> Any:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    cfg = getattr(base, "config", None)
    return getattr(cfg, "text_config", None) or cfg


class MicroBatchMemory:
    """Bytes a micro-batch of ``model`` keeps for its backward (see the module docstring): ``flat(tree)`` for the
    flat pass over a ``packed.TreeCost`` layout, ``padded(count, longest, prefix)`` for the model's own forward
    over a padded block. Layers below the lowest trainable one keep nothing (the backward stops above them);
    with activation checkpointing each trained layer keeps only its input, and one layer's activations exist at
    a time (recomputed in backward)."""

    def __init__(self, model: Any, checkpointing: bool = False) -> None:
        from ludic.architectures import frozen_bottom_layers

        cfg = _config(model)
        dtype = next(p.dtype for p in model.parameters() if p.is_floating_point())
        self.width = dtype.itemsize
        self.hidden, self.vocab = int(cfg.hidden_size), int(cfg.vocab_size)
        heads = int(cfg.num_attention_heads)
        self.kv = int(getattr(cfg, "num_key_value_heads", None) or heads) * int(
            getattr(cfg, "head_dim", None) or self.hidden // heads)
        layers = int(cfg.num_hidden_layers)
        try:
            self.layers = layers - frozen_bottom_layers(model)
        except (AttributeError, ValueError):
            self.layers = layers
        self.checkpointing = checkpointing
        H, I = self.hidden, int(cfg.intermediate_size)
        self.per_token = self.width * (4 * I + 3 * H) + 4 * (3 * H + 2 * self.kv)
        """Bytes per computed token and layer, the attention's padded blocks apart."""

    def _total(self, tokens: int, layer: int, scored: int) -> int:
        logits = 2 * scored * self.vocab * self.width
        if self.checkpointing:
            return self.layers * tokens * self.hidden * self.width + layer + logits
        return self.layers * layer + logits

    def flat(self, t: TreeCost) -> int:
        """The flat pass over ``t``'s layout: ``C`` common tokens, ``J`` prompt rests padded to ``Tg``, ``B``
        completions padded to ``Tr`` (``packed._Tree``)."""
        C, J, B, Tg, Tr = t.common, len(t.prompts), t.count, t.rest, max(t.longest_completion, 1)
        queries = C + J * Tg + B * Tr
        keys = (J * (C + Tg) if Tg else 0) + B * (C + Tg + Tr)
        layer = t.tokens * self.per_token + 4 * (2 * self.hidden * queries + 2 * self.kv * keys + B * Tr * (C + Tg + Tr))
        return self._total(t.tokens, layer, t.completion_tokens)

    def padded(self, count: int, longest: int, prefix: int = 0) -> int:
        """The model's own forward over ``count`` rows padded to ``longest``, a shared ``prefix`` once (every
        position counted as scored: an upper bound)."""
        tokens = prefix + count * (longest - prefix)
        return self._total(tokens, tokens * (self.per_token + 4 * 2 * (self.hidden + self.kv)), tokens)


def micro_batch_budget(model: Any, tokens: int, megabytes: float,
                       checkpointing: bool = False) -> tuple[int, MicroBatchMemory | None]:
    """``(budget, memory)`` for ``microbatch.split_by_token_budget``: ``tokens`` padded tokens when set (> 0),
    else ``megabytes`` MiB of what a micro-batch keeps for its backward (``MicroBatchMemory``)."""
    if tokens > 0:
        return tokens, None
    return int(megabytes * 2**20), MicroBatchMemory(model, checkpointing)
