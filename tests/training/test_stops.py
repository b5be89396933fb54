"""A run that stops keeps what it has: the trainer's stops (no signal, a saturated task, non-finite steps,
empty batches, any exception) end on the best weights with the reason recorded, "too easy" is not an error,
and keep-best remembers every best a resume could need (issue 37, items 1, 3 and 4)."""

import asyncio

import pytest
import torch
from conftest import vowel_grpo_trainer

from ludic.training.signal import TrainingStopped
from ludic.training.trainer import TrainerConfig


def _lora(model):
    return {n: p.detach().clone() for n, p in model.named_parameters() if "lora_" in n}


def _same(a, b):
    return all(torch.equal(a[n], b[n]) for n in a)


def _scored(trainer, scores):
    it = iter(scores)

    async def evaluator():
        return {"success_rate": next(it)}

    trainer.evaluator, trainer.eval_every, trainer.keep_best = evaluator, 1, "success_rate"


def test_a_saturated_task_stops_as_a_success_not_an_error(tiny_model_dir, tmp_path):
    """Was: every sample right for ``max_no_signal_steps`` steps raised the no-signal error, the run's
    results lost. Now the trainer stops, records why (``saturated``, not failed) and returns normally."""
    _, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=1e-3, max_no_signal_steps=2),
                                       env="test_always_right")
    asyncio.run(trainer.train(10))
    assert trainer.step == 2
    assert trainer.stopped["reason"] == "saturated" and not trainer.stopped["failed"]
    assert trainer.stopped["step"] == 2 and "every" in trainer.stopped["message"]


def test_a_failed_stop_ends_on_the_best_weights_before_it_raises(tiny_model_dir, tmp_path):
    """Was: the no-signal stop raised out of ``train`` before the keep-best restore, so the model kept the
    last step's weights. Now the run is measured at the step it stopped on, ends on the best evaluation's
    weights (here the start: no later step beat it), records the reason, and only then raises (a failed run
    exits non-zero)."""
    model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2, max_no_signal_steps=2),
                                           env=["test_vowels", "test_never_rewarded"])
    _scored(trainer, [0.9, 0.1, 0.2, 0.2, 0.2])
    start, seen = _lora(model), {}
    trainer.source.requests_fn = _switch(trainer.source.requests_fn, after=1)  # step 1 trains, then nothing does
    with pytest.raises(TrainingStopped, match="no learning signal") as err:
        asyncio.run(trainer.train(10, lambda step, m: seen.__setitem__(step, _lora(model))))
    assert err.value.reason == "no_signal" and err.value.failed
    assert trainer.stopped["reason"] == "no_signal" and trainer.stopped["failed"] and trainer.stopped["step"] == 3
    assert trainer.best["step"] == 0 and trainer.best["last_step"] == 3 and "learned" not in trainer.stopped
    assert _same(_lora(model), start) and not _same(_lora(model), seen[1])


def test_a_run_that_learned_then_lost_its_signal_ends_as_a_success(tiny_model_dir, tmp_path):
    """Was: a no-signal stop was a failure whatever came before it, so ``ludic train env`` exited 3 after runs
    whose kept step had beaten the start (the held-out study's products, seed 2: 12.5% -> 42.2%, then every group
    of 8 samples alike). Now a no-signal stop after keep-best kept a step better than the start ends the run on that
    step, as a success, and says so; a tie with the start is no gain (the test above: the start beat every step)."""
    model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2, max_no_signal_steps=2),
                                           env=["test_vowels", "test_never_rewarded"])
    _scored(trainer, [0.1, 0.9, 0.2, 0.2, 0.2])
    seen = {}
    trainer.source.requests_fn = _switch(trainer.source.requests_fn, after=1)  # step 1 learns, then nothing does
    asyncio.run(trainer.train(10, lambda step, m: seen.__setitem__(step, _lora(model))))  # returns: no raise
    stopped = trainer.stopped
    assert stopped["reason"] == "no_signal" and not stopped["failed"] and stopped["learned"] and stopped["step"] == 3
    assert "learned, then lost its signal" in stopped["message"] and "step 1" in stopped["message"]
    assert trainer.best["step"] == 1 and trainer.best["start"] == {"step": 0, "value": 0.1}
    assert _same(_lora(model), seen[1]) and not _same(_lora(model), seen[2])


def test_a_no_signal_stop_level_with_the_start_stays_a_failure(tiny_model_dir, tmp_path):
    """Keep-best keeps the later of two equal evaluations, so a kept step after the start can be level with it:
    no gain, so the no-signal stop stays a failure."""
    _, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2, max_no_signal_steps=2),
                                       env=["test_vowels", "test_never_rewarded"])
    _scored(trainer, [0.5, 0.5, 0.2, 0.2, 0.2])
    trainer.source.requests_fn = _switch(trainer.source.requests_fn, after=1)
    with pytest.raises(TrainingStopped, match="no learning signal"):
        asyncio.run(trainer.train(10))
    assert trainer.best["step"] == 1 and trainer.stopped["failed"]


def _switch(requests_fn, after):
    """Requests of ``requests_fn`` for ``after`` batches, then only the never-rewarded env."""
    from ludic.types import EnvSpec, RolloutRequest

    calls = {"n": 0}

    def fn():
        calls["n"] += 1
        if calls["n"] <= after:
            return [RolloutRequest(EnvSpec("test_vowels"), max_steps=1)] * 2
        return [RolloutRequest(EnvSpec("test_never_rewarded"), max_steps=1)] * 2

    return fn


def test_any_exception_in_a_step_still_ends_on_the_best_weights(tiny_model_dir, tmp_path):
    """An exception out of a step (here the batch source) records ``error`` with the message, restores the
    best weights, and propagates."""
    model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    _scored(trainer, [0.1, 0.9, 0.2])
    seen = {}
    source, calls = trainer.source, {"n": 0}

    class Breaking:
        async def next_batch(self):
            calls["n"] += 1
            if calls["n"] == 3:
                raise OSError("disk on fire")
            return await source.next_batch()

    trainer.source = Breaking()
    with pytest.raises(OSError, match="disk on fire"):
        asyncio.run(trainer.train(5, lambda step, m: seen.__setitem__(step, _lora(model))))
    assert trainer.stopped["reason"] == "error" and trainer.stopped["failed"]
    assert "disk on fire" in trainer.stopped["message"] and trainer.stopped["step"] == 2
    assert trainer.best["step"] == 1 and _same(_lora(model), seen[1])


def test_keep_best_remembers_an_earlier_best_across_a_resume(tiny_model_dir, tmp_path):
    """Was: one best file, overwritten at each new best and dropped by ``load_best`` when newer than the
    checkpoint: best at step 1, checkpoint at 2, new best at 3, crash: the resumed run knew no best at all.
    Now each best is kept while a checkpoint could resume before the next one."""
    def make(scores):
        model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2, checkpoint_every=2))
        _scored(trainer, scores)
        return model, trainer

    model, trainer = make([0.1, 0.9, 0.2, 0.95])  # the start, steps 1, 2, 3; a crash after step 3's evaluation
    seen = {}
    asyncio.run(trainer.train(3, lambda step, m: seen.__setitem__(step, _lora(model))))
    model, resumed = make([0.3, 0.3])
    assert resumed.resume() and resumed.step == 2
    assert resumed.best["step"] == 1 and resumed.best["value"] == 0.9
    asyncio.run(resumed.train(4))
    assert resumed.best["step"] == 1 and resumed.best["last_step"] == 4
    assert _same(_lora(model), seen[1])


def test_keep_best_holds_its_snapshot_off_the_training_device(tiny_model_dir, tmp_path):
    """The snapshot is a CPU copy (4 bytes a parameter of GPU memory otherwise) that shares no storage with
    the model; ``tests/gpu`` checks the same on CUDA."""
    model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    _scored(trainer, [0.5, 0.1])
    asyncio.run(trainer.train(1))
    state = trainer.keeper.state
    params = {n: p for n, p in model.named_parameters() if p.requires_grad}
    assert set(state) == set(params) and all(t.device.type == "cpu" for t in state.values())
    assert all(t.untyped_storage().data_ptr() != params[n].untyped_storage().data_ptr() for n, t in state.items())


class RecordingPublisher:
    """The in-process publisher, recording the versions it pushed."""

    def __init__(self, inner):
        self.inner, self.versions = inner, []

    def publish(self, model, version, **kw):
        self.versions.append(version)
        return self.inner.publish(model, version, **kw)


def test_the_start_is_scored_after_its_weights_are_published(tiny_model_dir, tmp_path):
    """Was: keep-best scored "the start" before ``publish_start``, so with a server (``--inference vllm``,
    ``--adapter``) step 0's score was the server's previous policy."""
    model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    pub = trainer.publisher = RecordingPublisher(trainer.publisher)
    pushed_at_eval = []

    async def evaluator():
        pushed_at_eval.append(list(pub.versions))
        return {"success_rate": 0.5}

    trainer.evaluator, trainer.eval_every, trainer.keep_best = evaluator, 1, "success_rate"
    asyncio.run(trainer.train(1))
    assert pushed_at_eval[0] == [0]  # the starting weights were on the server when the start was scored


def test_the_last_steps_checkpoint_holds_that_steps_weights_after_keep_best(tiny_model_dir, tmp_path):
    """Was: after keep-best the run's final save wrote the kept weights (here the start's) into
    ``checkpoints/step_000002``, a folder named for step 2 holding other weights (a resume then continued from
    the wrong ones). Now the last step's checkpoint is written before the kept weights come back, and the recipe's
    final save leaves it be; the kept weights are the model's (``final/``) and the best file's."""
    from ludic.training.checkpoint import latest_checkpoint

    model, _, trainer = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    _scored(trainer, [0.9, 0.1, 0.1])
    seen = {}
    start = _lora(model)
    asyncio.run(trainer.train(2, lambda step, m: seen.__setitem__(step, _lora(model))))
    trainer.save()  # what the recipes do at the end
    assert _same(_lora(model), start)  # the run ended on the start's weights
    assert latest_checkpoint(tmp_path / "ckpt").name == "step_000002"
    again, _, resumed = vowel_grpo_trainer(tiny_model_dir, tmp_path, TrainerConfig(lr=5e-2))
    assert resumed.resume() and resumed.step == 2
    assert _same(_lora(again), seen[2]) and resumed.best["step"] == 0


def test_a_no_signal_stop_after_a_collapse_onto_one_answer_says_so():
    """Found on gcd 2-99 (bf16, seeds 0 and 1): validation rose from 9.4% to 31.2% because the policy answered 1 to
    every question, and the stop said "The run learned, then lost its signal". It still ends on the kept step, not as
    a failure, but the message now names the one answer and the share of episodes that gave it."""
    from ludic.training.signal import learned_before_no_signal

    stopped = {"reason": "no_signal", "failed": True, "step": 84, "message": "10 steps in a row had no learning signal"}
    best = {"step": 84, "metric": "success_rate", "value": 0.3125, "start": {"step": 0, "value": 0.09375},
            "eval": {"success_rate": 0.3125, "top_answer": "1", "top_answer_share": 1.0, "distinct_answers": 1}}
    out = learned_before_no_signal(stopped, best, "success_rate")
    assert not out["failed"] and out["collapsed"] and "'1'" in out["message"] and "100%" in out["message"]
    assert "then lost its signal" not in out["message"]
    spread = {**best, "eval": {**best["eval"], "top_answer_share": 0.4, "distinct_answers": 9}}
    out = learned_before_no_signal(stopped, spread, "success_rate")
    assert "learned, then lost its signal" in out["message"] and "collapsed" not in out
