import pytest

from ludic.tokenization import extend_ids, render_ids
from ludic.types import FinishReason


def _conv():
    return [
        {"role": "system", "content": "You play tic-tac-toe."},
        {"role": "user", "content": "Board 1. Your move."},
        {"role": "assistant", "content": "<think>centre</think><move>B2</move>"},
        {"role": "user", "content": "Board 2. Your move."},
    ]


def test_extend_equals_render_for_canonical_tokens(tokenizer):
    conv = _conv()
    prompt = render_ids(tokenizer, conv[:2])
    completion = tokenizer(conv[2]["content"], add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    ext = extend_ids(tokenizer, prompt, completion, FinishReason.STOP, conv[:3], conv[3:])
    assert ext == render_ids(tokenizer, conv)


def test_extend_keeps_non_canonical_sampled_ids(tokenizer):
    conv = _conv()
    prompt = render_ids(tokenizer, conv[:2])
    # the same text split into single characters: a valid but non-canonical tokenisation
    chars = [tokenizer.convert_tokens_to_ids(c) for c in "<think>"]
    assert all(isinstance(c, int) and c != tokenizer.unk_token_id for c in chars)
    rest = tokenizer("centre</think><move>B2</move>", add_special_tokens=False)["input_ids"]
    completion = chars + rest + [tokenizer.eos_token_id]
    ext = extend_ids(tokenizer, prompt, completion, FinishReason.STOP, conv[:3], conv[3:])
    assert ext[: len(prompt) + len(completion)] == prompt + completion  # sampled ids untouched
    assert tokenizer.decode(ext) == tokenizer.decode(render_ids(tokenizer, conv))


def test_extend_after_length_cut_closes_the_turn(tokenizer):
    conv = _conv()
    conv[2] = {"role": "assistant", "content": "<think>centre is"}
    prompt = render_ids(tokenizer, conv[:2])
    completion = tokenizer(conv[2]["content"], add_special_tokens=False)["input_ids"]
    ext = extend_ids(tokenizer, prompt, completion, FinishReason.LENGTH, conv[:3], conv[3:])
    assert tokenizer.decode(ext) == tokenizer.decode(render_ids(tokenizer, conv))


SHORT_REPLIES = ["a", "im", "\n", "<", ">", "|", "end", "_end", "user", "assistant", " ", "\n\n", "<|"]
MUST_EXTEND = {"a", "im", "\n", "<"}
"""The SmolLM2 template writes replies verbatim, so these must extend, not fall back."""


@pytest.mark.parametrize("reply", SHORT_REPLIES)
@pytest.mark.parametrize("finish", [FinishReason.STOP, FinishReason.LENGTH])
def test_extend_short_replies_match_a_fresh_render_or_fall_back(tokenizer, reply, finish):
    # A reply of a character or two also occurs in the template's own text
    # ("<|im_end|>", "assistant\n"); the glue must still follow the reply itself.
    conv = _conv()
    conv[2] = {"role": "assistant", "content": reply}
    prompt = render_ids(tokenizer, conv[:2])
    completion = tokenizer(reply, add_special_tokens=False)["input_ids"]
    if finish == FinishReason.STOP:
        completion = completion + [tokenizer.eos_token_id]
    ext = extend_ids(tokenizer, prompt, completion, finish, conv[:3], conv[3:])
    if reply in MUST_EXTEND:
        assert ext is not None
    if ext is None:
        return
    fresh, kept = render_ids(tokenizer, conv), prompt + completion
    assert ext[: len(kept)] == kept  # token-in: the sampled ids are kept as they are
    assert tokenizer.decode(ext) == tokenizer.decode(fresh)  # and the glue is the template's
    if fresh[: len(kept)] == kept:  # the sampled ids are the ones a fresh render makes
        assert ext == fresh
    else:  # e.g. "\n" after "assistant\n": a fresh render merges "\n\n" into one token
        assert ext[len(kept):] == fresh[len(fresh) - (len(ext) - len(kept)):]


def test_extend_falls_back_when_the_template_rewrites_the_reply(tokenizer):
    # A template that trims contents renders " B2 " as "B2": the sampled ids
    # would disagree with a fresh render, so extend_ids must decline.
    class Trimming:
        def __init__(self, tok):
            self.tok = tok

        def __getattr__(self, name):
            return getattr(self.tok, name)

        def __call__(self, *a, **k):
            return self.tok(*a, **k)

        def apply_chat_template(self, messages, **kw):
            trimmed = [{**m, "content": m["content"].strip()} for m in messages]
            return self.tok.apply_chat_template(trimmed, **kw)

    conv = _conv()
    conv[2] = {"role": "assistant", "content": " B2 "}
    tok = Trimming(tokenizer)
    prompt = render_ids(tok, conv[:2])
    completion = tokenizer(" B2 ", add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
    assert extend_ids(tok, prompt, completion, FinishReason.STOP, conv[:3], conv[3:]) is None
