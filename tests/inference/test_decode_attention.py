"""Attention of a bf16 model on CPU runs in fp32 (``ludic.inference.models.cpu_bf16_attention``):
torch's bf16 SDPA kernel on CPU took 0.9-1.1 ms per call for one query token against 160 keys
(16 rows x 9 heads), the fp32 grouped-head path 0.21 ms: a quarter of the GRPO benchmark's generation.
Prefill and training (more than one query token) run sdpa on fp32 inputs: forward + backward 2x
faster than in bf16, and the sampler and the trainer compute attention alike."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ludic.inference.models import CPU_BF16_ATTENTION, cpu_bf16_attention, load_model


def _qkv(q_len: int, kv_len: int, dtype=torch.bfloat16, heads: int = 4, kv_heads: int = 4):
    g = torch.Generator().manual_seed(q_len)
    return [torch.randn(2, hh, n, 16, generator=g).to(dtype)
            for hh, n in ((heads, q_len), (kv_heads, kv_len), (kv_heads, kv_len))]


def test_a_decode_step_is_computed_in_fp32_and_returned_in_bf16():
    """Grouped query heads (6 query, 2 key/value) and a padding mask, against fp32 sdpa."""
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    q, k, v = _qkv(1, 37, heads=6, kv_heads=2)
    mask = torch.ones(2, 1, 1, 37, dtype=torch.bool)
    mask[0, :, :, :11] = False  # row 0 is left-padded
    out, _ = cpu_bf16_attention(module, q, k, v, mask, scaling=0.25)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask, scale=0.25,
                                         enable_gqa=True).transpose(1, 2)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 1, 6, 16)
    assert (out.float() - ref).abs().max() <= 4e-3  # fp32 math, one bf16 rounding at the end
    bf16, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=0.25)
    assert (out.float() - ref).abs().max() <= (bf16.float() - ref).abs().max() + 1e-6
    additive = torch.zeros(2, 1, 1, 37).masked_fill(~mask, float("-inf"))
    assert torch.equal(cpu_bf16_attention(module, q, k, v, additive, scaling=0.25)[0], out)


def test_prefill_and_training_attention_run_sdpa_in_fp32_with_gradients():
    """Many query tokens (causal, grouped heads): the output is fp32 sdpa rounded once to bf16, and the
    gradients reach the bf16 inputs (training runs through this path)."""
    module = SimpleNamespace(num_key_value_groups=3, is_causal=True)
    q, k, v = (t.requires_grad_() for t in _qkv(9, 9, heads=6, kv_heads=2))
    out, _ = cpu_bf16_attention(module, q, k, v, None, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), None, scaling=0.25)
    assert out.dtype == torch.bfloat16 and torch.equal(out, ref.to(torch.bfloat16))
    bf16, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.25)
    assert not torch.equal(out, bf16)  # the bf16 kernel is not what ran
    out.float().square().sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    q32, k32, v32 = (t.detach().float().requires_grad_() for t in (q, k, v))
    ref32, _ = sdpa_attention_forward(module, q32, k32, v32, None, scaling=0.25)
    ref32.to(torch.bfloat16).float().square().sum().backward()
    for got, want in zip(grads, (q32.grad, k32.grad, v32.grad)):
        assert got.dtype == torch.bfloat16
        assert (got.float() - want).abs().max() <= 0.02 * want.abs().max()

    # a padding mask (left-padded row 0), where transformers repeats the grouped key/value heads
    mask = torch.ones(2, 1, 9, 9, dtype=torch.bool).tril()
    mask[0, :, :, :3] = False
    mask[0, :, :3, :3] = torch.eye(3, dtype=torch.bool)  # padding rows attend to themselves
    out, _ = cpu_bf16_attention(module, q, k, v, mask, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q.float(), k.float(), v.float(), mask, scaling=0.25)
    assert ((out.float() - ref).abs() <= ref.abs() * 2 ** -8 + 1e-5).all()  # fp32 math, one bf16 rounding
    additive = torch.zeros(mask.shape, dtype=torch.bfloat16).masked_fill(~mask, float("-inf"))
    assert torch.equal(cpu_bf16_attention(module, q, k, v, additive, scaling=0.25)[0], out)


def test_fp32_models_run_plain_sdpa_bit_for_bit():
    module = SimpleNamespace(num_key_value_groups=1, is_causal=True)
    for q_len in (1, 5):
        q32, k32, v32 = _qkv(q_len, 5, torch.float32)
        assert torch.equal(cpu_bf16_attention(module, q32, k32, v32, None)[0],
                           sdpa_attention_forward(module, q32, k32, v32, None)[0])


def test_load_model_uses_it_for_bf16_on_cpu_only(tiny_model_dir):
    assert load_model(str(tiny_model_dir), dtype="bfloat16").config._attn_implementation == CPU_BF16_ATTENTION
    assert load_model(str(tiny_model_dir), dtype="float32").config._attn_implementation == "sdpa"


def test_padded_batches_decode_as_with_sdpa(tiny_model_dir):
    """Left-padded batched greedy decoding gives the tokens sdpa gives (the padding mask reaches the
    attention: a custom implementation without transformers' mask builder silently gets none)."""
    from ludic.inference.client import SamplingParams
    from ludic.inference.models import load_tokenizer
    from ludic.inference.transformers_engine import TransformersEngine

    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="bfloat16")
    engine = TransformersEngine(model, tok)
    prompts = [[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16][:n] for n in (3, 12, 7)]
    greedy = [SamplingParams(temperature=0.0, max_tokens=6)] * 3
    ours = [r.trace for r in engine.generate(prompts, greedy)]
    model.set_attn_implementation("sdpa")
    ref = [r.trace for r in engine.generate(prompts, greedy)]
    assert [t.completion_ids for t in ours] == [t.completion_ids for t in ref]
    for a, b in zip(ours, ref):
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 0.05
