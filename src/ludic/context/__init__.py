"""Context strategies: what conversation history the agent shows the model.

A context keeps the full history; ``messages()`` is the view sent to the
model. ``append_only`` says whether each prompt extends the previous prompt
plus its completion, which lets the agent build the next prompt by appending
token ids (token-in) instead of re-rendering text.

Env observations and parser feedback both enter the history as user
messages, but the context knows which is which (``add_observation`` vs
``add_feedback``): a view that shows only the latest observation still
shows it, with the feedback, when the model must retry a malformed reply.
"""

from __future__ import annotations

import re

from ludic.types import Message


class ContextStrategy:
    """Base class: a chat history with hooks. Subclasses override ``messages``."""

    append_only: bool = True
    """True when every prompt is a prefix-extension of the previous one."""
    history_free: bool = False
    """True when the prompt depends only on the latest observation (and feedback), not on earlier turns."""

    def __init__(self, system_prompt: str | None = None) -> None:
        self.default_system_prompt = system_prompt
        self.history: list[Message] = []
        self._feedback: set[int] = set()  # positions in history of parser feedback

    def reset(self, system_prompt: str | None = None) -> None:
        """Start a new episode; the constructor's prompt wins over the env's suggestion."""
        prompt = self.default_system_prompt or system_prompt
        self.history = [{"role": "system", "content": prompt}] if prompt else []
        self._feedback = set()

    def add_observation(self, obs: str) -> None:
        """An env observation becomes a user message."""
        self.history.append({"role": "user", "content": obs})

    def add_feedback(self, text: str) -> None:
        """Parser feedback on a malformed reply becomes a user message, marked as feedback."""
        self._feedback.add(len(self.history))
        self.history.append({"role": "user", "content": text})

    def latest_observation(self) -> tuple[str | None, str | None]:
        """The latest env observation and the latest feedback given after it (None when absent)."""
        feedback = None
        for i in range(len(self.history) - 1, -1, -1):
            m = self.history[i]
            if m["role"] != "user":
                continue
            if i not in self._feedback:
                return m["content"], feedback
            if feedback is None:
                feedback = m["content"]
        return None, feedback

    def add_tool_result(self, text: str) -> None:
        """A tool's result (``ludic.agents.tools``) becomes a ``tool`` message."""
        self.history.append({"role": "tool", "content": text})

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
    tokens but no information; this keeps every prompt short. After a
    malformed reply the one user message is the latest observation followed
    by the latest feedback (one message, as strict templates want user and
    assistant turns to alternate).
    """

    append_only = False
    history_free = True

    def messages(self) -> list[Message]:
        system: list[Message] = [dict(m) for m in self.history[:1] if m["role"] == "system"]  # type: ignore[misc]
        shown = [text for text in self.latest_observation() if text is not None]
        return system + [{"role": "user", "content": "\n\n".join(shown)}] if shown else system


class RawPromptContext(ContextStrategy):
    """The latest observation as raw text, with no chat template (for base models and
    datasets whose prompts are already formatted, e.g. ThinkTacToe's board tokens).

    Parser feedback is not shown (a formatted prompt has no place for it): a
    retry samples again from the same prompt.
    """

    append_only = False
    history_free = True
    raw = True

    def messages(self) -> list[Message]:
        obs, _ = self.latest_observation()
        return [] if obs is None else [{"role": "user", "content": obs}]


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
