"""Format cold-start teachers of the held-out study (``--format-demos examples.study.teachers:<name>``).

``gem_guess``: GEM's guess-the-number reads a guess only inside ``\\boxed{}``, which the packaged model never
writes; this teacher guesses a uniformly random number in the range the first observation states (later turns
only say higher or lower: it guesses in 1..50 there). The format, no strategy.

``calculator``: the arithmetic word problems of ``dataset_qa`` (source ``arith``) with the calculator tool: the
teacher calls the calculator on the problem's expression, then answers with the tool's result (the strategy of
``ludic train qa --tool-demos``: this row measures whether RL from a good policy keeps it).
"""

import functools
import json
import random
import re

_RANGE = re.compile(r"between (\d+) and (\d+)")
_rng = random.Random(0)


def gem_guess(observation: str) -> str:
    found = _RANGE.search(observation)
    low, high = (int(found.group(1)), int(found.group(2))) if found else (1, 50)
    return f"\\boxed{{{_rng.randint(low, high)}}}"


@functools.lru_cache(maxsize=1)
def _expressions() -> dict[str, str]:
    from ludic.envs.qa import load_qa_records

    return {r["question"]: r["expression"] for split in ("train", "test") for r in load_qa_records("arith", split)}


def calculator(observation: str) -> str:
    expression = _expressions().get(observation.strip())
    if expression is None:  # the tool's result: the answer
        return observation.strip()
    return f"<tool_call>{json.dumps({'name': 'calculator', 'arguments': {'expression': expression}})}</tool_call>"
