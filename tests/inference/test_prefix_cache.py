"""The engine's prefix cache (``ludic.inference.prefix_cache``): a dialog's next turn prefills only its new
tokens, and samples exactly what a full prefill samples; moved weights never reuse old keys."""

import pytest
import torch

from ludic.inference.client import SamplingParams
from ludic.inference.models import load_model, load_tokenizer, mark_trained
from ludic.inference.prefix_cache import PrefixCache
from ludic.inference.transformers_engine import TransformersEngine


def _turn1():
    system = list(range(100, 124))
    return [system + list(range(5, 14)), system + list(range(30, 34)), system + list(range(60, 71)),
            system + list(range(200, 219))]


def _turn2(first, replies):
    """Each dialog's next prompt (its prompt, its reply, a new observation of its own length), and a prompt no
    earlier turn began (its whole prompt is prefilled), twice (a group)."""
    nxt = [p + list(r) + list(range(300 + 7 * i, 303 + 9 * i)) for i, (p, r) in enumerate(zip(first, replies))]
    fresh = list(range(100, 124)) + list(range(400, 450))
    return nxt + [fresh, fresh]


@pytest.mark.parametrize("dtype,static,tol", [("float32", True, 1e-5), ("float32", False, 1e-5),
                                              ("bfloat16", True, 2e-2)])
def test_a_dialogs_next_turn_prefills_only_its_new_tokens_and_samples_the_same(tiny_model_dir, dtype, static, tol):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype=dtype)
    cached = TransformersEngine(model, tok, static_decode=static)
    full = TransformersEngine(model, tok, static_decode=static, prefix_cache_bytes=0)
    first = _turn1()
    greedy = [SamplingParams(temperature=0.0, max_tokens=6)] * len(first)
    replies = [r.trace.completion_ids for r in cached.generate(first, greedy)]
    assert replies == [r.trace.completion_ids for r in full.generate(first, greedy)]
    assert len(cached.prefix_cache.entries) == len(first) and not full.prefix_cache.entries
    second = _turn2(first, replies)
    for params in ([SamplingParams(temperature=0.0, max_tokens=8)] * len(second),
                   [SamplingParams(temperature=1.0, max_tokens=8, seed=i) for i in range(len(second))]):
        hits, reused = cached.prefix_cache.stats["hits"], cached.prefix_cache.stats["reused_tokens"]
        got, want = cached.generate(second, params), full.generate(second, params)
        # every continued dialog resumed from its first prompt; the fresh prompt found nothing
        assert cached.prefix_cache.stats["hits"] - hits == len(first)
        assert cached.prefix_cache.stats["reused_tokens"] - reused == sum(len(p) for p in first)
        for g, w in zip(got, want):
            assert g.trace.prompt_ids == w.trace.prompt_ids
            assert g.trace.completion_ids == w.trace.completion_ids
            assert max(abs(x - y) for x, y in zip(g.trace.logprobs, w.trace.logprobs)) < tol


def test_weights_that_moved_never_reuse_keys_from_before(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32")
    engine = TransformersEngine(model, tok)
    first = _turn1()
    greedy = [SamplingParams(temperature=0.0, max_tokens=4)] * len(first)
    replies = [r.trace.completion_ids for r in engine.generate(first, greedy)]
    second = _turn2(first, replies)[: len(first)]
    params = [SamplingParams(temperature=0.0, max_tokens=4)] * len(second)

    def moved(change):
        engine.generate(first, greedy)  # the first prompts cached again, under the current weights
        assert len(engine.prefix_cache.entries) >= len(first)
        hits = engine.prefix_cache.stats["hits"]
        change()
        engine.generate(second, params)
        assert engine.prefix_cache.stats["hits"] == hits  # emptied: every prompt prefilled in full

    with torch.no_grad():
        moved(lambda: (model.get_input_embeddings().weight.mul_(1.01), mark_trained(model)))  # a trainer step
    moved(lambda: setattr(engine, "policy_version", engine.policy_version + 1))  # a published policy
    moved(engine.weights_changed)  # a checkpoint or kept adapter loaded


def test_the_cache_keeps_the_longest_prefix_and_stays_under_its_bytes():
    def kv(n):  # 2 layers of [1 head, n, 2] keys and values in fp32: 32 bytes a token
        return [(torch.zeros(1, n, 2), torch.zeros(1, n, 2)) for _ in range(2)]

    cache = PrefixCache(max_bytes=32 * 10)
    cache.put([1, 2, 3], kv(3))
    cache.put([1, 2, 3, 4, 5], kv(5))
    n, got = cache.longest([1, 2, 3, 4, 5, 6])
    assert n == 5 and got[0][0].shape[1] == 5
    assert cache.longest([1, 2, 3, 4, 5]) == (3, cache.entries[(1, 2, 3)][0])  # a proper prefix only
    assert cache.longest([9, 1, 2, 3]) == (0, None)
    cache.put([7, 7, 7], kv(3))  # 11 tokens > 10: the least recently used entry goes ([1, 2, 3, 4, 5])
    assert list(cache.entries) == [(1, 2, 3), (7, 7, 7)] and cache.bytes == 32 * 6
    cache.put(list(range(20)), kv(20))  # bigger than the whole cache: not kept, nothing evicted for it
    assert len(cache.entries) == 2
    cache.sync("new weights")
    assert not cache.entries and cache.bytes == 0 and cache.longest([1, 2, 3, 4]) == (0, None)
    off = PrefixCache(max_bytes=0)
    off.put([1, 2], kv(2))
    assert not off.entries


def _lora_policy(model_dir, dtype):
    """The tiny model with a LoRA on its top layer only (its bottom layer frozen), the adapter moved off zero."""
    from ludic.training.lora import LoraSettings, load_policy

    model, tok = load_policy(str(model_dir), lora=LoraSettings(rank=4, top_layers=1), dtype=dtype, seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.2)
    return model, tok


@pytest.mark.parametrize("dtype,static,tol", [("float32", True, 1e-5), ("float32", False, 1e-5),
                                              ("bfloat16", True, 2e-2)])
def test_prompts_met_again_after_trainer_steps_prefill_only_the_trained_layers(tiny_model_dir, dtype, static, tol):
    """``BottomCache``: each prompt's frozen bottom is computed once and stays valid across trainer steps (the
    adapter above it moves); the engine samples what a full prefill samples, before and after a step."""
    from ludic.architectures import frozen_bottom_layers

    model, tok = _lora_policy(tiny_model_dir, dtype)
    assert frozen_bottom_layers(model) == 1
    on = TransformersEngine(model, tok, static_decode=static)
    off = TransformersEngine(model, tok, static_decode=static, bottom_cache_bytes=0)
    prompts = _turn1() + [_turn1()[0]] * 2  # a group: one prompt sampled three times
    distinct = len(_turn1())

    def same(params):
        got, want = on.generate(prompts, params), off.generate(prompts, params)
        for g, w in zip(got, want):
            assert g.trace.completion_ids == w.trace.completion_ids
            assert max(abs(x - y) for x, y in zip(g.trace.logprobs, w.trace.logprobs)) < tol

    greedy = [SamplingParams(temperature=0.0, max_tokens=6)] * len(prompts)
    sampled = [SamplingParams(temperature=1.0, max_tokens=6, seed=i) for i in range(len(prompts))]
    same(greedy)
    assert on.bottom_cache.stats == {"hits": 0, "misses": distinct, "evicted": 0} and on.bottom_cache.layers == 1
    assert not off.bottom_cache.entries
    with torch.no_grad():  # a trainer step: the adapter moves, the bottom does not
        for n, p in model.named_parameters():
            if "lora_" in n:
                p.add_(0.1)
        mark_trained(model)
    same(sampled)
    same(greedy)
    assert on.bottom_cache.stats["hits"] == 2 * distinct and on.bottom_cache.stats["misses"] == distinct
    on.weights_changed()  # a full-weight load may move the bottom too
    assert not on.bottom_cache.entries
    same(greedy)
    assert len(on.bottom_cache.entries) == distinct
    on.model = off.model = _lora_policy(tiny_model_dir, dtype)[0]  # another model (the recipe's SFT -> LoRA swap)
    assert on._bottom_layers() == 1 and not on.bottom_cache.entries
    same(greedy)


def test_a_model_that_trains_nothing_prefills_every_layer(tiny_model_dir):
    tok = load_tokenizer(str(tiny_model_dir))
    model = load_model(str(tiny_model_dir), dtype="float32")
    engine = TransformersEngine(model, tok)
    assert engine._bottom_layers() == 0  # every weight trainable: nothing is frozen
    model.requires_grad_(False)
    assert engine._bottom_layers() == 0  # nothing trains: the prefix cache's case, not this one
    engine.generate([_turn1()[0]], [SamplingParams(temperature=0.0, max_tokens=2)])
    assert not engine.bottom_cache.entries
