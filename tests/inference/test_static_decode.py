"""The engine's static-cache decode step (``ludic.inference.decode.StaticDecoder``) and its
prefill of each distinct prompt once: exact against the model's own forward, which the engine
falls back to (``static_decode=False``) and which every other architecture uses."""

import pytest
import torch

from ludic.inference.client import SamplingParams
from ludic.inference.decode import StaticDecoder
from ludic.inference.models import load_model, load_tokenizer
from ludic.inference.transformers_engine import TransformersEngine

from conftest import tiny_family_model as _tiny


def _prompts(grpo: bool = False):
    system = list(range(100, 124))  # a shared system prompt, then tails of different lengths
    a, b, c = system + list(range(5, 14)), system + list(range(30, 34)), system + list(range(60, 71))
    if grpo:  # 3 prompts x 2 samples, interleaved: decoded grouped (each prompt's keys read once)
        return [a, b, c, a, b, c]
    return [a, b, a, c, a, b]  # repeated prompts, unequal counts: every row its own keys


def _run(engine, prompts, params):
    return [r.trace for r in engine.generate(prompts, params)]


def _compare(model, tok, tol: float, **engine_kw):
    fast = TransformersEngine(model, tok, **engine_kw)
    slow = TransformersEngine(model, tok, static_decode=False, **engine_kw)
    static = fast._static_decoder(fast._decode_model())
    assert static is not None
    for grpo in (False, True):
        prompts = _prompts(grpo)
        greedy = [SamplingParams(temperature=0.0, max_tokens=10)] * len(prompts)
        sampled = [SamplingParams(temperature=1.0, max_tokens=10, seed=i) for i in range(len(prompts))]
        for params in (greedy, sampled):
            got, want = _run(fast, prompts, params), _run(slow, prompts, params)
            assert static.group == (2 if grpo else 0)
            for g, w in zip(got, want):
                assert g.completion_ids == w.completion_ids
                assert max(abs(x - y) for x, y in zip(g.logprobs, w.logprobs)) < tol


def test_static_decode_equals_the_models_forward_in_fp32(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32")
    _compare(model, tok, 1e-5)


def test_static_decode_equals_the_models_forward_in_bf16(tiny_model_dir):
    """bf16 on CPU: the forward's decode attention is fp32 over a bf16 cache; the static cache holds
    the same bf16-rounded keys and values in fp32."""
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="bfloat16")
    _compare(model, tok, 1e-3)


def test_static_decode_with_lora_and_the_fused_view(tiny_model_dir):
    from ludic.training.lora import LoraSettings, load_policy

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    _compare(model, tok, 1e-5)
    _compare(model, tok, 1e-5, cast_adapters=False)  # peft's own LoRA modules


@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
def test_static_decode_other_llama_family_models(tiny_model_dir, family):
    tok = load_tokenizer(str(tiny_model_dir))
    _compare(_tiny(family, tok), tok, 1e-5)


def test_unsupported_models_decode_with_their_forward(tiny_model_dir):
    """A sliding window in effect (Mistral's default) is not reproduced: no static decoder, and the
    engine still generates through the model's forward."""
    tok = load_tokenizer(str(tiny_model_dir))
    model = _tiny("mistral", tok)
    model.config.sliding_window = 8
    assert StaticDecoder.build(model) is None
    engine = TransformersEngine(model, tok)
    [r] = engine.generate([list(range(5, 30))], [SamplingParams(temperature=0.0, max_tokens=4)])
    assert len(r.trace.completion_ids) == 4


def test_repeated_prompts_are_prefilled_once_and_decode_as_alone(tiny_model_dir):
    """A batch [a, b, a, c, a, b] prefills a, b and c once each (3 rows, not 6), and every row decodes
    as it does alone."""
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32")
    engine = TransformersEngine(model, tok)
    rows: list[int] = []
    hook = model.register_forward_pre_hook(lambda m, a, kw: rows.append(kw["input_ids"].shape[0]), with_kwargs=True)
    prompts = _prompts()
    greedy = SamplingParams(temperature=0.0, max_tokens=6)
    try:
        batched = _run(engine, prompts, [greedy] * len(prompts))
    finally:
        hook.remove()
    assert rows == [1, 3]  # the shared system prompt once, then the three distinct tails
    for p, b in zip(prompts, batched):
        [alone] = _run(engine, [p], [greedy])
        assert b.completion_ids == alone.completion_ids
        assert max(abs(x - y) for x, y in zip(b.logprobs, alone.logprobs)) < 1e-4


def test_a_batch_releases_its_key_value_buffers_when_it_ends(tiny_model_dir):
    """The static decoder's buffers are sized by one batch (rows x (prompt + max_tokens) per layer, in fp32):
    the engine drops them when the batch ends, as it does the prefill cache, so they are not held through the
    next training step (they were kept until the next batch started)."""
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32")
    engine = TransformersEngine(model, tok)
    for grpo in (False, True):
        prompts = _prompts(grpo)
        _run(engine, prompts, [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(len(prompts))])
        static = engine._static[1]
        assert static is not None
        assert (static.keys, static.values, static.prompt_keys, static.prompt_values) == ([], [], [], [])
        assert static.mask is None
    with pytest.raises(RuntimeError, match="no room left"):  # released: a step needs a new start()
        static.step(torch.tensor([8]), torch.tensor([3]))


def test_the_cache_refuses_a_step_past_its_size(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32")
    dec = StaticDecoder.build(model)
    ids = torch.tensor([[5, 6, 7]])
    with torch.no_grad():
        past = model(input_ids=ids, use_cache=True).past_key_values
    dec.start(past, torch.ones(1, 3, dtype=torch.long), max_new=1)
    dec.step(torch.tensor([8]), torch.tensor([3]))
    with pytest.raises(RuntimeError, match="no room left"):
        dec.step(torch.tensor([9]), torch.tensor([4]))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_multiply_as_the_plain_ones(dtype):
    """``decode.pack`` / ``decode.linear``: oneDNN's prepacked layout gives F.linear's result (to fp32
    rounding; bf16 within one rounding of the output), with and without a bias, for any row count;
    a later change of the weight needs a repack (the packed tensor is a snapshot)."""
    from ludic.inference.decode import linear, pack

    g = torch.Generator().manual_seed(0)
    w, bias = torch.randn(96, 40, generator=g).to(dtype), torch.randn(96, generator=g).to(dtype)
    packed = pack(w)
    if packed is None:
        pytest.skip("no oneDNN packing on this machine: the decoder multiplies plain weights")
    for rows in (1, 16, 37):
        x = torch.randn(rows, 40, generator=g).to(dtype)
        for b in (None, bias):
            got, want = linear(x, w, b, packed), torch.nn.functional.linear(x.float(), w.float(), None if b is None else b.float())
            assert got.dtype == dtype
            assert ((got.float() - want).abs() <= want.abs() * (2 ** -8 if dtype == torch.bfloat16 else 1e-5) + 1e-4).all()
    w.mul_(2)
    x = torch.randn(4, 40, generator=g).to(dtype)
    assert not torch.allclose(linear(x, w, None, packed).float(), torch.nn.functional.linear(x, w).float())
    assert pack(torch.ones(3, 3, dtype=torch.float16)) is None  # not a dtype it packs: plain matmuls


@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_decoders_rope_and_norms_are_the_models_own_bits(tiny_model_dir, family, dtype):
    """The decode step's rolled rotary embedding and fused RMSNorm give the model's own modules'
    results bit for bit (they are used only where a probe says so), and a norm or rotary function
    of another formula keeps the model's own."""
    from ludic.inference.decode import _fast_norm, _rolled_rope_matches

    tok = load_tokenizer(str(tiny_model_dir))
    model = (load_model(str(tiny_model_dir), dtype="float32") if family == "llama" else _tiny(family, tok)).to(dtype)
    dec = StaticDecoder.build(model)
    assert dec._rolled and all(n is not m for (n, _), m in zip(dec.norms, (l.input_layernorm for l in dec.layers)))
    g = torch.Generator().manual_seed(1)
    B, D = 5, dec.head_dim
    x = torch.randn(B, model.config.hidden_size, generator=g).to(dtype)
    cos, sin = dec.body.rotary_emb(x, torch.tensor([[3], [17], [40], [41], [300]]))
    q = torch.randn(B, dec.heads, 1, D, generator=g).to(dtype)
    k = torch.randn(B, dec.kv_heads, 1, D, generator=g).to(dtype)
    for got, want in zip(dec._rope(cos, sin)(q, k), dec.rope(q, k, cos, sin)):
        assert torch.equal(got, want)
    for (n1, n2), layer in zip(dec.norms, dec.layers):
        assert torch.equal(n1(x), layer.input_layernorm(x)) and torch.equal(n2(x), layer.post_attention_layernorm(x))

    class OnePlusNorm(torch.nn.Module):  # Gemma's formula: (1 + w) * x / rms
        def __init__(self, h):
            super().__init__()
            self.weight, self.variance_epsilon = torch.nn.Parameter(torch.randn(h)), 1e-6

        def forward(self, x):
            return (1 + self.weight) * torch.nn.functional.rms_norm(x, (x.shape[-1],), None, self.variance_epsilon)

    other = OnePlusNorm(8).to(dtype)
    assert _fast_norm(other, dtype) is other
    assert not _rolled_rope_matches(lambda q, k, cos, sin, **kw: (q * cos, k * cos), D, dtype)


def test_a_lora_on_the_lm_head_decodes_through_the_model(tiny_model_dir):
    """The hand-written decode step and flat pass read the LM head as a plain linear: a model whose head
    carries a LoRA adapter goes through its own forward (same tokens as the stock path), not an error."""
    from ludic import fastpath
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.packed import packable

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8, target_modules="lm_head,q_proj"),
                             dtype="float32", seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(1))
    prompts = [list(range(5, 17))]
    greedy = [SamplingParams(temperature=0.0, max_tokens=6)]
    fast = TransformersEngine(model, tok).generate(prompts, greedy)[0]
    assert not fast.info.get("error") and len(fast.trace.completion_ids) == 6, fast
    with fastpath.scoped(False):
        stock = TransformersEngine(model, tok).generate(prompts, greedy)[0]
    assert fast.trace.completion_ids == stock.trace.completion_ids
    assert not packable(model)
