"""Decode-step attention on CPU in bf16 runs in fp32 (``ludic.inference.models.cpu_bf16_attention``):
torch's bf16 SDPA kernel on CPU took 0.9-1.1 ms per call for one query token against 160 keys
(16 rows x 9 heads), fp32 0.14 ms; that was a quarter of the GRPO benchmark's generation time.
Prefill and training (more than one query token) keep the plain sdpa path, bit for bit."""

from types import SimpleNamespace

import torch
import torch.nn.functional as F
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from ludic.inference.models import CPU_BF16_ATTENTION, cpu_bf16_attention, load_model


def _qkv(q_len: int, kv_len: int, dtype=torch.bfloat16):
    g = torch.Generator().manual_seed(q_len)
    return [torch.randn(2, 4, n, 16, generator=g).to(dtype) for n in (q_len, kv_len, kv_len)]


def test_a_decode_step_is_computed_in_fp32_and_returned_in_bf16():
    module = SimpleNamespace(num_key_value_groups=1, is_causal=True)
    q, k, v = _qkv(1, 37)
    out, _ = cpu_bf16_attention(module, q, k, v, None, scaling=0.25)
    ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), scale=0.25).transpose(1, 2)
    assert out.dtype == torch.bfloat16
    assert torch.equal(out, ref.to(torch.bfloat16))


def test_more_than_one_query_token_is_plain_sdpa_bit_for_bit():
    module = SimpleNamespace(num_key_value_groups=1, is_causal=True)
    q, k, v = _qkv(9, 9)
    out, _ = cpu_bf16_attention(module, q, k, v, None, scaling=0.25)
    ref, _ = sdpa_attention_forward(module, q, k, v, None, scaling=0.25)
    assert torch.equal(out, ref)
    q32, k32, v32 = _qkv(1, 5, torch.float32)  # fp32 models: untouched
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
