"""Trainer: loss goes down, GRPO end to end on a tiny real model, checkpoints resume exactly."""

import asyncio

import pytest
import torch
from conftest import vowel_grpo_trainer

from ludic.training.algorithms import make_algorithm, make_sft
from ludic.training.lora import LoraSettings, load_policy
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWBatch, SAWItem


class FixedSource:
    def __init__(self, items):
        self.items = items

    async def next_batch(self):
        return SAWBatch(items=list(self.items), meta={"num_items": len(self.items)})


def _sft_items(n=6):
    g = torch.Generator().manual_seed(0)
    return [SAWItem(tuple(torch.randint(5, 500, (8,), generator=g).tolist()),
                    tuple(torch.randint(5, 500, (4,), generator=g).tolist()), 1.0) for _ in range(n)]


def _lora_params(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def test_one_step_lowers_loss_on_fixed_batch(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    items = _sft_items()
    trainer = Trainer(model, make_sft(), FixedSource(items), TrainerConfig(lr=1e-2, micro_token_budget=24),
                      pad_token_id=tok.pad_token_id)
    before = trainer.optimize(items)
    after = trainer.optimize(items)
    assert after["loss"] < before["loss"] and torch.isfinite(torch.tensor(before["grad_norm"]))


def _grpo_setup(model_dir, run_dir, steps=2):
    return vowel_grpo_trainer(model_dir, run_dir, TrainerConfig(lr=5e-2, checkpoint_every=steps, max_to_keep=3))


def test_grpo_end_to_end_changes_lora_and_resumes(tiny_model_dir, tmp_path):
    model, engine, trainer = _grpo_setup(tiny_model_dir, tmp_path)
    start = _lora_params(model)
    history = []
    last = asyncio.run(trainer.train(2, lambda step, m: history.append(m)))
    assert trainer.step == 2 and engine.policy_version == 2
    assert last is history[-1]  # train() returns the last step's metrics
    for m in history:
        for k in ("loss", "grad_norm", "reward_mean"):
            assert torch.isfinite(torch.tensor(float(m[k]))), (k, m[k])
        assert m["num_items"] == 8
    changed = [n for n, p in _lora_params(model).items() if not torch.equal(p, start[n])]
    assert changed, "LoRA weights did not change"
    ckpt = tmp_path / "ckpt" / "step_000002"
    assert (ckpt / "model" / "adapter_model.safetensors").exists() and (ckpt / "optimizer.pt").exists()
    trained = _lora_params(model)

    model2, engine2, trainer2 = _grpo_setup(tiny_model_dir, tmp_path)
    assert trainer2.resume()
    assert trainer2.step == 2 and trainer2.policy_version == 2
    trainer2.publish_start()  # what train() does before the first rollout
    assert engine2.policy_version == 2
    for n, p in _lora_params(model2).items():
        assert torch.equal(p, trained[n]), n
    s1, s2 = trainer.optimizer.state_dict()["state"], trainer2.optimizer.state_dict()["state"]
    assert all(torch.equal(s1[k]["exp_avg"], s2[k]["exp_avg"]) for k in s1)
    assert asyncio.run(trainer2.train(3))["num_items"] == 8
    assert trainer2.step == 3 and asyncio.run(trainer2.train(3)) == {}  # no step left to run


def test_stale_items_are_dropped(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    items = [SAWItem((5, 6, 7), (8, 9), 1.0, logprobs=(-1.0, -1.0), policy_versions=(v, v)) for v in (0, 3, 5)]
    trainer = Trainer(model, make_algorithm("grpo"), FixedSource(items), TrainerConfig(max_lag=2),
                      pad_token_id=tok.pad_token_id)
    trainer.policy_version = 5
    m = asyncio.run(trainer.train_step())
    assert m["stale_dropped"] == 1 and m["num_items"] == 2


def test_full_finetuning_with_kl_builds_a_frozen_reference_of_the_starting_policy(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    items = [SAWItem((5, 6, 7), (8, 9), 1.0, logprobs=(-1.0, -1.0))]
    trainer = Trainer(model, make_algorithm("grpo", kl_coef=0.1), FixedSource(items), TrainerConfig(lr=1e-2),
                      pad_token_id=tok.pad_token_id)
    assert trainer.optimize(items)["kl"] == pytest.approx(0.0, abs=1e-6)  # policy == reference at the start
    m = trainer.optimize(items)
    assert m["kl"] > 0 and m["kl_loss"] != 0
    assert all(torch.equal(p, start[n]) for n, p in trainer.ref_model.named_parameters())
    assert not any(p.requires_grad for p in trainer.ref_model.parameters())


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids], device=model.device)).logits


def test_training_on_top_of_an_adapter_keeps_it_as_the_kl_reference(tiny_model_dir, tmp_path):
    """--adapter <sft>: the SFT adapter is merged into the base and a fresh LoRA trains on top, so
    'adapters disabled' (the KL reference) is the SFT policy, not the raw base model."""
    from ludic.training.scoring import adapters_disabled

    sft, _ = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=1)
    with torch.no_grad():
        for n, p in sft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)  # a trained adapter: B != 0
    sft.save_pretrained(tmp_path / "sft_adapter")
    ids = [5, 9, 17, 33, 40]
    sft_logits = _logits(sft, ids)
    base_logits = _logits(load_policy(str(tiny_model_dir), dtype="float32")[0], ids)
    assert not torch.allclose(sft_logits, base_logits, atol=1e-3)

    model, _ = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), adapter=str(tmp_path / "sft_adapter"),
                           dtype="float32", seed=0)
    assert torch.allclose(_logits(model, ids), sft_logits, atol=1e-4)  # starts as the SFT policy
    with adapters_disabled(model):
        assert torch.allclose(_logits(model, ids), sft_logits, atol=1e-4)  # the reference is the SFT policy
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    assert all(float(p.detach().abs().max()) == 0 for n, p in model.named_parameters() if "lora_B" in n)  # fresh


def test_the_kl_reference_is_the_policy_rl_starts_from_after_an_in_run_cold_start(tiny_model_dir, tmp_path):
    """--tool-demos / --format-demos train the run's own adapter before RL. The KL reference is that
    policy (KL 0 at the first RL step), not the base model with the adapter switched off; a resumed
    run keeps it (the checkpoint holds it)."""
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    items = [SAWItem((5, 6, 7, 11), (8, 9, 10), 1.0, logprobs=(-1.0, -1.0, -1.0))]
    cfg = TrainerConfig(lr=1e-2, checkpoint_every=1)
    trainer = Trainer(model, make_algorithm("grpo", kl_coef=0.1), FixedSource(items), cfg,
                      pad_token_id=tok.pad_token_id, checkpoint_dir=tmp_path / "ckpt")
    with torch.no_grad():  # the cold start: the adapter is trained before the first RL step
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.5)
    first = asyncio.run(trainer.train_step())
    assert first["kl"] == pytest.approx(0.0, abs=1e-6)  # the reference is the cold-started policy
    assert asyncio.run(trainer.train_step())["kl"] > 0

    resumed_model, _ = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    resumed = Trainer(resumed_model, make_algorithm("grpo", kl_coef=0.1), FixedSource(items), cfg,
                      pad_token_id=tok.pad_token_id, checkpoint_dir=tmp_path / "ckpt")
    assert resumed.resume() and resumed.step == 2
    assert resumed.optimize(items)["kl"] == pytest.approx(trainer.optimize(items)["kl"], rel=1e-4)


def test_a_fresh_adapter_keeps_the_base_as_its_kl_reference_without_a_copy(tiny_model_dir):
    """A fresh LoRA (B = 0) is the base policy: the reference switches the adapter off, no snapshot."""
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    items = [SAWItem((5, 6, 7), (8, 9), 1.0, logprobs=(-1.0, -1.0))]
    trainer = Trainer(model, make_algorithm("grpo", kl_coef=0.1), FixedSource(items), TrainerConfig(lr=1e-2),
                      pad_token_id=tok.pad_token_id)
    assert trainer.optimize(items)["kl"] == pytest.approx(0.0, abs=1e-6)
    assert trainer.reference.mode == "base" and trainer.optimize(items)["kl"] > 0


def test_scale_lr_by_signal_moves_the_weights_as_far_as_the_batch_has_signal(tiny_model_dir):
    """Adam's step is about lr per weight whatever the batch holds. With scale_lr_by_signal a batch whose
    tokens are half zero-advantage moves the weights half as far, and a batch with no signal does not move
    them (plain AdamW would, on its momentum)."""
    signal = [SAWItem((5, 6, 7), (8, 9), 1.0), SAWItem((5, 6, 7), (10, 11), -1.0)]
    silent = [SAWItem((5, 6, 7), (12, 13), 0.0), SAWItem((5, 6, 7), (14, 15), 0.0)]

    def moved(scale: bool, batches, full_step_signal=1.0) -> list[dict[str, torch.Tensor]]:
        model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
        trainer = Trainer(model, make_algorithm("reinforce"), FixedSource([]),
                          TrainerConfig(lr=1e-3, scale_lr_by_signal=scale, full_step_signal=full_step_signal),
                          pad_token_id=tok.pad_token_id)
        out = []
        for batch in batches:
            before = _lora_params(model)
            m = trainer.optimize(batch)
            signal = 1.0 - sum(it.weight == 0 for it in batch) / len(batch)
            assert m["lr_scale"] == (min(1.0, signal / full_step_signal) if scale else 1.0)
            out.append({n: p - before[n] for n, p in _lora_params(model).items()})
        return out

    (full,) = moved(False, [signal])
    (half,) = moved(True, [signal + silent])
    assert max(float(d.abs().max()) for d in full.values()) > 0
    for n in full:
        torch.testing.assert_close(half[n], 0.5 * full[n], rtol=1e-4, atol=1e-9)
    (half_full,) = moved(True, [signal + silent], full_step_signal=0.5)  # half informative: a full step
    for n in full:
        torch.testing.assert_close(half_full[n], full[n], rtol=1e-4, atol=1e-9)
    _, plain = moved(False, [signal, silent])
    _, scaled = moved(True, [signal, silent])
    assert max(float(d.abs().max()) for d in plain.values()) > 0  # momentum alone moved them
    assert all(float(d.abs().max()) == 0 for d in scaled.values())


def test_scale_lr_by_signal_counts_the_items_a_sample_filter_dropped(tiny_model_dir, tmp_path):
    """drop_zero_weight (DAPO, MMD, tic-tac-toe's position RL) removes the zero-advantage items before the
    trainer sees them. They are still tokens of the step without signal: the step's lr_scale and the logged
    zero_adv_token_share are the same with the filter as without it (same seeds, same rollouts)."""
    from ludic.rollouts.batch import drop_zero_weight

    def first_step(sample_filter, name):
        _, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path / name, TrainerConfig(lr=1e-3, scale_lr_by_signal=True),
                                           env=["test_vowels", "test_never_rewarded"], sample_filter=sample_filter)
        return asyncio.run(trainer.train_step())

    plain, filtered = first_step(None, "plain"), first_step(drop_zero_weight, "filtered")
    assert filtered["num_items_filtered"] == 4 and plain["zero_var_group_share"] == 0.5  # the case in question
    assert filtered["zero_adv_token_share"] == pytest.approx(plain["zero_adv_token_share"])
    assert filtered["lr_scale"] == pytest.approx(plain["lr_scale"]) and plain["lr_scale"] < 1


class RecordingPublisher:
    def __init__(self):
        self.versions = []

    def publish(self, model, version):
        self.versions.append(version)
        return {}


def test_items_longer_than_max_seq_len_are_counted_not_silently_dropped(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    fits = SAWItem((5, 6, 7), (8, 9), 1.0)
    cut = SAWItem((5, 6, 7, 8), (9, 10, 11, 12), 1.0)       # 8 tokens: the completion loses 2
    too_long = SAWItem(tuple(range(5, 15)), (20, 21), 1.0)   # the prompt alone exceeds 6 tokens
    trainer = Trainer(model, make_sft(), FixedSource([fits, cut, too_long]), TrainerConfig(max_seq_len=6),
                      pad_token_id=tok.pad_token_id)
    m = asyncio.run(trainer.train_step())
    assert m["seq_truncated"] == 1 and m["seq_dropped"] == 1 and m["num_items"] == 2


def test_empty_steps_do_not_advance_schedule_version_or_publish_and_stop_the_run(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    pub = RecordingPublisher()
    trainer = Trainer(model, make_sft(), FixedSource([]), TrainerConfig(lr_schedule="linear", total_steps=10,
                      max_empty_steps=3), publisher=pub, pad_token_id=tok.pad_token_id)
    lr0 = trainer.scheduler.get_last_lr()[0]
    m = asyncio.run(trainer.train_step())
    assert m["empty_batch"] and trainer.step == 0 and trainer.policy_version == 0
    assert trainer.scheduler.get_last_lr()[0] == lr0 and pub.versions == [0]  # only the starting weights
    with pytest.raises(RuntimeError, match="3 empty batches in a row"):
        asyncio.run(trainer.train(5))


def test_truncated_sampling_is_refused_for_importance_ratio_losses(tiny_model_dir):
    """top-p / top-k sampler log-probs are of a renormalised truncated distribution the trainer does not
    compute: an importance ratio against them would be wrong, so the trainer refuses with a clear message."""
    model, tok = load_policy(str(tiny_model_dir), dtype="float32")
    items = [SAWItem((5, 6, 7), (8, 9), 1.0, logprobs=(-1.0, -1.0), top_p=0.9)]
    trainer = Trainer(model, make_algorithm("grpo"), FixedSource(items), pad_token_id=tok.pad_token_id)
    with pytest.raises(ValueError, match="top_p=0.9"):
        trainer.optimize(items)
    ok = Trainer(model, make_algorithm("reinforce", is_cap=None), FixedSource(items), pad_token_id=tok.pad_token_id)
    assert ok.optimize(items)["num_items"] == 1


def test_ppo_inner_loop_epochs_and_minibatches_over_one_collected_batch(tiny_model_dir):
    """ppo_epochs x num_minibatches optimizer steps per collected batch; the ratio moves away from 1 and
    clipping acts; the policy version, the publish and the LR schedule advance once per batch."""
    from ludic.training.microbatch import collate
    from ludic.training.scoring import score_actions

    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    g = torch.Generator().manual_seed(0)
    raw = [SAWItem(tuple(torch.randint(5, 500, (6,), generator=g).tolist()),
                   tuple(torch.randint(5, 500, (4,), generator=g).tolist()), (-1.0) ** i) for i in range(8)]
    with torch.no_grad():
        lp, _ = score_actions(model, collate(raw, tok.pad_token_id))  # on-policy sampler log-probs
    items, k = [], 0
    for it in raw:
        items.append(SAWItem(it.prompt_ids, it.completion_ids, it.weight, tuple(lp[k:k + 4].tolist()), (0,) * 4))
        k += 4
    pub = RecordingPublisher()
    cfg = TrainerConfig(lr=0.2, ppo_epochs=3, num_minibatches=2, lr_schedule="linear", total_steps=10)
    trainer = Trainer(model, make_algorithm("grpo"), FixedSource(items), cfg, publisher=pub,
                      pad_token_id=tok.pad_token_id)
    m = asyncio.run(trainer.train_step())
    steps = {int(s["step"]) for s in trainer.optimizer.state_dict()["state"].values()}
    assert steps == {6}  # 3 epochs x 2 minibatches
    assert trainer.step == 1 and trainer.policy_version == 1 and pub.versions == [0, 1]  # start, then once
    assert trainer.scheduler.last_epoch == 1
    assert m["clip_frac/epoch_2"] > m["clip_frac/epoch_0"] and m["clip_frac/epoch_2"] > 0.0
    assert m["ratio_max/epoch_2"] > 1.2


class ServerPublisher:
    """Records pushes like a remote server would see them (version numbers, force flags)."""

    def __init__(self, server_version):
        self.version, self.pushes = server_version, []

    def server_version(self):
        return self.version

    def publish(self, model, version, *, force=False):
        if version <= self.version and not force:
            raise RuntimeError(f"server rejects version {version} <= {self.version}")
        self.pushes.append((version, force))
        self.version = version
        return {}


class WatchingSource(FixedSource):
    def __init__(self, items, publisher):
        super().__init__(items)
        self.publisher, self.seen = publisher, []

    async def next_batch(self):
        self.seen.append(list(self.publisher.pushes))
        return await super().next_batch()


@pytest.mark.parametrize("server_version,reset,expect", [
    (0, False, [(1, False), (2, False)]),   # a fresh server: the starting weights become version 1
    (7, False, [(8, False), (9, False)]),   # a reused server ahead of us: adopt its version, never crash
    (7, True, [(0, True), (1, False)]),     # an explicit reset forces the server back to our version
])
def test_starting_weights_are_published_before_the_first_rollout(tiny_model_dir, server_version, reset, expect):
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32")
    pub = ServerPublisher(server_version)
    source = WatchingSource(_sft_items(2), pub)
    trainer = Trainer(model, make_sft(), source, TrainerConfig(reset_server_version=reset), publisher=pub,
                      pad_token_id=tok.pad_token_id)
    asyncio.run(trainer.train(1))
    assert source.seen[0] == expect[:1]  # the first batch was sampled after the starting weights were pushed
    assert pub.pushes == expect and trainer.policy_version == expect[-1][0]


def test_non_finite_steps_are_skipped_counted_and_stop_the_run(tiny_model_dir):
    """A NaN advantage makes the loss and gradients NaN: the optimizer step is skipped (the weights and
    AdamW state stay as they were), the step is counted, and ``max_nonfinite_steps`` of them in a row
    stop the run with an error naming the likely causes. A finite step in between resets the count."""
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    good = _sft_items(4)
    bad = [SAWItem(it.prompt_ids, it.completion_ids, float("nan")) for it in good]
    trainer = Trainer(model, make_sft(), FixedSource(bad), TrainerConfig(lr=1e-2, max_nonfinite_steps=2),
                      pad_token_id=tok.pad_token_id)
    start = _lora_params(model)
    m = asyncio.run(trainer.train_step())
    assert m["nonfinite_skipped"] == 1 and m["nonfinite_streak"] == 1 and m["nonfinite_total"] == 1
    assert all(torch.equal(p, start[n]) for n, p in _lora_params(model).items()), "a NaN step changed weights"
    assert all(torch.isfinite(p).all() for p in _lora_params(model).values())
    trainer.source = FixedSource(good)
    m = asyncio.run(trainer.train_step())
    assert m.get("nonfinite_skipped", 0) == 0 and m["nonfinite_streak"] == 0 and m["nonfinite_total"] == 1
    trainer.source = FixedSource(bad)
    asyncio.run(trainer.train_step())
    with pytest.raises(RuntimeError, match=r"2 optimizer steps in a row had a non-finite loss or gradient norm"):
        asyncio.run(trainer.train_step())


def test_no_silent_non_learning(tiny_model_dir, tmp_path):
    """GRPO on an env whose reward never varies (a format the model never writes): every step logs
    the share of zero-variance groups and of zero-advantage tokens, and ``max_no_signal_steps`` such
    steps in a row stop the run with an error that names the likely causes and the format cold start.
    A varying reward logs shares below 1 and does not stop."""
    _, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path / "never", TrainerConfig(lr=1e-3, max_no_signal_steps=3),
                                       env="test_never_rewarded")
    history = []
    with pytest.raises(RuntimeError, match=r"(?s)3 steps in a row.*zero variance.*never produces.*format cold start"):
        asyncio.run(trainer.train(10, lambda step, m: history.append(m)))
    assert len(history) == 2 and trainer.step == 3
    for m in history:
        assert m["zero_var_group_share"] == 1.0 and m["zero_adv_token_share"] == 1.0 and m["no_signal_streak"] >= 1

    _, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path / "vowels", TrainerConfig(lr=1e-3, max_no_signal_steps=1))
    history = []
    asyncio.run(trainer.train(2, lambda step, m: history.append(m)))
    assert all(m["zero_adv_token_share"] < 1.0 and m["no_signal_streak"] == 0 for m in history)
    assert all(0.0 <= m["zero_var_group_share"] < 1.0 for m in history)


def test_keep_best_ends_on_the_best_evaluated_weights(tiny_model_dir, tmp_path):
    """``eval_every`` + ``keep_best``: the evaluator runs on the start (0.1) and after steps 1, 2, 3 (0.5,
    0.9, 0.2); the run ends on step 2's weights, says so in ``trainer.best`` beside the last step's score,
    and logs ``eval/*`` with the step metrics."""
    scores = iter([0.1, 0.5, 0.9, 0.2])

    async def evaluator():
        return {"success_rate": next(scores), "episodes": 8}

    model, engine, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    trainer.evaluator, trainer.eval_every, trainer.keep_best = evaluator, 1, "success_rate"
    seen, history = {}, []

    def on_step(step, m):
        history.append(m)
        seen[step] = _lora_params(model)

    asyncio.run(trainer.train(3, on_step))
    assert [m["eval/success_rate"] for m in history] == [0.5, 0.9, 0.2]
    assert trainer.best["step"] == 2 and trainer.best["value"] == 0.9
    assert trainer.best["last_step"] == 3 and trainer.best["last_eval"]["success_rate"] == 0.2
    now = _lora_params(model)
    assert all(torch.equal(now[n], seen[2][n]) for n in now) and not all(torch.equal(now[n], seen[3][n]) for n in now)
    assert engine.policy_version == trainer.policy_version == 4  # the restored weights were published
    scores = iter([0.5, 0.2, 0.9])  # "-metric": lower is better (an exploitability)
    trainer.keep_best, trainer.best = "-nash_conv", {}

    async def nash():
        return {"nash_conv": next(scores)}

    trainer.evaluator, seen = nash, {}
    asyncio.run(trainer.train(6, on_step))
    assert trainer.best["step"] == 5 and trainer.best["metric"] == "nash_conv" and trainer.best["value"] == 0.2
    now = _lora_params(model)
    assert all(torch.equal(now[n], seen[5][n]) for n in now)
    scores = iter([0.25, 0.5, 0.5])  # a tie goes to the later step: as good on validation, and trained longer
    trainer.keep_best, trainer.best, trainer.evaluator = "success_rate", {}, evaluator
    asyncio.run(trainer.train(9, on_step))
    assert trainer.best["step"] == 9 and trainer.best["value"] == 0.5
    with pytest.raises(ValueError, match="keep_best='success_rate' needs an evaluator"):
        asyncio.run(Trainer(model, make_sft(), FixedSource([]), keep_best="success_rate",
                            tokenizer=trainer.tokenizer).train(1))


def test_keep_best_counts_the_start_so_rl_that_only_makes_it_worse_ends_on_it(tiny_model_dir, tmp_path):
    """Was: only ``ludic train env`` and ``train qa`` evaluated the start (each in its own code) and ``train
    games`` did not, so its keep-best could not keep a start that RL only made worse. Now ``train`` evaluates
    the start of a fresh run under ``keep_best``: here it scores best and the run ends on its weights."""
    scores = iter([0.9, 0.5, 0.2])

    async def evaluator():
        return {"success_rate": next(scores)}

    model, engine, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    trainer.evaluator, trainer.eval_every, trainer.keep_best = evaluator, 1, "success_rate"
    start = _lora_params(model)
    asyncio.run(trainer.train(2))
    assert trainer.best["step"] == 0 and trainer.best["value"] == 0.9 and trainer.best["last_step"] == 2
    now = _lora_params(model)
    assert all(torch.equal(now[n], start[n]) for n in now)


def test_a_resumed_run_keeps_the_best_it_evaluated_before_the_crash(tiny_model_dir, tmp_path):
    """Was: ``trainer.best`` and the best weights lived in memory only, so after a crash and ``resume`` the
    run ended on the best of the evaluations after the resume (here step 3's 0.2), not step 2's 0.9."""
    def make(scores):
        model, engine, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2, checkpoint_every=1))
        it = iter(scores)

        async def evaluator():
            return {"success_rate": next(it)}

        trainer.evaluator, trainer.eval_every, trainer.keep_best = evaluator, 1, "success_rate"
        return model, trainer

    model, trainer = make([0.1, 0.5, 0.9])  # the start, steps 1 and 2
    seen = {}
    asyncio.run(trainer.train(2, lambda step, m: seen.__setitem__(step, _lora_params(model))))  # "crashes" after 2
    model, resumed = make([0.2])
    resumed.keep_best = ""  # a recipe may set keep_best after resume() (ludic train games does)
    assert resumed.resume() and resumed.step == 2
    resumed.keep_best = "success_rate"
    assert resumed.best["step"] == 2 and resumed.best["value"] == 0.9
    asyncio.run(resumed.train(3))
    assert resumed.best["step"] == 2 and resumed.best["last_step"] == 3
    now = _lora_params(model)
    assert all(torch.equal(now[n], seen[2][n]) for n in now)


def test_the_padding_id_comes_from_the_tokenizer_by_default(tiny_model_dir):
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    want = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    assert Trainer(model, make_sft(), FixedSource([]), tokenizer=tok).pad_token_id == want
    assert Trainer(model, make_sft(), FixedSource([]), pad_token_id=7).pad_token_id == 7

    class Bare(torch.nn.Module):  # no tokenizer, no config: nothing to take the id from
        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

    with pytest.raises(ValueError, match="no padding id"):
        Trainer(Bare(), make_sft(), FixedSource([]))
