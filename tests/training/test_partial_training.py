"""Training part of a model: frozen bottom layers and top-layer LoRA skip the backward below them."""

import asyncio

import pytest
import torch

from ludic.data.offline import OfflineBatchSource, sft_item
from ludic.training.algorithms import make_sft
from ludic.training.config import TrainerConfig
from ludic.training.lora import LoraSettings, apply_lora, decoder_layers, freeze_bottom, load_policy
from ludic.training.trainer import Trainer


def _sft_step(model, tok):
    items = [sft_item({"messages": [{"role": "user", "content": f"Say {w}."}], "completion": w}, tok)
             for w in ("yes", "no", "maybe", "never")]
    trainer = Trainer(model, make_sft(), OfflineBatchSource(items, 4, seed=0), TrainerConfig(lr=1e-2),
                      pad_token_id=tok.pad_token_id)
    asyncio.run(trainer.train_step())


def test_freeze_bottom_trains_only_the_top_layers(tiny_model_dir):
    model, tok = load_policy(tiny_model_dir, dtype="float32")
    blocks = decoder_layers(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    total = sum(p.numel() for p in model.parameters())
    left = freeze_bottom(model, len(blocks) - 1)
    top = sum(p.numel() for p in blocks[-1].parameters())
    assert left == total - model.get_input_embeddings().weight.numel() - sum(
        p.numel() for b in blocks[:-1] for p in b.parameters())
    assert top <= left < total
    _sft_step(model, tok)
    changed = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    top_prefix = [n for n, _ in model.named_parameters() if ".layers." in n][-1].split(".layers.")[0]
    last = f"{top_prefix}.layers.{len(blocks) - 1}."
    assert changed and all(n.startswith(last) or ".layers." not in n for n in changed)
    assert not any("embed" in n for n in changed)
    with pytest.raises(ValueError, match="decoder layers"):
        freeze_bottom(model, len(blocks))


def test_lora_top_layers_adapts_only_those_layers(tiny_model_dir):
    model, tok = load_policy(tiny_model_dir, dtype="float32")
    n = len(decoder_layers(model))
    model = apply_lora(model, LoraSettings(rank=4, alpha=8, top_layers=1))
    adapted = {name.split(".layers.")[1].split(".")[0] for name, p in model.named_parameters()
               if p.requires_grad}
    assert adapted == {str(n - 1)}
    assert len(decoder_layers(model)) == n  # found through the peft wrapper
    kinds = {name.split(".lora_")[0].rsplit(".", 1)[-1] for name, p in model.named_parameters() if p.requires_grad}
    assert {"q_proj", "down_proj"} <= kinds  # every linear of the block, as "all-linear" would
    _sft_step(model, tok)
    with pytest.raises(ValueError, match="top_layers"):
        apply_lora(load_policy(tiny_model_dir, dtype="float32")[0], LoraSettings(top_layers=n + 1))


def test_optimizer_is_fused_adamw_with_the_reference_update(tiny_model_dir):
    from ludic.training.precision import make_optimizer

    model, _ = load_policy(tiny_model_dir, dtype="float32")
    params = [p for p in model.parameters()]
    reference = [p.detach().clone().requires_grad_(True) for p in params]
    torch.manual_seed(0)
    for p, r in zip(params, reference):
        p.grad = torch.randn_like(p)
        r.grad = p.grad.clone()
    cfg = TrainerConfig(lr=1e-2, weight_decay=0.1)
    opt = make_optimizer(params, cfg)
    assert opt.defaults["fused"] is True  # plain CPU tensors: one fused kernel, not a per-tensor loop
    ref = torch.optim.AdamW(reference, lr=cfg.lr, betas=cfg.betas, weight_decay=cfg.weight_decay, foreach=False)
    for _ in range(3):
        opt.step()
        ref.step()
    for p, r in zip(params, reference):
        torch.testing.assert_close(p.detach(), r.detach(), rtol=1e-5, atol=1e-6)


def _chat_items(tok, n=12):
    words = ["yes", "no", "maybe", "never", "always", "often", "rarely", "soon", "later", "now", "then", "here"]
    return [sft_item({"messages": [{"role": "system", "content": "Answer with one word, as asked."},
                                   {"role": "user", "content": f"Say {w}."}], "completion": w}, tok)
            for w in words[:n]]


@pytest.fixture(scope="module")
def four_layer_dir(tmp_path_factory):
    from ludic.inference.models import make_tiny_model

    return make_tiny_model(tmp_path_factory.mktemp("m") / "tiny4", layers=4)


def test_frozen_bottom_cache_trains_exactly_like_the_plain_forward(four_layer_dir):
    """Three epochs of SFT with the bottom 2 of 4 layers frozen: with the cache (every step after
    the first epoch reads the bottom's output from it) the weights end where plain training puts
    them, and the shared system-prompt prefix is still computed once. (Up to rounding: the cache's
    bottom states come from the padded forward, plain training runs the flat one, and Adam turns
    rounding in near-zero gradients into steps of up to ~lr/100: atol 1e-4 at lr 1e-2.)"""
    from ludic.training.lora import frozen_bottom_layers

    ends = []
    for cache in (False, True):
        model, tok = load_policy(four_layer_dir, dtype="float32", seed=0)
        freeze_bottom(model, 2)
        assert frozen_bottom_layers(model) == 2
        trainer = Trainer(model, make_sft(), OfflineBatchSource(_chat_items(tok), 4, seed=0),
                          TrainerConfig(lr=1e-2, cache_frozen_bottom=cache), pad_token_id=tok.pad_token_id)
        losses = [asyncio.run(trainer.train_step())["loss"] for _ in range(9)]
        ends.append((losses, {n: p.detach().clone() for n, p in model.named_parameters()}, trainer.bottom_cache))
    (plain_losses, plain, none), (losses, cached, bottom) = ends
    assert none is None and bottom.misses == 12 and bottom.hits == 24  # each item computed once, in epoch 1
    torch.testing.assert_close(losses, plain_losses, rtol=1e-4, atol=1e-5)
    for n, p in plain.items():
        torch.testing.assert_close(cached[n], p, rtol=1e-4, atol=1e-4)
    start = {n: p for n, p in load_policy(four_layer_dir, dtype="float32", seed=0)[0].named_parameters()}
    assert not torch.equal(cached[[n for n in plain if ".layers.3." in n][0]], start[[n for n in plain if ".layers.3." in n][0]])


def test_frozen_bottom_cache_refuses_trainable_bottoms_and_checks_itself(four_layer_dir):
    from ludic.training.frozen_cache import FrozenBottomCache
    from ludic.training.microbatch import collate

    model, tok = load_policy(four_layer_dir, dtype="float32", seed=0)
    with pytest.raises(ValueError, match="must be frozen"):
        FrozenBottomCache(model, 2)
    with pytest.raises(ValueError, match="layers must be in 1..3"):
        Trainer(model, make_sft(), OfflineBatchSource(_chat_items(tok), 4, seed=0),
                TrainerConfig(cache_frozen_bottom=True), pad_token_id=tok.pad_token_id)
    freeze_bottom(model, 2)
    cache = FrozenBottomCache(model, 2)
    items = _chat_items(tok, 4)
    mb = collate(items, tok.pad_token_id)
    decoder = model.get_decoder()
    for it in items:  # wrong states under the right keys: the first use compares with the plain forward
        key = tuple(it.prompt_ids) + tuple(it.completion_ids)
        cache._states[key] = torch.ones(len(key), model.config.hidden_size)
    with pytest.raises(RuntimeError, match="differ from the plain forward"):
        cache.hidden_states(decoder, mb, 0)
    assert len(decoder.layers) == 4 and [b.self_attn.layer_idx for b in decoder.layers] == [0, 1, 2, 3]


def test_frozen_bottom_cache_under_a_top_layer_adapter_trains_like_the_plain_forward(four_layer_dir):
    """The tic-tac-toe recipe's RL: a LoRA adapter on the top 2 of 4 layers, everything else frozen. The
    bottom's output is the same at every step, so the cache serves it (each item computed once) and the
    adapter ends where plain training puts it."""
    from ludic.training.lora import LoraSettings, apply_lora, frozen_bottom_layers

    ends = []
    for cache in (False, True):
        model, tok = load_policy(four_layer_dir, dtype="float32", seed=0)
        for p in model.parameters():
            p.requires_grad_(False)
        model = apply_lora(model, LoraSettings(rank=4, alpha=8.0, top_layers=2))
        assert frozen_bottom_layers(model) == 2
        trainer = Trainer(model, make_sft(), OfflineBatchSource(_chat_items(tok), 4, seed=0),
                          TrainerConfig(lr=1e-2, cache_frozen_bottom=cache), pad_token_id=tok.pad_token_id)
        losses = [asyncio.run(trainer.train_step())["loss"] for _ in range(6)]
        ends.append((losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
                     trainer.bottom_cache))
    (plain_losses, plain, _), (losses, cached, bottom) = ends
    assert bottom.misses == 12 and bottom.hits == 12 and bottom.stats()["items"] == 12
    torch.testing.assert_close(losses, plain_losses, rtol=1e-4, atol=1e-5)
    assert plain and all("lora_" in n for n in plain)
    for n, p in plain.items():
        torch.testing.assert_close(cached[n], p, rtol=1e-4, atol=1e-4)


def _grouped_items(tok, prompts=4, replies=3):
    """GRPO-shaped SFT items: each of ``prompts`` questions with ``replies`` different answers (the rewards-only
    recipe's batches: a position's group of samples)."""
    words = ["yes", "no", "maybe", "never", "always", "often", "rarely", "soon", "later", "now", "then", "here"]
    return [sft_item({"messages": [{"role": "system", "content": "Answer with one word, as asked."},
                                   {"role": "user", "content": f"Say {words[q]} or not."}],
                      "completion": words[(q + 1 + r) % len(words)] + " " * r}, tok)
            for q in range(prompts) for r in range(replies)]


def test_a_per_prompt_bottom_cache_trains_like_the_plain_forward(four_layer_dir):
    """RL's case: prompts met again with new replies. A LoRA on the top 2 of 4 layers; with
    ``cache_frozen_bottom="prompt"`` each distinct prompt's bottom (keys, values, output) is computed once and
    every step runs the bottom over the replies only: the losses and the adapter end where plain training puts
    them, and the first pass over the data misses once per prompt, not per item."""
    from ludic.training.lora import LoraSettings, apply_lora

    ends = []
    for cache in ("off", "prompt"):
        model, tok = load_policy(four_layer_dir, dtype="float32", seed=0)
        for p in model.parameters():
            p.requires_grad_(False)
        model = apply_lora(model, LoraSettings(rank=4, alpha=8.0, top_layers=2))
        items = _grouped_items(tok)
        assert len({tuple(it.prompt_ids) for it in items}) == 4 and len({tuple(it.completion_ids) for it in items}) > 4
        trainer = Trainer(model, make_sft(), OfflineBatchSource(items, 6, seed=0),
                          TrainerConfig(lr=1e-2, cache_frozen_bottom=cache), pad_token_id=tok.pad_token_id)
        losses = [asyncio.run(trainer.train_step())["loss"] for _ in range(6)]
        ends.append((losses, {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad},
                     trainer.bottom_cache))
    (plain_losses, plain, none), (losses, cached, bottom) = ends
    assert none is None and bottom.prompts is not None
    st = bottom.stats()
    assert st["items"] == 4 and st["misses"] == 4 and st["hits"] > 0  # one bottom pass per distinct prompt
    torch.testing.assert_close(losses, plain_losses, rtol=1e-4, atol=1e-5)
    for n, p in plain.items():
        torch.testing.assert_close(cached[n], p, rtol=1e-4, atol=1e-4)
    with pytest.raises(ValueError, match="off, item or prompt"):
        TrainerConfig(cache_frozen_bottom="prompts")


@pytest.mark.parametrize("packed", [True, False])
def test_a_per_prompt_bottom_scores_like_the_plain_forward_in_both_layouts(four_layer_dir, packed):
    """The packed layout runs the replies through the bottom over flat tokens (``packed._replies_through_bottom``,
    prompts of different lengths, groups of different sizes), the padded one through the model's forward over a
    cache of the prompts' keys: both give the plain forward's log-probs and LoRA gradients."""
    from ludic.training import packed as packed_module
    from ludic.training.frozen_cache import FrozenBottomCache
    from ludic.training.lora import LoraSettings, apply_lora
    from ludic.training.microbatch import collate
    from ludic.training.scoring import score_actions

    model, tok = load_policy(four_layer_dir, dtype="float32", seed=0)
    for p in model.parameters():
        p.requires_grad_(False)
    model = apply_lora(model, LoraSettings(rank=4, alpha=8.0, top_layers=2))
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.1)
    items = _grouped_items(tok, prompts=3, replies=3)[:-1] + _chat_items(tok, 2)  # a group of 2, two of 1
    mb = collate(items, tok.pad_token_id)
    cache = FrozenBottomCache(model, 2, per="prompt")
    calls = []
    real = packed_module._replies_through_bottom
    packed_module._replies_through_bottom = lambda *a: calls.append(1) or real(*a)
    try:
        got = []
        for bottom in (None, cache, cache):  # the second pass reads every prompt from the cache
            model.zero_grad(set_to_none=True)
            logp, _ = score_actions(model, mb, bottom=bottom, packed=packed)
            logp.sum().backward()
            got.append((logp.detach(), [p.grad.clone() for p in model.parameters() if p.requires_grad]))
    finally:
        packed_module._replies_through_bottom = real
    assert len(calls) == (2 if packed else 0)
    assert cache.stats()["misses"] == 5 and cache.stats()["hits"] == 5
    for logp, grads in got[1:]:
        torch.testing.assert_close(logp, got[0][0], rtol=1e-4, atol=1e-5)
        for g, want in zip(grads, got[0][1]):
            torch.testing.assert_close(g, want, rtol=1e-4, atol=1e-5)
