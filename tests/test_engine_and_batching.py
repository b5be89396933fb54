"""The in-process engine and the trainer's scoring path, on a real tiny random model."""

import asyncio

import pytest
import torch

from ludic.tokenization import render_ids
from ludic.inference.client import ChatRequest, SamplingParams
from ludic.inference.models import load_model, load_tokenizer
from ludic.inference.transformers_engine import TransformersEngine
from ludic.training.microbatch import collate, split_by_token_budget, truncate_item
from ludic.training.scoring import score_actions
from ludic.types import FinishReason, SAWItem


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    torch.manual_seed(0)
    model = load_model(str(tiny_model_dir), dtype="float32")
    return model, load_tokenizer(str(tiny_model_dir))


def _msgs(i):
    return [{"role": "system", "content": "Be brief."}, {"role": "user", "content": f"Question number {i}?" * (1 + i % 3)}]


def test_score_actions_matches_full_logits(tiny):
    model, tok = tiny
    items = [SAWItem(tuple(range(5, 5 + p)), tuple(range(50, 50 + c)), 1.0) for p, c in [(7, 3), (4, 6), (9, 1)]]
    mb = collate(items, tok.pad_token_id)
    logp, ent = score_actions(model, mb, need_entropy=True, chunk=4)
    with torch.no_grad():
        full = torch.log_softmax(model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits.float(), -1)
    expected, exp_ent = [], []
    for b, it in enumerate(items):
        P = len(it.prompt_ids)
        for j, tok_id in enumerate(it.completion_ids):
            expected.append(full[b, P - 1 + j, tok_id])
            exp_ent.append(-(full[b, P - 1 + j].exp() * full[b, P - 1 + j]).sum())
    assert torch.allclose(logp.detach(), torch.stack(expected), atol=1e-5)
    assert torch.allclose(ent.detach(), torch.stack(exp_ent), atol=1e-4)
    assert mb.seg.tolist() == [0, 0, 0, 1, 1, 1, 1, 1, 1, 2]


def test_token_budget_split_and_truncation():
    items = [SAWItem((1,) * n, (2,) * 2, 0.0) for n in (3, 8, 1, 5, 2)]
    groups = split_by_token_budget(items, budget=12)
    for g in groups:
        assert max(it.num_tokens for it in g) * len(g) <= 12
    assert sorted(it.num_tokens for g in groups for it in g) == [3, 4, 5, 7, 10]
    it = SAWItem((1,) * 4, (2, 3, 4), 1.0, logprobs=(-1.0, -2.0, -3.0), policy_versions=(0, 0, 0))
    cut = truncate_item(it, 6)
    assert cut.completion_ids == (2, 3) and cut.logprobs == (-1.0, -2.0) and cut.meta["seq_len_truncated"]
    assert truncate_item(it, 4) is None and truncate_item(it, 7) is it


def test_grpo_groups_are_packed_by_prompt_so_each_prompt_is_computed_once():
    """A GRPO batch (8 samples of each of 6 prompts sharing a 20-token system part) packs one
    group per micro-batch: the whole prompt is then a shared prefix, computed once per group."""
    from ludic.training.microbatch import micro_batch_cost

    system = tuple(range(100, 120))
    items = [SAWItem(system + tuple(range(200 + 40 * g, 240 + 40 * g)), (7,) * (5 + k % 4), 1.0, meta={"g": g})
             for k in range(8) for g in range(6)]
    groups = split_by_token_budget(items, budget=4096)
    assert sorted(id(it) for mb in groups for it in mb) == sorted(id(it) for it in items)
    assert [{it.meta["g"] for it in mb} for mb in groups] == [{g} for g in range(6)]
    by_length = split_by_token_budget(items, budget=4096, share_prefix=False)
    assert len(by_length) == 1  # the old packing: one micro-batch, only the system part shared
    cost = sum(micro_batch_cost(mb) for mb in groups)
    assert cost == 6 * (59 + 8 * 9) and micro_batch_cost(by_length[0]) == 20 + 48 * 48
    # the flat pass (packed.packed_states) computes the system part once, each group's prompt once and
    # no padding: the six groups then cost less together than apart
    flat = split_by_token_budget(items, budget=4096, flat=True)
    assert len(flat) == 1 and micro_batch_cost(flat[0], flat=True) == 20 + 6 * 40 + 6 * sum(5 + k % 4 for k in range(8))
    assert micro_batch_cost([it for it in items if it.meta["g"] == 0], flat=True) == 60 + 52
    # (and the budget still splits them)
    assert all(max(it.num_tokens for it in mb) * len(mb) <= 700 for mb in split_by_token_budget(items, 700, flat=True))
    # distinct prompts (SFT) still share micro-batches
    sft = [SAWItem(system + (300 + i, 301, 302), (7, 8), 1.0) for i in range(16)]
    assert len(split_by_token_budget(sft, budget=4096)) == 1
    # the budget still holds
    for mb in split_by_token_budget(items, budget=200):
        assert max(it.num_tokens for it in mb) * len(mb) <= 200


def test_engine_batches_concurrent_requests_and_logprobs_match_trainer(tiny):
    model, tok = tiny
    engine = TransformersEngine(model, tok, batch_wait_s=0.05)
    engine.policy_version = 3
    reqs = [ChatRequest(_msgs(i), SamplingParams(temperature=1.0, max_tokens=6 + i, seed=i)) for i in range(4)]

    async def run():
        return await asyncio.gather(*(engine.complete(r) for r in reqs))

    out = asyncio.run(run())
    assert engine.stats["batches"] == 1 and engine.stats["sequences"] == 4  # one shared forward batch
    for i, r in enumerate(out):
        t = r.trace
        assert list(t.prompt_ids) == render_ids(tok, reqs[i].messages)
        assert 1 <= len(t.completion_ids) <= 6 + i and set(t.policy_versions) == {3}
        if t.finish_reason == FinishReason.LENGTH:
            assert len(t.completion_ids) == 6 + i
    items = [SAWItem(r.trace.prompt_ids, r.trace.completion_ids, 1.0, r.trace.logprobs) for r in out]
    mb = collate(items, tok.pad_token_id)
    with torch.no_grad():
        logp, _ = score_actions(model, mb)
    assert torch.allclose(logp, mb.old_logp, atol=2e-3), (logp - mb.old_logp).abs().max()
    again = asyncio.run(run())  # same seeds, same batch layout -> same tokens
    assert [r.trace.completion_ids for r in again] == [r.trace.completion_ids for r in out]


def test_engine_greedy_matches_hf_generate_and_stop_strings(tiny):
    model, tok = tiny
    engine = TransformersEngine(model, tok)
    prompt = render_ids(tok, _msgs(1))
    [r] = engine.generate([prompt], [SamplingParams(temperature=0.0, max_tokens=8)])
    with torch.no_grad():
        ref = model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False)[0, len(prompt):].tolist()
    assert list(r.trace.completion_ids) == ref[: len(r.trace.completion_ids)]
    text = tok.decode(ref, skip_special_tokens=True)
    stop = text[2:4]
    if stop.strip():
        [s] = engine.generate([prompt], [SamplingParams(temperature=0.0, max_tokens=8, stop=(stop,))])
        assert s.finish_reason == FinishReason.STOP and s.text.endswith(stop)


def test_shared_prefix_scoring_equals_plain_forward(tiny):
    model, tok = tiny
    g = torch.Generator().manual_seed(1)
    system = torch.randint(5, 900, (20,), generator=g).tolist()
    items = [SAWItem(tuple(system + torch.randint(5, 900, (n,), generator=g).tolist()),
                     tuple(torch.randint(5, 900, (c,), generator=g).tolist()), 1.0)
             for n, c in [(6, 3), (9, 2), (4, 5)]]
    mb = collate(items, tok.pad_token_id)
    grads = []
    for share in (False, True):
        model.zero_grad()
        logp, _ = score_actions(model, mb, share_prefix=share)
        logp.sum().backward()
        grads.append((logp.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    assert torch.allclose(grads[0][0], grads[1][0], atol=1e-5)
    assert torch.allclose(grads[0][1], grads[1][1], atol=1e-5, rtol=1e-4)
    model.zero_grad()


def test_engine_shared_prefix_prefill_matches_single_prompts(tiny):
    model, tok = tiny
    engine = TransformersEngine(model, tok)
    system = "You are a careful assistant. " * 6  # a long shared system prompt (prefilled once)
    prompts = [render_ids(tok, [{"role": "system", "content": system}, {"role": "user", "content": q}])
               for q in ("Hi", "What is two plus two?", "Name a colour please, any colour")]
    greedy = SamplingParams(temperature=0.0, max_tokens=5)
    batched = engine.generate(prompts, [greedy] * 3)
    single = [engine.generate([p], [greedy])[0] for p in prompts]
    for b, s in zip(batched, single):
        assert b.trace.completion_ids == s.trace.completion_ids
        assert max(abs(x - y) for x, y in zip(b.trace.logprobs, s.trace.logprobs)) < 1e-3


def test_collate_rejects_an_item_without_prompt_tokens():
    """Column P-1 = -1 would silently read the last (padding) position: refuse, naming the item."""
    good = SAWItem((1, 2), (3,), 1.0)
    bad = SAWItem((), (4, 5), 1.0, meta={"pair_id": 7})
    with pytest.raises(ValueError, match=r"item 1 .*no prompt tokens.*pair_id"):
        collate([good, bad], 0)


def test_logprobs_and_scores_belong_to_the_sampling_distribution(tiny):
    """At temperature T the sampler draws from softmax(logits / T): its log-probs, and the trainer's
    scores of the same tokens, must be those of that distribution (as in TRL and verl), not of T = 1."""
    model, tok = tiny
    engine = TransformersEngine(model, tok)
    prompt = render_ids(tok, _msgs(0))
    [r] = engine.generate([prompt], [SamplingParams(temperature=0.5, max_tokens=6, seed=3)])
    t = r.trace
    assert t.temperature == 0.5
    seq = torch.tensor([list(t.prompt_ids) + list(t.completion_ids)])
    with torch.no_grad():
        logits = model(seq).logits[0].float()
    P = len(t.prompt_ids)
    ref = torch.stack([torch.log_softmax(logits[P - 1 + j] / 0.5, -1)[i] for j, i in enumerate(t.completion_ids)])
    assert torch.allclose(torch.tensor(t.logprobs), ref, atol=2e-3), (torch.tensor(t.logprobs) - ref).abs().max()
    item = SAWItem(t.prompt_ids, t.completion_ids, 1.0, t.logprobs, temperature=0.5)
    with torch.no_grad():
        logp, _ = score_actions(model, collate([item], tok.pad_token_id))
    assert torch.allclose(logp, ref, atol=1e-4)


def _tiny(family):
    import transformers as tf

    common = dict(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0)
    cfg = {
        "gemma2": lambda: tf.Gemma2Config(**common, head_dim=8, final_logit_softcapping=0.5),  # caps hard
        "gemma3": lambda: tf.Gemma3TextConfig(**common, head_dim=8, final_logit_softcapping=0.5),
        "granite": lambda: tf.GraniteConfig(**common, logits_scaling=4.0),
        "cohere": lambda: tf.CohereConfig(**common, logit_scale=0.25),
    }[family]()
    torch.manual_seed(0)
    return tf.AutoModelForCausalLM.from_config(cfg).float().eval()


@pytest.mark.parametrize("family", ["gemma2", "gemma3", "granite", "cohere"])
def test_scores_apply_the_models_own_logit_post_processing(family):
    """Final-logit softcapping (Gemma 2/3), logit scaling (Granite, Cohere): the trainer's head-only
    scoring path must give the log-probs of model(...).logits, at temperature 1 and at T."""
    model = _tiny(family)
    items = [SAWItem(tuple(range(5, 12)), tuple(range(50, 54)), 1.0),
             SAWItem(tuple(range(20, 24)), (70, 71), 1.0, temperature=0.5)]
    mb = collate(items, 0)
    with torch.no_grad():
        logp, _ = score_actions(model, mb)
        logits = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask).logits.float()
    expected = []
    for b, it in enumerate(items):
        P = len(it.prompt_ids)
        for j, tok_id in enumerate(it.completion_ids):
            expected.append(torch.log_softmax(logits[b, P - 1 + j] / it.temperature, -1)[tok_id])
    assert torch.allclose(logp, torch.stack(expected), atol=1e-5), (logp - torch.stack(expected)).abs().max()


def test_cast_adapter_view_samples_the_trained_adapters(tiny_model_dir):
    """A bf16 model with fp32 LoRA adapters decodes through a view whose LoRA linears are fused
    (``[W; A]`` in one matmul, then B) in bf16, refreshed when the policy moves: after the adapters
    change and a new policy version, the sampler's log-probs are the trained model's (the packed base
    weights are not touched); after ``weights_changed()`` (a full-weight load) the base follows too; every
    tensor outside the LoRA linears is shared, not copied."""
    from ludic.inference.decode import _GroupMember
    from ludic.training.lora import LoraSettings, load_policy

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="bfloat16", seed=0)
    engine = TransformersEngine(model, tok)
    prompt = list(range(5, 17))
    sample = [SamplingParams(temperature=1.0, max_tokens=6, seed=1)]
    before = engine.generate([prompt], sample)[0].trace
    _, view, src, dst = engine._decoder
    fused = [m for m in view.modules() if isinstance(m, _GroupMember)]
    assert view is not model and fused and all(q.dtype == torch.bfloat16 for q in dst)
    assert len(fused) == sum(1 for n, _ in model.named_parameters() if "lora_A" in n)
    groups = {id(m.group) for m in fused}  # q, k, v share one matmul; gate and up another; o and down alone
    assert len(groups) == 4 * len(fused) // 7
    assert all(p.dtype == torch.float32 for p in src if p.requires_grad)  # the trained adapters stay fp32
    shared = {n: p.data_ptr() for n, p in model.named_parameters() if "lora_" not in n}
    outside = [(n, q) for n, q in view.named_parameters() if n in shared]
    assert outside and all(shared[n] == q.data_ptr() for n, q in outside)
    packed = {id(m.group): m.group.base.state for m in fused}  # the base weights, stacked and packed

    g = torch.Generator().manual_seed(0)
    with torch.no_grad():  # an optimizer step's worth of change, in place, and a base weight changed too
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        q_proj = model.get_submodule("base_model.model.model.layers.0.self_attn.q_proj").base_layer.weight
        q_start = q_proj.detach().clone()
        q_proj.mul_(3.0)
    stale = engine.generate([prompt], sample)[0].trace
    assert stale.logprobs == before.logprobs  # no new policy yet (no publish, no trainer step): the view waits
    engine.policy_version += 1  # what a publish does
    after = engine.generate([prompt], sample)[0].trace
    assert all(m.group.base.state is packed[id(m.group)] for m in fused)  # a new policy repacks nothing
    assert all(torch.equal(d, s.to(d.dtype)) for s, d in zip(src, dst) if s.requires_grad)
    with torch.no_grad():
        q_proj.copy_(q_start)  # back, bit for bit, before the comparisons below
    item = SAWItem(tuple(prompt), after.completion_ids, 1.0, temperature=1.0)
    with torch.no_grad():
        logp, _ = score_actions(model, collate([item], tok.pad_token_id))
    assert max(abs(a - b) for a, b in zip(after.logprobs, logp.tolist())) < 0.05
    assert after.logprobs != before.logprobs or after.completion_ids != before.completion_ids
    off = TransformersEngine(model, tok, cast_adapters=False)
    ref = off.generate([prompt], sample)[0].trace
    assert max(abs(a - b) for a, b in zip(ref.logprobs, logp.tolist())) < 0.05
    with torch.no_grad():  # a full-weight load changes a base weight in place: weights_changed(), and the view follows
        q_proj.mul_(3.0)
        logp3, _ = score_actions(model, collate([item], tok.pad_token_id))
    engine.weights_changed()
    again = engine.generate([prompt], [SamplingParams(temperature=1.0, max_tokens=len(item.completion_ids), seed=1)])
    fresh = TransformersEngine(model, tok).generate([prompt], [SamplingParams(temperature=1.0, max_tokens=6, seed=1)])
    assert again[0].trace.completion_ids == fresh[0].trace.completion_ids
    assert again[0].trace.logprobs == fresh[0].trace.logprobs
    assert logp3.tolist() != logp.tolist()


def test_a_frozen_opponent_shares_the_policys_base_and_its_packed_decode_weights(tiny_model_dir):
    """``frozen_copy(share_frozen=True)`` (``ludic train env --opponent frozen``) copies only what trains, the
    adapters: its base tensors are the policy's, and an engine over it reads the policy engine's packed base
    weights and packed LM head (one packed copy, not one per engine; with a full copy of the model under it,
    the opponent had cost two more copies of the model). The policy training its adapters does not move it."""
    from ludic.inference.decode import _FusedLoraGroup
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.reference import frozen_copy

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    frozen = frozen_copy(model, share_frozen=True)
    mine = dict(frozen.named_parameters())
    assert all((mine[n] is p) != p.requires_grad for n, p in model.named_parameters())
    policy, opponent = TransformersEngine(model, tok), TransformersEngine(frozen, tok)
    prompt, sample = list(range(5, 17)), [SamplingParams(temperature=1.0, max_tokens=6, seed=1)]
    before = opponent.generate([prompt], sample)[0].trace
    policy.generate([prompt], sample)
    groups = [[m for m in e._decoder[1].modules() if isinstance(m, _FusedLoraGroup)] for e in (policy, opponent)]
    assert groups[0] and all(a.base is b.base for a, b in zip(*groups))
    assert policy._static[1].head_packed is opponent._static[1].head_packed
    with torch.no_grad():  # a training step's worth of change to the policy's adapters, then a publish
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(0.5)
    policy.policy_version += 1
    assert policy.generate([prompt], sample)[0].trace.logprobs != before.logprobs
    again = opponent.generate([prompt], sample)[0].trace
    assert (again.completion_ids, again.logprobs) == (before.completion_ids, before.logprobs)


def test_decode_view_follows_a_fused_optimizer_step(tiny_model_dir):
    """The trainer's fused AdamW changes the adapters in place without bumping their version
    counters (a resumed run once differed from an uninterrupted one because the view kept the first
    step's adapters): the view follows the trainer's own count of steps (``models.weights_step``),
    also when no publisher bumps the engine's policy version."""
    from ludic.training.algorithms import make_sft
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer, TrainerConfig

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    engine = TransformersEngine(model, tok)
    engine.generate([list(range(5, 17))], [SamplingParams(temperature=1.0, max_tokens=2, seed=1)])
    trainer = Trainer(model, make_sft(), None, TrainerConfig(lr=0.1), pad_token_id=tok.pad_token_id)
    assert trainer.optimizer.defaults.get("fused")
    trainer.optimize([SAWItem(tuple(range(5, 17)), (40, 41, 42), 1.0)])
    engine.generate([list(range(5, 17))], [SamplingParams(temperature=1.0, max_tokens=2, seed=1)])
    _, _, src, dst = engine._decoder
    assert engine.policy_version == 0
    assert all(torch.equal(d, s.to(d.dtype)) for s, d in zip(src, dst))


def test_fused_lora_decode_matches_peft_in_fp32(tiny_model_dir):
    """In fp32 (no casts at all) the fused view computes what peft computes: same greedy tokens,
    log-probs within float rounding."""
    from ludic.training.lora import LoraSettings, load_policy

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(hash(n) % 1000))
    prompts = [list(range(5, 17)), list(range(30, 36))]
    greedy = [SamplingParams(temperature=0.0, max_tokens=8)] * 2
    fused = TransformersEngine(model, tok).generate(prompts, greedy)
    plain = TransformersEngine(model, tok, cast_adapters=False).generate(prompts, greedy)
    for f, p in zip(fused, plain):
        assert f.trace.completion_ids == p.trace.completion_ids
        assert max(abs(a - b) for a, b in zip(f.trace.logprobs, p.trace.logprobs)) < 1e-4


def test_prefill_logits_do_not_expand_the_vocabulary_matrix(tiny_model_dir):
    """The prefill asks for the last position's logits by index: a ``logits_to_keep=1`` slice of a
    longer sequence is a strided view, and torch's linear on it expanded the LM head's weight per
    row into a batched matmul (553 ms against 2.6 ms for 16 rows of SmolLM2's 49152 x 576 head)."""
    from torch.profiler import ProfilerActivity, profile

    from ludic.training.lora import LoraSettings, load_policy

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="bfloat16", seed=0)
    engine = TransformersEngine(model, tok)  # (on the peft-wrapped model the slice did not fold into a matmul)
    vocab = model.get_output_embeddings().weight.shape[0]
    system = list(range(100, 140))  # a shared system prompt: prefilled once, then the tails on its cache
    prompts = [system + list(range(5, 5 + n)) for n in (9, 4, 13)]
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        engine.generate(prompts, [SamplingParams(temperature=0.0, max_tokens=3)] * 3)
    expanded = [e for e in prof.events() if e.name in ("aten::bmm", "aten::copy_")
                and any(len(s) == 3 and vocab in s for s in e.input_shapes if isinstance(s, list))]
    assert not expanded, [(e.name, e.input_shapes) for e in expanded]


def test_batches_generate_on_the_event_loop_thread(tiny):
    """By default the engine runs each batch on the event loop's own thread: a worker thread gets its
    own OpenMP team, and two teams on 2 cores slowed each other (rollouts +40% over the bare engine,
    the trainer's step 2.0 s -> 3.2 s). ``threaded=True`` keeps the old worker-thread behaviour."""
    import threading

    model, tok = tiny
    seen: list[str] = []
    hook = model.register_forward_pre_hook(lambda *_: seen.append(threading.current_thread().name))
    try:
        for threaded in (False, True):
            seen.clear()
            engine = TransformersEngine(model, tok, threaded=threaded)

            async def run() -> str:
                req = ChatRequest(messages=_msgs(0), sampling=SamplingParams(temperature=0.0, max_tokens=2))
                await engine.complete(req)
                return threading.current_thread().name

            loop_thread = asyncio.run(run())
            assert seen and (set(seen) == {loop_thread}) == (not threaded), (threaded, set(seen), loop_thread)
    finally:
        hook.remove()


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
def test_token_logp_equals_log_softmax_gather_with_gradients(dtype, tol):
    """The hand-written log-prob (``token_logp._TokenLogp``, used when no entropy is needed) gives the
    autograd path's values and gradients, at per-row temperatures; 37 rows span three of its
    16-row passes."""
    from ludic.training.scoring import _logp_entropy

    g = torch.Generator().manual_seed(0)
    logits = (torch.randn(37, 500, generator=g) * 3).to(dtype)
    targets = torch.randint(0, 500, (37,), generator=g)
    weights = torch.randn(37, generator=g)
    for temp in (None, torch.rand(37, generator=g) * 1.5 + 0.5):
        a = logits.clone().requires_grad_()
        logp, ent = _logp_entropy(a, targets, False, temp)
        (logp * weights).sum().backward()
        b = logits.clone().requires_grad_()
        z = b.float() if temp is None else b.float() / temp[:, None]
        ref = torch.log_softmax(z, -1).gather(-1, targets[:, None])[:, 0]
        (ref * weights).sum().backward()
        assert ent is None and logp.dtype == torch.float32
        assert torch.allclose(logp, ref, atol=1e-5)
        assert a.grad.dtype == dtype
        assert (a.grad.float() - b.grad.float()).abs().max() <= tol * b.grad.float().abs().max()
