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
