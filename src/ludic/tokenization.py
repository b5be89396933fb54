"""Tokenisation, in one neutral place: chat templates as ids, token-in prompt extension,
shared prompt prefixes.

Inference (prompt ids for the sampler), training (shared-prefix scoring) and data (SFT /
DPO datasets) all import this module; it imports nothing from them, only ``ludic.types``.


``render_ids`` applies a tokenizer's chat template. ``extend_ids`` builds the
next turn's prompt by appending to the exact ids of the previous prompt and
its sampled completion, so a model's own output is never decoded and
re-encoded (the multi-turn retokenisation bug class that TRL, verl and SkyRL
all shipped). When the template does not extend cleanly it returns None and
the caller falls back to ``render_ids``.
"""

from __future__ import annotations

from typing import Any, Sequence

from ludic.types import FinishReason, Message


def render_text(tokenizer: Any, messages: Sequence[Message], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
    )


def encode(tokenizer: Any, text: str) -> list[int]:
    """Encode template text (special tokens in it are parsed, none are added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def encode_raw(tokenizer: Any, text: str) -> list[int]:
    """Encode plain text as the tokenizer does by default (its own BOS policy), no chat template."""
    return list(tokenizer(text)["input_ids"])


def render_ids(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Prompt ids for ``messages`` with the generation prompt appended."""
    return encode(tokenizer, render_text(tokenizer, messages, add_generation_prompt=True))


REPLY_SENTINEL = "\ue000ludic-reply\ue001"
"""Private-use text rendered in place of the assistant reply, to find what the template writes around it."""


def extend_ids(
    tokenizer: Any,
    prev_ids: Sequence[int],
    completion_ids: Sequence[int],
    finish_reason: FinishReason,
    history: Sequence[Message],
    new_messages: Sequence[Message],
) -> list[int] | None:
    """Next prompt = previous prompt + sampled completion + template glue + new turns.

    The glue is found by rendering the conversation with ``REPLY_SENTINEL`` in
    place of the reply (so a short reply such as ``"im"`` or ``"\n"`` cannot be
    mistaken for the template's own text), and it is used only when the
    template is consistent with token-in: the previous prompt's generation
    prompt is exactly the text before the reply, and the reply is rendered
    verbatim (a template that trims or rewrites replies gives None).

    Args:
        prev_ids: exact prompt ids of the previous model call.
        completion_ids: exact ids it sampled (stop token included if emitted).
        finish_reason: why that completion ended.
        history: messages up to and including the assistant reply.
        new_messages: messages added since (observations).

    Returns:
        The new prompt ids, or None when the template cannot be extended
        (the caller then re-renders the whole conversation).
    """
    if not history or history[-1]["role"] != "assistant":
        return None
    earlier, content, new = list(history[:-1]), history[-1]["content"], list(new_messages)
    stand_in = render_text(tokenizer, earlier + [{"role": "assistant", "content": REPLY_SENTINEL}] + new, True)
    parts = stand_in.split(REPLY_SENTINEL)
    if len(parts) != 2:
        return None
    before, glue = parts
    if render_text(tokenizer, list(history) + new, True) != before + content + glue:
        return None  # the template rewrites the reply (or depends on its text)
    if render_text(tokenizer, earlier, True) != before:
        return None  # the previous prompt is not what precedes the reply
    if finish_reason == FinishReason.STOP and completion_ids:
        # The model sampled the template's end-of-turn token itself: do not add it twice.
        last = tokenizer.convert_ids_to_tokens([int(completion_ids[-1])])[0]
        if last in tokenizer.all_special_tokens and glue.startswith(last):
            glue = glue[len(last):]
    return list(prev_ids) + list(completion_ids) + encode(tokenizer, glue)


MIN_SHARED_PREFIX = 16
"""Shortest common prompt prefix worth computing once per batch (generation and scoring)."""


def common_prefix_len(seqs: Sequence[Sequence[int]]) -> int:
    """Length of the prefix shared by all ``seqs``, leaving each at least one token of its own."""
    if len(seqs) < 2:
        return 0
    first, limit = seqs[0], min(len(s) for s in seqs) - 1
    n = 0
    while n < limit and all(s[n] == first[n] for s in seqs):
        n += 1
    return n


def pad_token_id_for(given: int | None, tokenizer: Any, model: Any) -> int:
    """The padding id: given, else the tokenizer's pad (or eos) id, else the model config's."""
    if given is not None:
        return int(given)
    for src in (tokenizer, getattr(model, "config", None)):
        for name in ("pad_token_id", "eos_token_id"):
            v = getattr(src, name, None)
            if isinstance(v, (list, tuple)):
                v = v[0] if v else None
            if isinstance(v, int):
                return v
    raise ValueError("Trainer: no padding id: pass pad_token_id= or tokenizer= (its pad or eos id is used)")
