"""Shared fixtures: the packaged tokenizer, a tiny random model, a scripted client for contract tests."""

from __future__ import annotations

import os

import pytest
import torch

from ludic.envs.base import SingleAgentEnv
from ludic.envs.registry import register_env
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.tokenization import render_ids
from ludic.inference.models import cache_dir, make_tiny_model, packaged_model_dir
from ludic.types import FinishReason, StepOutcome, TokenTrace

torch.set_num_threads(max(1, min(2, os.cpu_count() or 1)))


class VowelEnv(SingleAgentEnv):
    """One-step env whose reward varies across a random model's samples: share of vowels."""

    def env_reset(self, seed=None):
        return "Say something.", {}

    def env_step(self, action):
        return StepOutcome("done", sum(c in "aeiou" for c in action) / max(len(action), 1), terminated=True)


register_env("test_vowels", VowelEnv)


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
