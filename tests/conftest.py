"""Shared fixtures: the packaged tokenizer, a tiny random model, a scripted client for contract tests."""

from __future__ import annotations

import importlib
import os
import shutil
from typing import Any

import pytest
import torch

from ludic.envs.base import SingleAgentEnv
from ludic.envs.registry import register_env
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.tokenization import render_ids
from ludic.inference.models import cache_dir, make_tiny_model, packaged_model_dir
from ludic.types import FinishReason, StepOutcome, TokenTrace

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


def require(module: str, why: str = "") -> Any:
    """Import ``module`` for a test (module level or inside one). Missing, it skips the test on a
    developer's machine and fails it under CI (``$CI`` set), whose set-up must have installed it: a
    skip there would hide a gap (``pytest.importorskip`` skips everywhere)."""
    try:
        return importlib.import_module(module)
    except ImportError as e:
        msg = f"{module} is not installed{' (' + why + ')' if why else ''}: {e}"
        if os.environ.get("CI"):
            pytest.fail(msg + "; CI's set-up (scripts/setup.sh) must install it", pytrace=False)
        pytest.skip(msg, allow_module_level=True)


def python_nash_conv(game: Any, table: dict) -> float:
    """NashConv of a Ludic policy table (info state -> [(action, prob)]) by OpenSpiel's Python
    implementation (best responses by tree walk): an independent check of ``eval.games.nash_conv``,
    which calls the C++ one."""
    from open_spiel.python import policy as os_policy
    from open_spiel.python.algorithms import exploitability

    pol = os_policy.TabularPolicy(game)
    for key, dist in table.items():
        probs = pol.policy_for_key(key)
        probs[:] = 0.0
        for a, p in dist:
            probs[int(a)] = p
    return float(exploitability.nash_conv(game, pol))


class VowelEnv(SingleAgentEnv):
    """One-step env whose reward varies across a random model's samples: share of vowels."""

    def env_reset(self, seed=None):
        return "Say something.", {}

    def env_step(self, action):
        return StepOutcome("done", sum(c in "aeiou" for c in action) / max(len(action), 1), terminated=True)


register_env("test_vowels", VowelEnv)


class NeverRewardedEnv(SingleAgentEnv):
    """One-step env that asks for a tag the model never writes: every answer scores 0, so every
    GRPO group has zero variance (the silent non-learning a newcomer met)."""

    def env_reset(self, seed=None):
        return "Answer inside <guess></guess>.", {}

    def env_step(self, action):
        return StepOutcome("done", 1.0 if "<guess>" in action else 0.0, terminated=True)


register_env("test_never_rewarded", NeverRewardedEnv)


class AlwaysRightEnv(SingleAgentEnv):
    """Every reply succeeds: every GRPO group has zero variance because the task is too easy (a saturated task)."""

    def env_reset(self, seed=None):
        return "Say anything.", {}

    def env_step(self, action):
        return StepOutcome("done", 1.0, terminated=True, info={"success": True})


register_env("test_always_right", AlwaysRightEnv)


@pytest.fixture(scope="session")
def packaged_dir():
    return packaged_model_dir()


@pytest.fixture(scope="session")
def tokenizer(packaged_dir):
    from ludic.inference.models import load_tokenizer

    return load_tokenizer(str(packaged_dir))


@pytest.fixture(scope="session")
def tiny_model_dir(packaged_dir):
    return make_tiny_model(cache_dir() / "models" / "tiny-random-llama")


class ScriptedClient:
    """Test double for contract tests: replies with scripted texts, tokenised for real.

    Not a stand-in for the model (end-to-end tests use a real tiny model);
    it makes protocol and agent behaviour deterministic and hand-checkable.
    """

    def __init__(self, replies, tokenizer=None, finish=FinishReason.STOP, fail_at=()):
        self.replies = list(replies)
        self._tokenizer = tokenizer
        self.finish = finish
        self.fail_at = set(fail_at)
        self.requests: list[ChatRequest] = []
        self.policy_version = 0

    @property
    def tokenizer(self):
        return self._tokenizer

    async def complete(self, request: ChatRequest) -> ChatResponse:
        i = len(self.requests)
        self.requests.append(request)
        if i in self.fail_at:
            return ChatResponse.failed("scripted failure")
        text = self.replies[i % len(self.replies)]
        if self._tokenizer is not None:
            prompt = request.prompt_ids or tuple(render_ids(self._tokenizer, request.messages))
            ids = self._tokenizer(text, add_special_tokens=False)["input_ids"]
            if self.finish == FinishReason.STOP:
                ids = ids + [self._tokenizer.eos_token_id]
        else:
            prompt, ids = (1, 2, 3), [10 + k for k in range(len(text.split()) or 1)]
        trace = TokenTrace(tuple(prompt), tuple(ids), tuple([-0.5] * len(ids)),
                           tuple([self.policy_version] * len(ids)), self.finish)
        return ChatResponse(text=text, trace=trace)


@pytest.fixture
def scripted():
    return ScriptedClient


def vowel_grpo_items(model_dir, *, max_tokens: int, device: str = "cpu") -> list:
    """GRPO SAW items from real rollouts of the model at ``model_dir`` on ``test_vowels``: 3 groups of 4
    episodes (strategy seed 3), fp32, sampled on ``device`` (the CPU by default, so every consumer, a
    GPU test included, gets the same items)."""
    import asyncio

    from ludic.agents.agent import Agent
    from ludic.context import FullDialog
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts.batch import build_saw_items
    from ludic.rollouts.credit import GroupNormalizedReturn
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.lora import load_policy
    from ludic.types import EnvSpec, RolloutRequest

    model, tok = load_policy(str(model_dir), dtype="float32", device=device, seed=0)
    engine = TransformersEngine(model, tok)

    def factory():
        return SingleAgentProtocol(Agent(engine, FullDialog("Talk."), reject_incomplete=False,
                                         sampling=SamplingParams(temperature=1.0, max_tokens=max_tokens)))

    reqs = GRPORequestStrategy(4, seed=3).expand([RolloutRequest(EnvSpec("test_vowels"), max_steps=1)] * 3)
    rollouts = asyncio.run(RolloutEngine({"single_agent": factory}).generate_rollouts(reqs))
    return build_saw_items(rollouts, GroupNormalizedReturn())


def vowel_grpo_trainer(model_dir, run_dir, trainer_cfg, *, max_tokens=8, strategy_seed=0, env="test_vowels",
                       sample_filter=None):
    """(model, engine, trainer): GRPO + LoRA r4 on the tiny model, 2 groups of 4 VowelEnv episodes per step,
    sampled by the in-process engine, rollouts logged to run_dir/rollouts.jsonl, checkpoints in run_dir/ckpt;
    ``env``: one registered name for both groups, or a name per group; ``sample_filter`` goes to the batch
    source."""
    from ludic.agents.agent import Agent
    from ludic.context import FullDialog
    from ludic.inference.client import SamplingParams
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction import SingleAgentProtocol
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import GRPORequestStrategy, RolloutEngine
    from ludic.training.algorithms import make_algorithm
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer
    from ludic.types import EnvSpec, RolloutRequest

    model, tok = load_policy(str(model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    engine = TransformersEngine(model, tok, batch_wait_s=0.05)

    def factory():
        agent = Agent(engine, FullDialog("Talk."), sampling=SamplingParams(temperature=1.0, max_tokens=max_tokens),
                      reject_incomplete=False)
        return SingleAgentProtocol(agent)

    algo = make_algorithm("grpo")
    source = RolloutBatchSource(
        RolloutEngine({"single_agent": factory}, concurrency=16, jsonl_path=run_dir / "rollouts.jsonl"),
        lambda: [RolloutRequest(EnvSpec(name), max_steps=1) for name in ([env] * 2 if isinstance(env, str) else env)],
        algo.credit,
        strategy=GRPORequestStrategy(4, seed=strategy_seed), sample_filter=sample_filter,
    )
    trainer = Trainer(model, algo, source, trainer_cfg, publisher=InProcessPublisher(engine),
                      checkpoint_dir=run_dir / "ckpt", tokenizer=tok, pad_token_id=tok.pad_token_id)
    return model, engine, trainer


@pytest.fixture
def redis_server(tmp_path):
    """A real redis-server process (AOF on, appendfsync always) in the test's tmp dir."""
    from ludic.pipeline.redis_server import RedisServer

    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: scripts/setup.sh must install it in CI")
        pytest.skip("redis-server is not installed (make setup installs it with apt-get)")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


@pytest.fixture
def streams(redis_server):
    from ludic.pipeline.streams import PipelineStreams

    return PipelineStreams(redis_server.url, prefix="t")


def tiny_family_model(family: str, tok, dtype=None):
    """A tiny random model of a Llama-family ``family`` other than Llama (Qwen2: q/k/v biases; Qwen3:
    per-head q/k norms; Mistral: a sliding window), in eval mode."""
    import torch
    import transformers

    cfg_cls, model_cls = {
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "qwen3": (transformers.Qwen3Config, transformers.Qwen3ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }[family]
    torch.manual_seed(3)
    cfg = cfg_cls(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                  num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
                  tie_word_embeddings=True, pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id)
    return model_cls(cfg).to(dtype or torch.float32).eval()
