"""Mixed precision: fp32 master weights under a bf16 model (training.precision).

An AdamW step moves a weight by about ``lr``. For a bf16 weight in [1, 2) (ulp 2^-7, about 0.0078)
a step of 1e-3 is under half an ulp: stored back into bf16 it rounds to the weight it started from.
Pure bf16 training (the optimizer on the bf16 weights) then never moves; with fp32 masters the
updates add up and, after a few steps, the bf16 weights the model computes with move too.
"""

import torch

from ludic.training.algorithms import make_sft
from ludic.training.lora import load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWBatch, SAWItem

LR = 1e-3


class FixedSource:
    def __init__(self, items):
        self.items = items

    async def next_batch(self):
        return SAWBatch(items=list(self.items), meta={})


def _items(n=4):
    g = torch.Generator().manual_seed(0)
    return [SAWItem(tuple(torch.randint(5, 500, (8,), generator=g).tolist()),
                    tuple(torch.randint(5, 500, (4,), generator=g).tolist()), 1.0) for _ in range(n)]


def _bf16_model_one_trainable(model_dir):
    """The tiny model in bf16, everything frozen but the last MLP's down projection, whose weights are
    set in [1, 2): a step of LR is under half a bf16 ulp of every one of them."""
    model, tok = load_policy(str(model_dir), dtype="bfloat16")
    for p in model.parameters():
        p.requires_grad_(False)
    w = model.model.layers[-1].mlp.down_proj.weight
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        w.copy_((1.0 + torch.rand(w.shape, generator=g)).to(torch.bfloat16))
    w.requires_grad_(True)
    return model, tok, w


def _trainer(model, tok, **cfg):
    items = _items()
    tcfg = TrainerConfig(lr=LR, betas=(0.9, 0.999), weight_decay=0.0, max_grad_norm=1e9, **cfg)
    return Trainer(model, make_sft(), FixedSource(items), tcfg, pad_token_id=tok.pad_token_id), items


def test_update_under_half_a_bf16_ulp_moves_fp32_masters_not_pure_bf16(tiny_model_dir):
    # mixed precision (the default): the optimizer holds an fp32 master of the bf16 weight
    model, tok, w = _bf16_model_one_trainable(tiny_model_dir)
    start = w.detach().clone()
    trainer, items = _trainer(model, tok)
    (master,) = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert master.dtype == torch.float32 and master is not w
    assert all(s["exp_avg"].dtype == torch.float32 for s in [trainer.optimizer.state.get(master, {})] if s)
    trainer.optimize(items)
    moved = (master.detach() - start.float()).abs()
    assert float(moved.max()) > 0.5 * LR, "one step did not move the fp32 master"
    assert float(moved.max()) < 2 ** -8, "the step was meant to be under half a bf16 ulp"
    assert trainer.optimizer.state[master]["exp_avg"].dtype == torch.float32
    assert torch.equal(w.detach(), start), "one sub-ulp step already changed the bf16 weight"
    for _ in range(7):
        trainer.optimize(items)
    changed = (w.detach() != start).float().mean()
    assert float(changed) > 0.5, f"after 8 steps only {float(changed):.1%} of the bf16 weights moved"
    assert torch.equal(w.detach(), master.detach().to(torch.bfloat16)), "the model computes with its rounded master"

    # pure bf16 (the explicit flag): the same steps round away on every weight
    model, tok, w = _bf16_model_one_trainable(tiny_model_dir)
    trainer, items = _trainer(model, tok, master_weights=False)
    (param,) = [p for g in trainer.optimizer.param_groups for p in g["params"]]
    assert param is w
    for _ in range(8):
        trainer.optimize(items)
    assert torch.equal(w.detach(), start), "pure bf16 kept a sub-ulp update"


def test_resume_continues_from_the_fp32_masters(tiny_model_dir, tmp_path):
    """A checkpoint of a bf16 model stores the masters: the resumed run's next step is the uninterrupted one's."""
    def make():
        model, tok, w = _bf16_model_one_trainable(tiny_model_dir)
        trainer, items = _trainer(model, tok, checkpoint_every=2)
        trainer.checkpoint_dir = tmp_path / "ckpt"
        return trainer, items, w

    import asyncio

    trainer, items, w = make()
    asyncio.run(trainer.train(2))
    (master,) = trainer.masters.params
    assert (tmp_path / "ckpt" / "step_000002" / "master_weights.safetensors").exists()
    saved_master = master.detach().clone()
    assert not torch.equal(saved_master.to(torch.bfloat16).float(), saved_master), "masters hold more than bf16"
    asyncio.run(trainer.train(3))
    want_master, want_w = master.detach().clone(), w.detach().clone()

    resumed, items, w2 = make()
    assert resumed.resume() and resumed.step == 2
    assert torch.equal(resumed.masters.params[0].detach(), saved_master)
    assert torch.equal(w2.detach(), saved_master.to(torch.bfloat16))
    asyncio.run(resumed.train(3))
    assert torch.equal(resumed.masters.params[0].detach(), want_master)
    assert torch.equal(w2.detach(), want_w)


def test_fp16_scales_the_loss_and_skips_an_overflowing_step(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), dtype="float16")
    trainer, items = _trainer(model, tok)
    assert trainer.masters.scaler is not None and trainer.masters.active
    (name, w), = [(n, p) for n, p in model.named_parameters() if n.endswith("layers.1.mlp.down_proj.weight")]
    start = w.detach().clone()
    m = trainer.optimize(items)
    assert m["loss_scale"] == 2.0 ** 16 and "skipped_overflow" not in m and m["grad_norm"] < 1e4
    assert not torch.equal(w.detach(), start), "an fp16 step changed nothing"
    # an overflow: the scaled gradients are not finite -> no step, the scale halves
    trainer.masters.scaler.scale = 1e30
    before = w.detach().clone()
    m = trainer.optimize(items)
    assert m.get("skipped_overflow") == 1 and m["loss_scale"] == 5e29
    assert torch.equal(w.detach(), before)


def test_auto_device_follows_the_machine_and_ludic_device(tiny_model_dir, monkeypatch):
    """``device="auto"`` (every recipe's default) is the GPU where PyTorch sees one, else the CPU;
    ``$LUDIC_DEVICE`` overrides it, and a device given outright is kept. (The GPU side runs in
    tests/gpu/test_cuda.py on a GPU machine.)"""
    from ludic.inference.models import resolve_device

    monkeypatch.delenv("LUDIC_DEVICE", raising=False)
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cuda:1") == "cuda:1"
    monkeypatch.setenv("LUDIC_DEVICE", "cpu")
    assert resolve_device("auto") == "cpu"
    model, _ = load_policy(str(tiny_model_dir), dtype="float32")
    assert next(model.parameters()).device.type == "cpu"
    monkeypatch.setenv("LUDIC_DEVICE", "meta")  # a device the loader then really uses
    model, _ = load_policy(str(tiny_model_dir), dtype="float32")
    assert next(model.parameters()).device.type == "meta"


def test_a_trainer_built_before_another_trained_the_model_steps_from_that_training(tiny_model_dir):
    """``ludic train env --format-demos`` builds the RL Trainer, then a format SFT (its own Trainer) trains
    the model. Was, for bf16 weights with fp32 masters (full fine-tuning): the RL trainer's masters still
    held the weights from before the SFT and the gradient hooks fed the SFT trainer's masters, so the first
    RL step wrote the old weights back and the SFT was lost."""
    model, tok, w = _bf16_model_one_trainable(tiny_model_dir)
    rl, items = _trainer(model, tok)
    before = w.detach().clone()
    sft = Trainer(model, make_sft(), FixedSource(items), TrainerConfig(lr=0.05, max_grad_norm=1e9),
                  pad_token_id=tok.pad_token_id)  # a large step: the bf16 weights surely change
    sft.optimize(items)
    after_sft = w.detach().clone()
    assert not torch.equal(after_sft, before)
    rl.optimize(items)  # one RL step of LR: a small move from the SFT's weights, not back to the old ones
    moved_from_sft = (w.detach().float() - after_sft.float()).abs().max()
    assert float(moved_from_sft) < 0.02, f"the RL step moved the weights {float(moved_from_sft):.3f} from the SFT's"
    (master,) = rl.masters.params
    assert torch.equal(w.detach(), master.detach().to(torch.bfloat16))


def _fp16_lora(model_dir):
    from ludic.training.lora import LoraSettings

    model, tok = load_policy(str(model_dir), dtype="float16", lora=LoraSettings(rank=4, alpha=8))
    assert {p.dtype for p in model.parameters() if p.requires_grad} == {torch.float32}  # peft's fp32 adapters
    return model, tok


def test_fp16_model_with_fp32_lora_adapters_scales_the_loss(tiny_model_dir):
    """Was: the scaler existed only when a trainable parameter was fp16, so LoRA on an fp16 model (adapters fp32,
    the forward and backward fp16) trained without loss scaling: small gradients flushed to zero in the fp16
    backward, and an overflow was not caught as one."""
    model, tok = _fp16_lora(tiny_model_dir)
    trainer, items = _trainer(model, tok)
    assert not trainer.masters.active  # the adapters are fp32: no masters
    assert trainer.masters.scaler is not None, "an fp16 forward/backward without a loss scaler"
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    m = trainer.optimize(items)
    assert m["loss_scale"] == 2.0 ** 16 and "skipped_overflow" not in m
    assert any(not torch.equal(p.detach(), adapters[n]) for n, p in model.named_parameters() if p.requires_grad)
    trainer.masters.scaler.scale = 1e30  # the scaled fp16 gradients overflow: no step, the scale halves
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    m = trainer.optimize(items)
    assert m.get("skipped_overflow") == 1 and m["loss_scale"] == 5e29
    assert all(torch.equal(p.detach(), before[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_loss_scaling_follows_the_compute_dtype():
    """The scaler's decision: the dtype the forward and backward compute in, not the trainable parameters' own."""
    from ludic.training.precision import needs_loss_scaling

    lin = torch.nn.Linear(4, 4)
    assert not needs_loss_scaling(lin)
    assert needs_loss_scaling(torch.nn.Linear(4, 4).half())
    assert not needs_loss_scaling(torch.nn.Linear(4, 4).bfloat16())
    mixed = torch.nn.Sequential(torch.nn.Linear(4, 4).half(), torch.nn.Linear(4, 4))  # an fp16 base, an fp32 head
    mixed[0].requires_grad_(False)
    assert needs_loss_scaling(mixed)


def _nonfinite_stop(trainer, steps):
    import asyncio

    import pytest

    from ludic.errors import TrainingStopped

    with pytest.raises(TrainingStopped) as stop:
        asyncio.run(trainer.train(steps))
    assert stop.value.reason == "nonfinite" and trainer.stopped["reason"] == "nonfinite"
    return stop.value


def test_fp16_a_nan_loss_is_not_an_overflow_and_stops_the_run(tiny_model_dir):
    """Was: under fp16 a NaN reward's NaN gradient was taken for an overflow: ``skipped_overflow``, the scale
    halved, and the step never counted toward ``max_nonfinite_steps``, so the run skipped every step forever."""
    model, tok = _fp16_lora(tiny_model_dir)
    nan_items = [SAWItem(it.prompt_ids, it.completion_ids, float("nan")) for it in _items()]
    trainer = Trainer(model, make_sft(), FixedSource(nan_items), TrainerConfig(lr=LR, max_nonfinite_steps=3),
                      pad_token_id=tok.pad_token_id)
    adapters = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    stop = _nonfinite_stop(trainer, 10)
    assert trainer.step == 2 and trainer.nonfinite_streak == 3, (trainer.step, str(stop))  # the third raised
    assert trainer.masters.scaler.scale == 2.0 ** 16, "a NaN loss lowered the loss scale"
    assert all(torch.equal(p.detach(), adapters[n]) for n, p in model.named_parameters() if p.requires_grad)


def test_fp16_a_gradient_past_fp16_range_at_any_scale_stops_the_run_below_scale_1(tiny_model_dir):
    """Was: the scale floored at 1 and an overflow never counted: a gradient past fp16's range itself (here an
    advantage of 1e30: a finite loss, an unscaled gradient no fp16 holds) skipped every step forever. Now the scale
    goes below 1, and overflows there (the scale cannot help) count toward ``max_nonfinite_steps``."""
    model, tok = _fp16_lora(tiny_model_dir)
    huge = [SAWItem(it.prompt_ids, it.completion_ids, 1e30) for it in _items()]
    trainer = Trainer(model, make_sft(), FixedSource(huge), TrainerConfig(lr=LR, max_nonfinite_steps=3),
                      pad_token_id=tok.pad_token_id)
    trainer.masters.scaler.scale = 2.0  # one overflow still the scale's to fix, then three at 1 and below
    stop = _nonfinite_stop(trainer, 20)
    assert trainer.step == 3 and trainer.masters.scaler.scale == 0.125, (trainer.step, trainer.masters.scaler.scale)
    assert "fp16 overflow at loss scale 0.25" in str(stop), str(stop)


def test_fp16_a_genuine_overflow_lowers_the_scale_and_recovers_without_stopping(tiny_model_dir):
    """An overflow the scale fixes (a scale far too high) skips steps without counting toward the stop."""
    model, tok = _fp16_lora(tiny_model_dir)
    trainer, items = _trainer(model, tok, max_nonfinite_steps=2)
    trainer.masters.scaler.scale = 2.0 ** 40
    skipped = 0
    for _ in range(40):
        m = trainer.optimize(items)
        if not m.get("skipped_overflow"):
            break
        skipped += 1
    assert 2 < skipped < 40 and trainer.nonfinite_streak == 0 and trainer.masters.scaler.scale >= 1.0, skipped


def test_fp16_loss_scale_is_checkpointed_and_resumed(tiny_model_dir, tmp_path):
    """Was: the loss scale and its count of clean steps were not in the checkpoint: a resumed fp16 run restarted at
    2^16 (overflowing again from the top) and its growth count at 0."""
    import asyncio

    def make():
        model, tok = _fp16_lora(tiny_model_dir)
        trainer, _ = _trainer(model, tok, checkpoint_every=2)
        trainer.checkpoint_dir = tmp_path / "ckpt"
        return trainer

    trainer = make()
    trainer.masters.scaler.scale = 2.0 ** 10
    asyncio.run(trainer.train(2))
    saved = (trainer.masters.scaler.scale, trainer.masters.scaler.good_steps)
    assert saved == (2.0 ** 10, 2), saved
    resumed = make()
    assert resumed.resume() and resumed.step == 2
    assert (resumed.masters.scaler.scale, resumed.masters.scaler.good_steps) == saved


def test_weights_loaded_into_a_bf16_model_mid_run_become_the_masters(tiny_model_dir):
    """Was: weights loaded into a bf16 model under a live trainer (``load_state_dict``, ``load_model_weights``) were
    silently overwritten at the next step by the rounding of the old fp32 masters, and a checkpoint or keep-best
    snapshot taken before it stored the old masters. Now the trainer takes the loaded weights as masters, warning."""
    import pytest

    model, tok, w = _bf16_model_one_trainable(tiny_model_dir)
    trainer, items = _trainer(model, tok)
    trainer.optimize(items)
    (name,) = [n for n, p in model.named_parameters() if p is w]
    g = torch.Generator().manual_seed(2)
    loaded = (-1.0 - torch.rand(w.shape, generator=g)).to(torch.bfloat16)  # far from the weights trained so far
    model.load_state_dict({name: loaded}, strict=False)
    with pytest.warns(UserWarning, match="changed outside the trainer"):
        saved = trainer.masters.state_dict(model)[name]  # what a checkpoint / keep-best would store now
    assert torch.equal(saved.to(torch.bfloat16), loaded), "a checkpoint would hold the old masters"
    trainer.optimize(items)  # one step of LR from the loaded weights, not back to the old ones
    assert float((w.detach().float() - loaded.float()).abs().max()) < 0.02, "the loaded weights were discarded"
    (master,) = trainer.masters.params
    assert torch.equal(w.detach(), master.detach().to(torch.bfloat16))
    # a load right before a step (no checkpoint between) is caught too
    again = (1.0 + torch.rand(w.shape, generator=g)).to(torch.bfloat16)
    model.load_state_dict({name: again}, strict=False)
    with pytest.warns(UserWarning, match="changed outside the trainer"):
        trainer.optimize(items)
    assert float((w.detach().float() - again.float()).abs().max()) < 0.02, "the loaded weights were discarded"
    # loading what the model already holds (its masters' rounding) changes nothing and says nothing
    model.load_state_dict({name: w.detach().clone()}, strict=False)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert trainer.masters.sync() == 0
