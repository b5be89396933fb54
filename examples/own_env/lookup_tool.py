"""A newcomer's tool environment, trained by one call: ``ludic.train(KeyEnv, tools=[lookup])``.

A table of 1,000 made-up keys sits in a Python dict that the model can only read through ``lookup(key)``, a plain
Python function (its schema comes from the signature and docstring). The env asks for one key's value and pays 1
when the reply contains it. With 1,000 keys the run holds its 64 test and 32 validation keys out of training
(``summary.json``'s ``instances``): a held-out key's value cannot be remembered, only looked up. The format cold
start's teacher (``demo``) calls the tool and answers with what it returned. The default cold start (10 steps at
2e-4, one pass over its 64 demo turns) left the packaged model at 0%: it wrote ``{"name": "lookup", ...}`` without
the tags, or prose; 4 passes in the same 10 steps still 0% ("The value stored under the key 'bebeka' is 2."), so
the example gives the cold start 30 steps at 5e-4.

    python examples/own_env/lookup_tool.py [budget minutes, default 10]
"""

from __future__ import annotations

import json
import random
import re
import sys

import ludic
from ludic import SingleAgentEnv, StepOutcome

_rng = random.Random(0)
_SYLLABLES = ["ka", "lo", "mi", "ne", "ru", "sa", "ti", "vo", "ze", "pa", "do", "fi", "gu", "be", "xo", "ya"]
TABLE: dict[str, str] = {}
while len(TABLE) < 1000:
    TABLE.setdefault("".join(_rng.choice(_SYLLABLES) for _ in range(3)), str(_rng.randint(10, 99)))
KEYS = sorted(TABLE)


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: the key to look up.
    """
    if key not in TABLE:
        raise KeyError(f"no key {key!r}")
    return TABLE[key]


class KeyEnv(SingleAgentEnv):
    """One question: the value of a key (seed -> key); the reply must contain the value."""

    max_turns = 1

    def env_reset(self, seed=None):
        self.key = KEYS[(seed or 0) % len(KEYS)]
        return f"What is the value of key '{self.key}'? Call lookup, then answer.", {"instance": self.key}

    def env_step(self, action):
        ok = TABLE[self.key] in action
        return StepOutcome("Correct." if ok else "Wrong.", float(ok), terminated=True, info={"success": float(ok)})


def demo(observation: str) -> str:
    """The teacher: a lookup call for a question, the value for a tool's result."""
    asked = re.search(r"key '(\w+)'", observation)
    if asked:
        return "<tool_call>" + json.dumps({"name": "lookup", "arguments": {"key": asked.group(1)}}) + "</tool_call>"
    return f"The value is {observation}."


if __name__ == "__main__":
    minutes = float(sys.argv[1]) if len(sys.argv) > 1 else 10.0
    result = ludic.train(KeyEnv, tools=[lookup], format_demos=demo, format_demo_epochs=4,
                          format_demo_steps=30, format_demo_lr=5e-4,
                          budget_minutes=minutes, max_completion_tokens=48)
    for stage in ("base", "format_demos", "trained"):
        r = result.results.get(stage)
        if r:
            print(f"{stage}: held-out success {r['success_rate']:.1%}")
    print("run:", result.run_dir)
