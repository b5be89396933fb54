"""Format cold-start teachers of the held-out study (``--format-demos examples.study.teachers:<name>``).

``gem_guess``: GEM's guess-the-number reads a guess only inside ``\\boxed{}``, which the packaged model never
writes; this teacher guesses uniformly among the numbers in the range the first observation states that it has
not guessed yet: the format and legal moves, no use of the higher/lower hints (it wins by chance, about turns /
range size). Until 2026-11-29 it saw only the last observation, so after the first turn it guessed in 1..50,
repeating and leaving the range, and the policies it taught repeated one guess all game.

``calculator``: the arithmetic word problems of ``dataset_qa`` (source ``arith``) with the calculator tool: the
teacher calls the calculator on the problem's expression, then answers with the tool's result (the strategy of
``ludic train qa --tool-demos``: this row measures whether RL from a good policy keeps it).
"""

import functools
import json
import random
import re

_RANGE = re.compile(r"between (\d+) and (\d+)")
_BOXED = re.compile(r"\\boxed\{(\d+)\}")
_rng = random.Random(0)


def gem_guess(messages: list[dict]) -> str:
    users = [m["content"] for m in messages if m["role"] == "user"]
    found = _RANGE.search(users[0]) if users else None
    low, high = (int(found.group(1)), int(found.group(2))) if found else (1, 50)
    guessed = {int(g) for m in messages if m["role"] == "assistant" for g in _BOXED.findall(m["content"])}
    left = [n for n in range(low, high + 1) if n not in guessed] or list(range(low, high + 1))
    return f"\\boxed{{{_rng.choice(left)}}}"


@functools.lru_cache(maxsize=1)
def _expressions() -> dict[str, str]:
    from ludic.envs.qa import load_qa_records

    return {r["question"]: r["expression"] for split in ("train", "test") for r in load_qa_records("arith", split)}


def calculator(observation: str) -> str:
    expression = _expressions().get(observation.strip())
    if expression is None:  # the tool's result: the answer
        return observation.strip()
    return f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}</tool_call>"
