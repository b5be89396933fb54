"""Sampling through the Tinker service (``pip install tinker``): a ``ChatClient`` over a
``tinker.SamplingClient``.

Ludic keeps everything but the weights: envs, agents, protocols and credit run here; the service
samples from and trains a LoRA on its side (``ludic.training.tinker.TinkerLearner``). The prompt is
tokenised locally with the base model's tokenizer (token-in), the service returns the sampled ids and
their log-probs (token-out), so the trace trained on is exactly what was sampled.

    client = TinkerChatClient(tokenizer)
    client.set_sampler(training_client.save_weights_and_get_sampling_client(name="v1"), version=1)
    reply = await client.complete(ChatRequest(messages, SamplingParams(max_tokens=32)))

``TINKER_API_KEY`` authenticates with the hosted service; ``--base-url`` points at another endpoint
(``ludic.inference.tinker_standin`` is a local stand-in for offline runs and tests).
"""

from __future__ import annotations

import time
from typing import Any

from ludic.inference.client import ChatRequest, ChatResponse, SamplingParams
from ludic.types import FinishReason, TokenTrace


def tinker_sampling_params(sampling: SamplingParams, stop_ids: list[int]) -> Any:
    """Ludic's sampling settings in the SDK's type. Stop strings are sent as strings (the service cuts
    after them); without any, the tokenizer's end-of-turn ids stop the reply."""
    from tinker import types

    stop: Any = list(sampling.stop) if sampling.stop else list(stop_ids)
    return types.SamplingParams(max_tokens=sampling.max_tokens, temperature=sampling.temperature,
                                top_p=sampling.top_p, top_k=sampling.top_k or -1, seed=sampling.seed, stop=stop)


def end_of_turn_ids(tokenizer: Any) -> list[int]:
    """The ids that end a reply: eos and, for chat templates with one, the end-of-turn token."""
    ids = {tokenizer.eos_token_id} if tokenizer.eos_token_id is not None else set()
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id and tid >= 0:
            ids.add(tid)
    return sorted(ids)


class TinkerChatClient:
    """A ``ChatClient`` sampling from the current Tinker sampler (one reply per request).

    Args:
        tokenizer: the base model's tokenizer (local; the chat template is applied here).
        sampler: a ``tinker.SamplingClient``; ``set_sampler`` replaces it after each training step.
        version: the policy version of ``sampler`` (recorded per sampled token).
    """

    def __init__(self, tokenizer: Any, sampler: Any = None, version: int = 0) -> None:
        self._tokenizer = tokenizer
        self.sampler = sampler
        self.version = version
        self.stop_ids = end_of_turn_ids(tokenizer)

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def set_sampler(self, sampler: Any, version: int) -> None:
        self.sampler, self.version = sampler, version

    def prompt_ids(self, request: ChatRequest) -> list[int]:
        from ludic.tokenization import render_ids

        return list(request.prompt_ids) if request.prompt_ids is not None else render_ids(self._tokenizer, request.messages)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        from tinker import types

        if self.sampler is None:
            return ChatResponse.failed("TinkerChatClient has no sampler yet: call set_sampler first")
        prompt = self.prompt_ids(request)
        s = request.sampling
        t0 = time.perf_counter()
        version = self.version
        try:
            res = await self.sampler.sample(prompt=types.ModelInput.from_ints(prompt), num_samples=1,
                                            sampling_params=tinker_sampling_params(s, self.stop_ids))
        except Exception as e:  # a failed call is a failed step, not a dead run
            return ChatResponse.failed(f"tinker sample failed: {type(e).__name__}: {e}", tuple(prompt))
        seq = res.sequences[0]
        tokens = [int(t) for t in seq.tokens]
        logprobs = [float(x) for x in (seq.logprobs if seq.logprobs is not None else [0.0] * len(tokens))]
        reason = FinishReason.LENGTH if seq.stop_reason == "length" else FinishReason.STOP
        trace = TokenTrace(prompt_ids=tuple(prompt), completion_ids=tuple(tokens), logprobs=tuple(logprobs),
                           policy_versions=(version,) * len(tokens), finish_reason=reason,
                           temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)
        text = self._tokenizer.decode(tokens, skip_special_tokens=True)
        return ChatResponse(text=text, trace=trace, info={"latency_s": time.perf_counter() - t0, "backend": "tinker"})
