"""The ChatClient interface: messages or token ids in, token ids and log-probs out.

Every inference backend (the in-process transformers engine, the vLLM server
client, the in-process vLLM engine) implements ``ChatClient``. A request may
carry ``prompt_ids`` (token-in): the backend then conditions on exactly those
ids and ignores ``messages`` except for logging. The response always carries
the exact prompt ids, sampled ids, their log-probs and the policy version per
token (token-out).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from ludic.types import FinishReason, Message, TokenTrace


@dataclass(frozen=True)
class SamplingParams:
    """Portable sampling settings (OpenAI-aligned names)."""

    temperature: float = 1.0
    """0 means greedy."""
    top_p: float = 1.0
    top_k: int = 0
    """Sample among the k most likely tokens only (0: off)."""
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    """Stop strings; the completion is cut after the first one (it is kept)."""
    seed: int | None = None
    """Per-request sampling seed (reproducible given the same batch layout)."""

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k must be >= 0 (0 = off), got {self.top_k}")
        if self.max_tokens < 1:
            raise ValueError(f"SamplingParams.max_tokens must be >= 1, got {self.max_tokens}")


@dataclass(frozen=True)
class ChatRequest:
    """One completion request."""

    messages: list[Message]
    """The conversation (rendered with the model's chat template unless prompt_ids is set)."""
    sampling: SamplingParams = field(default_factory=SamplingParams)
    prompt_ids: tuple[int, ...] | None = None
    """Token-in: condition on exactly these ids (chat template already applied)."""
    model: str | None = None
    """Model or adapter name, for servers that host several."""


@dataclass(frozen=True)
class ChatResponse:
    """One completion, with its exact token trace."""

    text: str
    """Decoded completion (stop token removed, stop string kept)."""
    trace: TokenTrace
    """Exact prompt ids, completion ids, log-probs and policy versions."""
    info: dict[str, Any] = field(default_factory=dict)
    """Backend diagnostics (latency, server, error message on failure)."""

    @property
    def finish_reason(self) -> FinishReason:
        return self.trace.finish_reason

    @classmethod
    def failed(cls, error: str, prompt_ids: tuple[int, ...] = ()) -> "ChatResponse":
        """A response for a request that could not be served (becomes a failed step)."""
        trace = TokenTrace(prompt_ids, (), (), (), FinishReason.ERROR)
        return cls(text="", trace=trace, info={"error": error})


@runtime_checkable
class ChatClient(Protocol):
    """Anything that turns a ChatRequest into a ChatResponse.

    ``tokenizer`` may be None when the client cannot tokenise locally; agents
    then send messages instead of token ids.
    """

    @property
    def tokenizer(self) -> Any | None: ...

    async def complete(self, request: ChatRequest) -> ChatResponse: ...


class FunctionClient:
    """A ``ChatClient`` whose replies come from a Python function of the conversation: a teacher that
    writes demonstrations through the same agent, protocol and chat template the model will use, so
    the recorded token traces are exactly the prompts the model sees (``ludic train qa --tool-demos``).

    ``reply(messages)`` returns the text; the completion ids are its tokens plus the end-of-turn token.
    Policy versions are -1 (not a sample of any policy) and log-probs ``logprob``: 0 for offline data, NaN
    for "unknown" (replies mixed into a policy's RL samples: the loss then scores them with an importance
    ratio of 1, see ``ludic.training.objective``).
    """

    def __init__(self, tokenizer: Any, reply: Any, *, logprob: float = 0.0) -> None:
        self._tokenizer = tokenizer
        self.reply = reply
        self.logprob = logprob

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    async def complete(self, request: ChatRequest) -> ChatResponse:
        from ludic.tokenization import encode, render_ids

        text = self.reply(request.messages)
        prompt = tuple(request.prompt_ids) if request.prompt_ids is not None else tuple(render_ids(self._tokenizer, request.messages))
        ids = tuple(encode(self._tokenizer, text)) + (self._tokenizer.eos_token_id,)  # the end of the turn
        trace = TokenTrace(prompt, ids, (self.logprob,) * len(ids), (-1,) * len(ids), FinishReason.STOP)
        return ChatResponse(text=text, trace=trace, info={"backend": "function"})
