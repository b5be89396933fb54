"""The Tinker backend: SAW items become the SDK's datums exactly, and the official SDK trains and samples
through Ludic's local stand-in server (named as such: the hosted service is unreachable here)."""

import asyncio
import json
import os
import socket
import threading
import time

import pytest
from conftest import require

tinker = require("tinker")

from ludic.training.tinker import saw_to_datum  # noqa: E402
from ludic.types import SAWItem  # noqa: E402


def test_a_multi_turn_item_trains_only_its_sampled_tokens():
    # prompt 3 tokens; completion: 2 sampled, 2 env/template (mask 0), 1 sampled from a later turn
    item = SAWItem(prompt_ids=(1, 2, 3), completion_ids=(10, 11, 50, 51, 12), weight=0.5,
                   logprobs=(-0.1, -0.2, 0.0, 0.0, -0.3), policy_versions=(1, 1, -1, -1, 1),
                   action_mask=(1, 1, 0, 0, 1), token_weights=(2.0, 2.0, 0.0, 0.0, -1.0))
    d = saw_to_datum(item, scale=0.5)
    assert d.model_input.to_ints() == [1, 2, 3, 10, 11, 50, 51]
    ins = {k: v.tolist() for k, v in d.loss_fn_inputs.items()}
    assert ins["target_tokens"] == [2, 3, 10, 11, 50, 51, 12]
    assert ins["advantages"] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0, -0.5]  # each turn's credit x scale, 0 off-policy
    assert ins["logprobs"] == pytest.approx([0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3])
    ce = saw_to_datum(item, scale=0.25, loss_fn="cross_entropy").loss_fn_inputs
    assert set(ce) == {"target_tokens", "weights"} and ce["weights"].tolist() == [0, 0, 0.25, 0.25, 0, 0, 0.25]
    with pytest.raises(ValueError, match="no completion"):
        saw_to_datum(SAWItem(prompt_ids=(1, 2), completion_ids=(), weight=1.0))


@pytest.fixture(scope="module")
def standin(tiny_model_dir):
    """The stand-in server in a thread of this process (uvicorn on a free port)."""
    import uvicorn

    from ludic.inference.tinker_standin import StandInState, make_app

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(make_app(StandInState(str(tiny_model_dir))), port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    os.environ.setdefault("TINKER_API_KEY", "tml-test")
    yield f"http://127.0.0.1:{port}", str(tiny_model_dir)
    server.should_exit = True
    thread.join(timeout=10)


def test_sdk_round_trip_through_the_standin(standin):
    """Sample, score the same tokens with forward, train on a positive advantage: their log-prob rises,
    and the new sampler (a fresh snapshot) samples from the trained weights."""
    from tinker import types

    url, model = standin

    async def run():
        service = tinker.ServiceClient(base_url=url)
        training = await service.create_lora_training_client(base_model=model, rank=4, seed=0)
        sampler = await training.save_weights_and_get_sampling_client(name="v1")
        prompt = [1, 20, 30, 40]
        res = await sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=2,
                                   sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=3))
        assert len(res.sequences) == 2 and all(s.stop_reason == "length" for s in res.sequences)
        seq = res.sequences[0]
        item = SAWItem(prompt_ids=tuple(prompt), completion_ids=tuple(seq.tokens), weight=1.0, logprobs=tuple(seq.logprobs))
        datum = saw_to_datum(item, scale=1.0)
        before = await training.forward([datum], "importance_sampling")
        lp0 = before.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1:]
        assert lp0 == pytest.approx(list(seq.logprobs), abs=1e-4)  # the service scores what the sampler drew
        fb = training.forward_backward([datum], "importance_sampling")
        opt = training.optim_step(types.AdamParams(learning_rate=5e-2))
        out, _ = await fb, await opt
        assert out.metrics["loss:sum"] == pytest.approx(-len(seq.tokens), rel=1e-3)  # ratio 1, advantage 1 per token
        after = await training.forward([datum], "importance_sampling")
        lp1 = after.loss_fn_outputs[0]["logprobs"].tolist()[len(prompt) - 1:]
        assert sum(lp1) > sum(lp0) + 0.1
        new = await training.save_weights_and_get_sampling_client(name="v2")
        again = await new.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                                 sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=3))
        # the old sampler still holds its own snapshot
        old = await sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                                   sampling_params=types.SamplingParams(max_tokens=5, temperature=1.0, seed=3))
        assert list(old.sequences[0].tokens) == list(seq.tokens) and list(old.sequences[0].logprobs) == pytest.approx(list(seq.logprobs), abs=1e-5)
        return again

    asyncio.run(run())


def test_tictactoe_grpo_on_the_tinker_backend(standin, tmp_path):
    from ludic.tictactoe.tinker import TinkerTicTacToeConfig, train_tinker

    url, model = standin
    run = tmp_path / "run"
    out = train_tinker(TinkerTicTacToeConfig(base_url=url, base_model=model, train_steps=2, group_size=2,
                                             rollouts_per_update=4, max_completion_tokens=6, eval_episodes=2,
                                             run_dir=str(run), logger="none"))
    assert out["policy_version"] == 3 and set(out) >= {"before", "after"}
    metrics = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [m["step"] for m in metrics] == [1, 2] and all(m["sampler_logprob_gap"] < 1e-3 for m in metrics)
    rollouts = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    versions = [{v for s in r["steps"] for v in (s["trace"] or {}).get("policy_versions", [])} for r in rollouts]
    assert versions[:4] == [{1}] * 4 and versions[4:] == [{2}] * 4  # step 2 sampled by step 1's weights
    assert (run / "report.html").exists() and (run / "tinker_results.json").exists()


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo"])
def test_tinker_learner_refuses_truncated_sampling_for_ratio_losses(loss_fn):
    """As the Trainer does: a top-p / top-k sample's log-probs are those of a renormalised distribution,
    so an importance ratio over them is wrong. Refused before anything reaches the service."""
    import asyncio

    from ludic.training.tinker import TinkerLearner
    from ludic.types import SAWItem

    learner = TinkerLearner(None, None, loss_fn=loss_fn)
    for top in ({"top_p": 0.9}, {"top_k": 20}):
        item = SAWItem((1, 2), (3, 4), 1.0, logprobs=(-0.5, -0.5), **top)
        with pytest.raises(ValueError, match="truncated, renormalised distribution"):
            asyncio.run(learner.step([item]))


@pytest.mark.parametrize("loss_fn", ["importance_sampling", "ppo"])
def test_tinker_learner_refuses_unknown_sampler_logprobs_for_ratio_losses(loss_fn):
    """Found in review: an item whose sampler log-probs are unknown (NaN: an exploring reply the policy did not
    sample, UniformCellClient / FunctionClient(logprob=nan); None: no log-probs at all) went to the service as
    NaN (a NaN loss for the whole batch) or as 0.0 (a ratio of p instead of 1). The local Trainer scores a NaN
    with a ratio of 1, which one Tinker call cannot: it needs the new log-prob first. Refused, named."""
    import asyncio
    import math

    from ludic.training.tinker import TinkerLearner
    from ludic.types import SAWItem

    learner = TinkerLearner(None, None, loss_fn=loss_fn)
    for lp in ((-0.5, math.nan), None):
        item = SAWItem((1, 2), (3, 4), 1.0, logprobs=lp, meta={"rollout_id": "r7"})
        with pytest.raises(ValueError, match="item r7 .*unknown sampler log-prob"):
            asyncio.run(learner.step([item]))
    ok = SAWItem((1, 2), (3, 4), 1.0, logprobs=(-0.5, math.nan), action_mask=(1, 0))  # unknown where not trained
    from ludic.training.tinker import refuse_unknown_logprobs
    refuse_unknown_logprobs([ok], loss_fn)
