"""The trainer's packed scoring pass (``ludic.training.packed``): the micro-batch's real tokens laid
out flat, the shared prefix once. It must equal the padded forward of the model (``packed=False``):
log-probs, entropies and the LoRA gradients, in fp32 to 1e-5."""

import pytest
import torch

from ludic.inference.models import load_model, load_tokenizer
from ludic.training.microbatch import collate, split_by_token_budget
from ludic.training.scoring import score_actions, score_hidden
from ludic.training.lora import LoraSettings, apply_lora
from ludic.training.packed import packable
from ludic.types import SAWItem

from conftest import tiny_family_model as _tiny


def _items(layout: str) -> list[SAWItem]:
    """Items with completions of unequal lengths: behind one prompt (``one``); in three groups whose
    prompts share a system part, one prompt being a prefix of another (``groups``); or behind prompts
    that share nothing at all (``none``)."""
    g = torch.Generator().manual_seed(0)
    rnd = lambda n: torch.randint(200, 900, (n,), generator=g).tolist()  # noqa: E731
    system = rnd(20)
    a, b = system + rnd(7), system + rnd(9)
    prompts = {"one": [a] * 4, "groups": [a, b, a, system, b, a], "none": [system + rnd(5), rnd(9), rnd(4), rnd(7)]}[layout]
    lengths = [9, 1, 4, 6, 3, 2]
    return [SAWItem(prompt_ids=p, completion_ids=rnd(n), weight=w, logprobs=[-1.0] * n)
            for p, n, w in zip(prompts, lengths, [1.0, -0.5, 0.25, 2.0, -1.0, 0.5])]


def _model(family, tok, tiny_model_dir, dtype=torch.float32):
    model = load_model(str(tiny_model_dir), dtype="float32") if family == "llama" else _tiny(family, tok)
    model = apply_lora(model.to(dtype), LoraSettings(rank=4, alpha=8.0))
    torch.manual_seed(1)
    for n, p in model.named_parameters():
        if "lora_B" in n:  # non-zero B: the adapters take part in the forward
            p.data.normal_(0, 0.05)
    return model


def _score(model, mb, packed, entropy=False):
    model.zero_grad(set_to_none=True)
    logp, ent, h = score_hidden(model, mb, need_entropy=entropy, packed=packed)
    (logp * torch.linspace(-1, 1, logp.numel())).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return logp.detach(), None if ent is None else ent.detach(), h.detach(), grads


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("layout", ["one", "groups", "none"])
def test_packed_scoring_equals_the_padded_forward(family, layout, tokenizer, tiny_model_dir):
    model = _model(family, tokenizer, tiny_model_dir)
    model.train()
    assert packable(model)
    mb = collate(_items(layout), tokenizer.pad_token_id)
    want = _score(model, mb, packed=False, entropy=True)
    got = _score(model, mb, packed=True, entropy=True)
    for a, b in zip(got[:3], want[:3]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert want[3] and set(got[3]) == set(want[3])
    for n in want[3]:
        torch.testing.assert_close(got[3][n], want[3][n], rtol=1e-5, atol=1e-6, msg=n)


def test_packed_scoring_in_bf16_matches_the_models_bf16_forward(tokenizer, tiny_model_dir):
    """bf16 on CPU: the flat pass computes attention as the model's attention does (fp32 inside)."""
    model = load_model(str(tiny_model_dir), dtype="bfloat16")
    mb = collate(_items("groups"), tokenizer.pad_token_id)
    with torch.no_grad():
        got, _ = score_actions(model, mb, packed=True)
        want, _ = score_actions(model, mb, packed=False)
        ref, _ = score_actions(model.float(), mb, packed=False)
    assert float((got - want).abs().max()) < 0.1
    assert float((got - ref).abs().max()) <= 1.5 * float((want - ref).abs().max()) + 0.02


def test_packed_scoring_under_gradient_checkpointing(tokenizer, tiny_model_dir):
    model = _model("llama", tokenizer, tiny_model_dir)
    model.train()
    mb = collate(_items("groups"), tokenizer.pad_token_id)
    want = _score(model, mb, packed=False)
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    got = _score(model, mb, packed=True)
    torch.testing.assert_close(got[0], want[0], rtol=1e-5, atol=1e-5)
    for n in want[3]:
        torch.testing.assert_close(got[3][n], want[3][n], rtol=1e-5, atol=1e-6, msg=n)


def test_models_the_flat_pass_does_not_reproduce_use_their_forward(tokenizer, tiny_model_dir):
    import transformers

    model = load_model(str(tiny_model_dir), dtype="float32")
    assert packable(model)
    model.config.attention_dropout = 0.1
    model.train()
    assert not packable(model)  # dropout in the attention: the model's forward applies it
    model.eval()
    assert packable(model)
    cfg = transformers.MistralConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=1, sliding_window=8)
    assert not packable(transformers.MistralForCausalLM(cfg))  # a sliding window in effect


def test_trainer_micro_batches_score_the_same_packed(tokenizer, tiny_model_dir):
    """The trainer's real path (split, collate, score) over GRPO groups of two prompts."""
    model = _model("llama", tokenizer, tiny_model_dir)
    items = _items("one") + _items("groups") + _items("none")
    for group in split_by_token_budget(items, 64, flat=True):
        mb = collate(group, tokenizer.pad_token_id)
        got, _ = score_actions(model, mb, packed=True)
        want, _ = score_actions(model, mb, packed=False)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
