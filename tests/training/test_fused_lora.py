"""LoRA linears routed through ``ludic.training.lora._LoraLinear`` (``fuse_lora_linears``, applied
by ``apply_lora``): the same outputs and gradients as peft's own forward, which stays in use
wherever the two would differ."""

import types

import pytest
import torch

from ludic.training.microbatch import collate
from ludic.training.scoring import score_actions
from ludic.training.lora import LoraSettings, fuse_lora_linears, load_policy
from ludic.types import SAWItem


def _policy(tiny_model_dir, dtype, **lora):
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8, **lora), dtype=dtype, seed=0)
    with torch.no_grad():  # adapters away from their zero start, so both A and B get gradients
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    return model, tok


def _peft_only(model):
    """Undo the routing (peft's class forward again)."""
    from peft.tuners.lora import Linear

    for m in model.modules():
        if isinstance(m, Linear):
            m.__dict__.pop("forward", None)


def _loss_and_grads(model, mb):
    model.zero_grad()
    logp, _ = score_actions(model, mb)
    (logp * torch.linspace(-1, 1, logp.numel())).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    model.zero_grad()
    return logp.detach(), grads


def _batch(tok):
    items = [SAWItem(tuple(range(5, 5 + p)), tuple(range(50, 50 + c)), 1.0) for p, c in [(7, 3), (4, 6), (9, 2)]]
    return collate(items, tok.pad_token_id)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-5), ("bfloat16", 0.03)])
def test_routed_lora_equals_peft(tiny_model_dir, dtype, tol):
    model, tok = _policy(tiny_model_dir, dtype)
    assert sum("forward" in m.__dict__ for m in model.modules()) == 14  # 7 linears x 2 layers
    mb = _batch(tok)
    model.train()
    logp, grads = _loss_and_grads(model, mb)
    _peft_only(model)
    ref_logp, ref = _loss_and_grads(model, mb)
    assert torch.allclose(logp, ref_logp, atol=tol * 10 if dtype == "bfloat16" else tol)
    assert grads.keys() == ref.keys() and any("lora_A" in n for n in grads)
    for n in grads:
        assert grads[n].dtype == ref[n].dtype == torch.float32  # fp32 adapters keep fp32 gradients
        assert (grads[n] - ref[n]).abs().max() <= tol * ref[n].abs().max() + 1e-8, n


def test_disabled_adapters_and_dropout_fall_back_to_peft(tiny_model_dir, monkeypatch):
    from ludic.training import lora as lora_mod

    model, tok = _policy(tiny_model_dir, "float32", dropout=0.5)
    calls = []
    routed = lora_mod._LoraLinear.apply
    monkeypatch.setattr(lora_mod._LoraLinear, "apply", lambda *a: calls.append(1) or routed(*a))
    mb = _batch(tok)
    model.train()  # dropout active: peft's path (its dropout mask)
    score_actions(model, mb)
    assert not calls
    model.eval()  # no dropout in eval: routed
    with torch.no_grad():
        on = score_actions(model, mb)[0]
    assert calls
    calls.clear()
    with torch.no_grad(), model.disable_adapter():  # the KL reference: the base alone, via peft
        off = score_actions(model, mb)[0]
    assert not calls and not torch.allclose(on, off)


def test_saved_adapters_are_unchanged_by_the_routing(tiny_model_dir, tmp_path):
    model, _ = _policy(tiny_model_dir, "float32")
    model.save_pretrained(tmp_path / "a")
    keys = set(model.state_dict())
    _peft_only(model)
    assert set(model.state_dict()) == keys
    assert fuse_lora_linears(model) == 14
    assert isinstance(model.base_model.model.model.layers[0].self_attn.q_proj.forward, types.MethodType)
    assert (tmp_path / "a" / "adapter_model.safetensors").exists()
