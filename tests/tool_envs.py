"""A newcomer's tool env for ``ludic.train(env, tools=[lookup])`` and ``ludic train env --tools``: the value of a
key sits in a Python dict the model can only read through ``lookup(key)``; a teacher (``demo``) for the format cold
start calls the tool, then answers with what it returned."""

import json
import re

from ludic import SingleAgentEnv, StepOutcome

TABLE = {"alpha": "17", "beta": "42", "gamma": "8", "delta": "23", "omega": "5", "sigma": "31"}


def lookup(key: str) -> str:
    """The value stored under a key.

    Args:
        key: the key to look up.
    """
    if key not in TABLE:
        raise KeyError(f"no key {key!r}")
    return TABLE[key]


class KeyEnv(SingleAgentEnv):
    """One question: the value of a key; the reply must contain it."""

    max_turns = 1

    def env_reset(self, seed=None):
        self.key = sorted(TABLE)[(seed or 0) % len(TABLE)]
        return f"What is the value of key '{self.key}'? Call lookup, then answer.", {"instance": self.key}

    def env_step(self, action):
        ok = TABLE[self.key] in action
        return StepOutcome("Correct." if ok else "Wrong.", float(ok), terminated=True, info={"success": float(ok)})


def demo(observation):
    """The teacher: a lookup call for a question, the value for a tool's result."""
    asked = re.search(r"key '(\w+)'", observation)
    if asked:
        return "<tool_call>" + json.dumps({"name": "lookup", "arguments": {"key": asked.group(1)}}) + "</tool_call>"
    return f"The value is {observation}."
