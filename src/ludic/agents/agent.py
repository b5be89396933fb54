"""Agent = ChatClient + ContextStrategy + Parser.

The agent owns the LLM harness: it keeps the conversation (through its
context), builds the exact prompt token ids (token-in when the context is
append-only), calls the client, and parses the completion into an action
with a format reward. It never touches the environment; the interaction
protocol does.

A failed inference call becomes a failed turn (``AgentTurn.failed_request``).
An exception from the agent's own parts is raised tagged with its stage
(``context``, ``chat_template``, ``parser``; see ``ludic.errors``), and the
protocol ends the episode as a failed rollout.
"""

from __future__ import annotations

import asyncio
import dataclasses
from dataclasses import dataclass, field
from typing import Any

from ludic.context import ContextStrategy, FullDialog
from ludic.errors import stage
from ludic.tokenization import encode_raw, extend_ids, render_ids
from ludic.inference.client import ChatClient, ChatRequest, ChatResponse, SamplingParams
from ludic.parsers import ParseResult, Parser, identity_parser
from ludic.types import FinishReason, Message, TokenTrace

INCOMPLETE_FEEDBACK = (
    "Your response was cut off because it exceeded the token limit. "
    "Please give a shorter response."
)


@dataclass
class AgentTurn:
    """What one ``Agent.act`` produced."""

    parse: ParseResult
    """Parsed action (None on failure) and format reward."""
    text: str
    """Raw completion text."""
    trace: TokenTrace | None
    """Exact tokens (None only when no tokenizer and the backend returned none)."""
    info: dict[str, Any] = field(default_factory=dict)
    """finish_reason, parse_error, incomplete_completion, inference_error, tool_calls, ..."""
    tool_messages: list[Message] = field(default_factory=list)
    """Tool results the agent added to its context (a tool turn: the env is not stepped)."""

    @property
    def failed_request(self) -> bool:
        return self.trace is not None and self.trace.finish_reason == FinishReason.ERROR


class Agent:
    """An LLM policy with memory and an action parser.

    Args:
        client: inference backend.
        context: history strategy (a fresh one per episode; the engine builds agents per episode).
        parser: raw text -> action.
        sampling: default sampling parameters; ``act(sampling_seed=...)`` sets the seed per episode.
        reject_incomplete: a completion cut by ``max_tokens`` counts as a parse failure.
        incomplete_penalty: reward for such a completion (default -1.0: a loss on the games' win 1 /
            loss -1 scale; as large as a success on a 0..1 reward, so scale it to the env's rewards).
        timeout_s: per-call timeout; a timeout becomes a failed request, not an exception.
    """

    def __init__(
        self,
        client: ChatClient,
        context: ContextStrategy | None = None,
        parser: Parser = identity_parser,
        sampling: SamplingParams | None = None,
        *,
        model: str | None = None,
        reject_incomplete: bool = True,
        incomplete_penalty: float = -1.0,
        timeout_s: float | None = None,
    ) -> None:
        self.client = client
        self.ctx = context if context is not None else FullDialog()
        self.parser = parser
        self.sampling = sampling or SamplingParams()
        self.model = model
        self.reject_incomplete = reject_incomplete
        self.incomplete_penalty = incomplete_penalty
        self.timeout_s = timeout_s
        self._prev: tuple[tuple[int, ...], tuple[int, ...], FinishReason, int] | None = None
        self._turn = 0

    def reset(self, system_prompt: str | None = None) -> None:
        """Start a new episode (the context's own system prompt wins over the env's)."""
        with stage("context"):
            self.ctx.reset(system_prompt)
        self._prev = None
        self._turn = 0

    def open_dialog(self, messages: list[Message]) -> None:
        """Messages that open the dialog before the first observation (an env's few-shot turns)."""
        with stage("context"):
            self.ctx.history.extend({"role": m["role"], "content": m["content"]} for m in messages)

    def observe(self, obs: str) -> None:
        """Add an env observation to the context."""
        with stage("context"):
            self.ctx.add_observation(obs)

    def add_feedback(self, text: str) -> None:
        """Add the parser's feedback on a malformed reply (the agent retries on the same observation)."""
        with stage("context"):
            self.ctx.add_feedback(text)

    def _prompt_ids(self, messages: list[Message]) -> tuple[int, ...] | None:
        """Token ids of the prompt ``messages`` (token-in extension when the context allows it)."""
        tok = self.client.tokenizer
        if tok is None:
            return None
        history = self.ctx.history
        if getattr(self.ctx, "raw", False):  # pre-formatted prompt text, no chat template
            return tuple(encode_raw(tok, messages[-1]["content"] if messages else ""))
        if self.ctx.append_only and self._prev is not None:
            prev_prompt, prev_completion, reason, n = self._prev
            if reason != FinishReason.ERROR:
                ids = extend_ids(tok, prev_prompt, prev_completion, reason, history[:n], history[n:])
                if ids is not None:
                    return tuple(ids)
        return tuple(render_ids(tok, messages))

    async def act(self, sampling_seed: int | None = None) -> AgentTurn:
        """Sample one completion for the current context and parse it."""
        sampling = self.sampling
        if sampling_seed is not None:
            sampling = dataclasses.replace(sampling, seed=sampling_seed + self._turn)
        self._turn += 1
        with stage("context"):
            messages = self.ctx.messages()
        with stage("chat_template"):
            prompt_ids = self._prompt_ids(messages)
        request = ChatRequest(messages, sampling, prompt_ids, self.model)
        try:
            if self.timeout_s is None:
                resp = await self.client.complete(request)
            else:
                resp = await asyncio.wait_for(self.client.complete(request), self.timeout_s)
        except asyncio.TimeoutError:
            resp = ChatResponse.failed(f"timeout after {self.timeout_s}s", request.prompt_ids or ())
        except Exception as e:  # a failed request is data, not a crash
            resp = ChatResponse.failed(f"{type(e).__name__}: {e}", request.prompt_ids or ())
        info: dict[str, Any] = {"finish_reason": resp.finish_reason.value, **resp.info}
        if resp.finish_reason == FinishReason.ERROR:
            info["inference_error"] = True
            return AgentTurn(ParseResult(None, 0.0, None), "", resp.trace, info)
        # the distribution the log-probs belong to, whatever the backend recorded
        resp = dataclasses.replace(resp, trace=dataclasses.replace(
            resp.trace, temperature=sampling.temperature, top_p=sampling.top_p, top_k=sampling.top_k))

        with stage("context"):
            self.ctx.add_response(resp.text)
        self._prev = (
            resp.trace.prompt_ids,
            resp.trace.completion_ids,
            resp.finish_reason,
            len(self.ctx.history),
        )
        if resp.finish_reason == FinishReason.LENGTH and self.reject_incomplete:
            info["incomplete_completion"] = True
            parse = ParseResult(None, self.incomplete_penalty, INCOMPLETE_FEEDBACK)
        else:
            with stage("parser"):
                parse = self.parser(resp.text)
        info["parse_error"] = parse.action is None
        return AgentTurn(parse, resp.text, resp.trace, info)
