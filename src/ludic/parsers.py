"""Composable parsers: raw model text -> action, with format rewards.

A parser is any ``Callable[[str], ParseResult]``. On success it returns the
extracted action and a (usually small or zero) format reward; on failure it
returns ``action=None``, a penalty and a feedback observation. A failed parse
never raises: the protocol records it as a synthetic step (see
``ludic.interaction``) and the environment is not stepped.

    parser = compose_parsers(think_prefix_parser, xml_tag_parser("move", exact=True))
    parser("<think>centre is best</think><move>B2</move>").action == "B2"
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from functools import partial
from typing import Callable


@dataclass(frozen=True)
class ParseResult:
    """Outcome of parsing one model output."""

    action: str | None
    """Extracted action, or None when the output is malformed."""
    reward: float = 0.0
    """Format reward (success) or penalty (failure)."""
    obs: str | None = None
    """Feedback shown to the agent after a failure."""


Parser = Callable[[str], ParseResult]

_THINK_RE = re.compile(r"^\s*<think>(.*?)</think>(.*)$", re.DOTALL | re.IGNORECASE)


def compose_parsers(*parsers: Parser) -> Parser:
    """Chain parsers left to right: each one parses the previous one's action.

    Rewards add up. The first failure stops the chain and returns
    ``action=None`` with the rewards so far plus the failing parser's penalty.
    """

    def parse(raw: str) -> ParseResult:
        text, total = raw, 0.0
        for p in parsers:
            r = p(text)
            total += r.reward
            if r.action is None:
                return ParseResult(None, total, r.obs)
            text = r.action
        return ParseResult(text, total, None)

    return parse


def xml_tag_parser(
    tag: str,
    *,
    exact: bool = False,
    success_reward: float = 0.0,
    error_reward: float = -1.0,
) -> Parser:
    """Extract the inner text of ``<tag>...</tag>`` (case-insensitive).

    The output must hold exactly one opening and one closing tag, in that
    order: several, nested or stray tags are a parse failure, never one
    action. With ``exact=True`` the whole output (ignoring surrounding
    whitespace) must be that single tag. An empty inner text is a failure.
    The scan is linear in the length of the output.

    ``error_reward`` (default -1.0) is on the scale of the games' outcomes (win 1, loss -1): a malformed
    answer costs as much as a loss. On a 0..1 success reward that is as large as a success; use a
    smaller penalty there (e.g. -0.1), or 0 and let the missing reward teach the format.
    """
    opening = re.compile(re.escape(f"<{tag}>"), re.IGNORECASE)
    closing = re.compile(re.escape(f"</{tag}>"), re.IGNORECASE)
    feedback = f"Invalid action format: expected exactly one <{tag}>...</{tag}>."

    def parse(raw: str) -> ParseResult:
        text = raw.strip() if exact else raw
        opens, closes = _first_two(opening, text), _first_two(closing, text)
        if len(opens) != 1 or len(closes) != 1 or opens[0].end() > closes[0].start():
            return ParseResult(None, error_reward, feedback)
        if exact and (opens[0].start() != 0 or closes[0].end() != len(text)):
            return ParseResult(None, error_reward, feedback)
        inner = text[opens[0].end():closes[0].start()].strip()
        if not inner:
            return ParseResult(None, error_reward, feedback)
        return ParseResult(inner, success_reward, None)

    return parse


def _first_two(literal: re.Pattern[str], text: str) -> list[re.Match[str]]:
    """Up to two occurrences of a literal pattern (enough to tell "one" from "several")."""
    return list(itertools.islice(literal.finditer(text), 2))


def think_prefix_parser(
    raw: str, *, success_reward: float = 0.0, error_reward: float = -1.0
) -> ParseResult:
    """Require the output to start with ``<think>...</think>``; the action is what follows.

    Use ``functools.partial`` (or ``make_think_prefix_parser``) to change rewards.
    """
    m = _THINK_RE.match(raw)
    if m is None or not m.group(2).strip():
        return ParseResult(
            None,
            error_reward,
            "Invalid format: start with <think>...</think>, then give your answer.",
        )
    return ParseResult(m.group(2).strip(), success_reward, None)


def make_think_prefix_parser(success_reward: float = 0.0, error_reward: float = -1.0) -> Parser:
    """``think_prefix_parser`` with chosen rewards."""
    return partial(think_prefix_parser, success_reward=success_reward, error_reward=error_reward)


cot_prefix_parser = think_prefix_parser


def think_move_parser(
    *, success_reward: float = 0.0, error_reward: float = -1.0, tag: str = "move"
) -> Parser:
    """The strict ``<think>...</think><move>...</move>`` format of the tic-tac-toe recipe."""
    return compose_parsers(
        make_think_prefix_parser(success_reward, error_reward),
        xml_tag_parser(tag, exact=True, success_reward=0.0, error_reward=error_reward),
    )


def regex_parser(
    pattern: str,
    *,
    feedback: str | None = None,
    success_reward: float = 0.0,
    error_reward: float = -1.0,
) -> Parser:
    """The whole output (ignoring surrounding whitespace and case) must match ``pattern``;
    the stripped output is the action. The strictest parser for bare answers such as a
    cell name (``regex_parser(r"[A-C][1-3]")``) or an action id (``regex_parser(r"\\d+")``)."""
    compiled = re.compile(pattern, re.IGNORECASE)
    message = feedback or f"Invalid answer: expected only an answer matching {pattern}."

    def parse(raw: str) -> ParseResult:
        text = raw.strip()
        if not text or compiled.fullmatch(text) is None:
            return ParseResult(None, error_reward, message)
        return ParseResult(text, success_reward, None)

    return parse


def identity_parser(raw: str) -> ParseResult:
    """Pass the raw text through as the action."""
    return ParseResult(raw.strip(), 0.0, None)


def extract_last_boxed(raw: str) -> str | None:
    r"""Content of the last ``\boxed{...}`` (nested braces handled), or None."""
    start = raw.rfind("\\boxed{")
    if start < 0:
        return None
    i, depth, out = start + len("\\boxed{"), 1, []
    while i < len(raw):
        c = raw[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return "".join(out).strip()
        out.append(c)
        i += 1
    return None


def boxed_parser(raw: str, *, success_reward: float = 0.0, error_reward: float = -1.0) -> ParseResult:
    r"""Extract the final ``\boxed{...}`` answer."""
    ans = extract_last_boxed(raw)
    if not ans:
        return ParseResult(None, error_reward, "Invalid answer: put the final answer in \\boxed{...}.")
    return ParseResult(ans, success_reward, None)


_ONE_NUMBER = re.compile(r"[-+]?\d+\s*/\s*\d+|[-+]?\d+(?:,\d{3})*(?:\.\d+)?|[-+]?\.\d+")
"""A number in an answer: a fraction ``3/4``, ``1,000``, ``-2.5``, ``.5``."""


def hedged(answer: str, reference: str) -> bool:
    """Whether ``answer`` offers several candidates where ``reference`` is one number (``12 14 16`` for ``14``):
    graded as wrong, so a policy cannot earn reward by listing guesses (reasoning-gym's partial credit paid
    ``len(oracle) / len(answer)`` for it, and GRPO reinforced hedging)."""
    if len(_ONE_NUMBER.findall(reference)) != 1 or not _ONE_NUMBER.fullmatch(reference.strip().rstrip(".")):
        return False
    return len(_ONE_NUMBER.findall(answer)) > 1
