"""Two GRPO steps against a real vLLM CPU server started by the recipe (issue: --inference vllm)."""

import json

import pytest
from conftest import require

pytestmark = pytest.mark.integration
require("vllm")

from ludic.tictactoe.train import EvalTicTacToeConfig, TrainTicTacToeConfig, evaluate, train  # noqa: E402


def test_grpo_steps_on_vllm_server_publish_adapters(tmp_path):
    run = tmp_path / "run"
    m = train(TrainTicTacToeConfig(
        inference="vllm", run_dir=str(run), train_steps=2, group_size=4, rollouts_per_update=8,
        max_completion_tokens=24, logger="none", lora_rank=8, concurrency=8,
    ))
    lines = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2]
    # the starting adapter is version 1 (a fresh server is at 0), then one version per step
    assert lines[-1]["policy_version"] == 3 and m["num_rollouts"] == 8
    assert (run / "adapters").exists() and any((run / "adapters").iterdir())
    rollouts = [json.loads(x) for x in (run / "rollouts.jsonl").read_text().splitlines()]
    versions = [{v for s in r["steps"] for v in (s["trace"] or {}).get("policy_versions", [])} for r in rollouts]
    assert versions[:8] == [{1}] * 8 and versions[8:] == [{2}] * 8  # step 2 was sampled by step 1's adapter
    assert (run / "vllm_server.log").exists()


def test_a_reused_server_ahead_of_the_trainer_is_adopted(tmp_path):
    """Two runs against one running server: the second trainer starts at version 0, the server is at 2;
    it adopts the server's version instead of crashing on its first push."""
    import httpx

    from ludic.inference.models import packaged_model_dir
    from ludic.inference.vllm_launcher import VLLMServerProcess

    server = VLLMServerProcess(str(packaged_model_dir()), log_path=tmp_path / "server.log", allowed_dirs=[tmp_path],
                               extra_args=["--enable-lora", "--max-lora-rank", "8"]).start()
    try:
        common = dict(inference="vllm", port=server.port, train_steps=1, group_size=2, rollouts_per_update=2,
                      max_completion_tokens=8, logger="none", lora_rank=8, concurrency=2, final_save=False)
        first = train(TrainTicTacToeConfig(run_dir=str(tmp_path / "a"), **common))
        assert first["policy_version"] == 2
        second = train(TrainTicTacToeConfig(run_dir=str(tmp_path / "b"), **common))
        assert second["policy_version"] == 4  # adopted 2, started at 3, one step
        assert httpx.get(f"{server.url}/ludic/policy", timeout=10).json()["version"] == 4
    finally:
        server.stop()


def test_eval_with_started_server(tmp_path):
    out = tmp_path / "eval.jsonl"
    metrics = evaluate(EvalTicTacToeConfig(inference="vllm", start_server=True, episodes=4, max_tokens=16,
                                           out=str(out), opponent="random"))
    assert metrics["parse_error_rate"] + metrics["win_rate"] + metrics["loss_rate"] + metrics["draw_rate"] \
        + metrics["illegal_rate"] + metrics["truncated_rate"] == pytest.approx(1.0)
    assert len(out.read_text().splitlines()) >= 4


def test_eval_of_an_adapter_served_by_name(tmp_path):
    """The seed's route: a server started with --lora-modules ttt_rl=<dir>, then eval --model ttt_rl."""
    import httpx
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from ludic.inference.models import packaged_model_dir
    from ludic.inference.vllm_launcher import VLLMServerProcess

    base = packaged_model_dir()
    pm = get_peft_model(AutoModelForCausalLM.from_pretrained(str(base), dtype=torch.float32),
                        LoraConfig(r=8, lora_alpha=16, target_modules=["q_proj", "v_proj"]))
    adapter = tmp_path / "ttt_rl"
    pm.save_pretrained(adapter)
    server = VLLMServerProcess(str(base), port=0, log_path=tmp_path / "server.log",
                               extra_args=["--enable-lora", "--max-lora-rank", "16",
                                           "--lora-modules", f"ttt_rl={adapter}"]).start()
    try:
        served = [m["id"] for m in httpx.get(f"{server.url}/v1/models", timeout=30).json()["data"]]
        assert "ttt_rl" in served
        out = tmp_path / "eval.jsonl"
        metrics = evaluate(EvalTicTacToeConfig(inference="vllm", model="ttt_rl", port=server.port, episodes=4,
                                               max_tokens=16, out=str(out), opponent="minimax"))
        assert sum(metrics[k] for k in ("parse_error_rate", "win_rate", "loss_rate", "draw_rate", "illegal_rate",
                                        "truncated_rate")) == pytest.approx(1.0)
        assert len(out.read_text().splitlines()) >= 4
    finally:
        server.stop()


def test_adapter_run_on_vllm_samples_from_the_sft_policy(tmp_path):
    """--inference vllm --adapter <sft>: the server serves base + merged SFT adapter, the trainer's fresh LoRA
    is pushed on top before the first rollout, and the first rollouts' log-probs are the SFT policy's."""
    import torch

    from ludic.inference.models import packaged_model_dir
    from ludic.rollouts.engine import read_rollouts
    from ludic.training.microbatch import collate
    from ludic.training.scoring import score_actions
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.types import SAWItem

    base = str(packaged_model_dir())
    sft, tok = load_policy(base, lora=LoraSettings(rank=8, alpha=16), dtype="float32", seed=1)
    with torch.no_grad():
        for n, p in sft.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.01)  # an "SFT" adapter that visibly moves the policy
    sft.save_pretrained(tmp_path / "sft_adapter")
    run = tmp_path / "run"
    train(TrainTicTacToeConfig(
        inference="vllm", adapter=str(tmp_path / "sft_adapter"), run_dir=str(run), train_steps=1, group_size=4,
        rollouts_per_update=4, max_completion_tokens=12, logger="none", lora_rank=8, concurrency=4,
        dtype="float32", final_save=False,
    ))
    steps = [s for r in read_rollouts(run / "rollouts.jsonl") for s in r.steps if s.trace and s.trace.completion_ids]
    assert steps and {v for s in steps for v in s.trace.policy_versions} == {1}  # the pushed starting weights
    items = [SAWItem(s.trace.prompt_ids, s.trace.completion_ids, 1.0, s.trace.logprobs) for s in steps]
    mb = collate(items, tok.pad_token_id)

    def scores(adapter):
        model, _ = load_policy(base, adapter=adapter, dtype="float32")
        with torch.no_grad():
            return score_actions(model, mb)[0]

    from_sft = (scores(str(tmp_path / "sft_adapter")) - mb.old_logp).abs().mean()
    from_base = (scores(None) - mb.old_logp).abs().mean()
    assert from_sft < 0.05 and from_base > 3 * from_sft, (float(from_sft), float(from_base))
