"""Context strategies: what conversation history the agent shows the model.

A context keeps the full history; ``messages()`` is the view sent to the
model. ``append_only`` says whether each prompt extends the previous prompt
plus its completion, which lets the agent build the next prompt by appending
token ids (token-in) instead of re-rendering text.
"""

from __future__ import annotations

import re

from ludic.types import Message


class ContextStrategy:
    """Base class: a chat history with hooks. Subclasses override ``messages``."""

    append_only: bool = True
    """True when every prompt is a prefix-extension of the previous one."""

    def __init__(self, system_prompt: str | None = None) -> None:
        self.default_system_prompt = system_prompt
        self.history: list[Message] = []

    def reset(self, system_prompt: str | None = None) -> None:
        """Start a new episode; the constructor's prompt wins over the env's suggestion."""
        prompt = self.default_system_prompt or system_prompt
        self.history = [{"role": "system", "content": prompt}] if prompt else []

    def add_observation(self, obs: str) -> None:
        """An env observation (or parser feedback) becomes a user message."""
        self.history.append({"role": "user", "content": obs})

    def add_response(self, text: str) -> None:
        """The model's completion becomes an assistant message."""
        self.history.append({"role": "assistant", "content": text})

    def messages(self) -> list[Message]:
        """The prompt view of the history."""
        return [dict(m) for m in self.history]  # type: ignore[misc]


class FullDialog(ContextStrategy):
    """The model sees the complete history, thinking included."""

    append_only = True


_THINK_ANSWER = re.compile(r"^\s*<think>.*?</think>\s*(\S.*)$", re.DOTALL | re.IGNORECASE)


def truncate_thinking(text: str, placeholder: str = "[TRUNCATED]") -> str:
    """``<think>long</think>answer`` -> ``<think>[TRUNCATED]</think>answer``.

    Text without a complete think block followed by an answer is returned unchanged.
    """
    m = _THINK_ANSWER.match(text)
    if m is None:
        return text
    return f"<think>{placeholder}</think>{m.group(1)}"


class TruncatedThinkingContext(ContextStrategy):
    """Earlier assistant turns keep their answer; their thinking becomes ``[TRUNCATED]``.

    Saves context length in multi-turn games. A model must be taught the
    convention (SFT data transformed the same way, see ``ludic.data``).
    """

    append_only = False

    def __init__(self, system_prompt: str | None = None, placeholder: str = "[TRUNCATED]") -> None:
        super().__init__(system_prompt)
        self.placeholder = placeholder

    def messages(self) -> list[Message]:
        out: list[Message] = []
        for m in self.history:
            if m["role"] == "assistant":
                out.append({"role": "assistant", "content": truncate_thinking(m["content"], self.placeholder)})
            else:
                out.append(dict(m))  # type: ignore[arg-type]
        return out


class LastObservationContext(ContextStrategy):
    """Only the system prompt and the latest observation (a Markov view).

    For envs whose observation is the full state (a board), history adds
    tokens but no information; this keeps every prompt short.
    """

    append_only = False

    def messages(self) -> list[Message]:
        system = [dict(m) for m in self.history[:1] if m["role"] == "system"]
        users = [m for m in self.history if m["role"] == "user"]
        return system + [dict(users[-1])] if users else system  # type: ignore[return-value]


class RawPromptContext(ContextStrategy):
    """The latest observation as raw text, with no chat template (for base models and
    datasets whose prompts are already formatted, e.g. ThinkTacToe's board tokens)."""

    append_only = False
    raw = True

    def messages(self) -> list[Message]:
        users = [m for m in self.history if m["role"] == "user"]
        return [dict(users[-1])] if users else []  # type: ignore[list-item]


CONTEXTS = {"full": FullDialog, "truncated": TruncatedThinkingContext, "last": LastObservationContext,
            "raw": RawPromptContext}


def make_context(name: str, system_prompt: str | None = None) -> ContextStrategy:
    """``"full"`` -> FullDialog, ``"truncated"`` -> TruncatedThinkingContext, ``"last"`` -> LastObservationContext."""
    if name not in CONTEXTS:
        raise ValueError(f"unknown context {name!r}: expected one of {sorted(CONTEXTS)}")
    return CONTEXTS[name](system_prompt)


__all__ = [
    "ContextStrategy",
    "FullDialog",
    "TruncatedThinkingContext",
    "LastObservationContext",
    "RawPromptContext",
    "truncate_thinking",
    "make_context",
]
