"""The format cold start of ``ludic train env`` (``--format-demos``): a teacher writes replies in the env's format
through the same agent, context and chat template as the policy, and a short SFT on those turns runs before RL.
Use it when the model never writes the format the env reads (the trainer stops after ``max_no_signal_steps``
steps without any learning signal and says so).

The teacher: example replies (a .jsonl of ``{"reply": ...}`` or a .txt, one per line: a teacher answers each turn
with one of them) or a function ``observation -> reply`` (``module:function``, or a callable in Python; a function
whose first parameter is named ``messages`` gets the whole dialog instead, for a teacher that must remember what it
already played). With tools
(``--tools``, or an env's own), a teacher reply may call one in the agent's format (``<tool_call>{"name": ...,
"arguments": {...}}</tool_call>`` for a model whose template has none); the tool runs, and the teacher's next
observation is its result.
"""

from __future__ import annotations

import random
from dataclasses import replace
from pathlib import Path
from typing import Any, Callable

from ludic.envs.registry import import_attr
from ludic.recipes.env_setup import TrainingSeeds, protocols
from ludic.types import EnvSpec, RolloutRequest

FORMAT_DEMO_EPISODES = 32


def demo_teacher(spec: str | Callable[[str], str], seed: int = 0) -> Callable[[list[dict]], str]:
    """The teacher of a format cold start, ``messages -> reply``: from example replies (a .jsonl of
    ``{"reply": ...}``, a .txt one per line) or a function of the last observation (or tool result), or of the
    dialog when its first parameter is named ``messages``."""
    if callable(spec):
        fn = spec
    elif spec.endswith((".jsonl", ".txt")):
        path = Path(spec)
        if not path.exists():
            raise FileNotFoundError(f"--format-demos: {path} does not exist")
        if spec.endswith(".jsonl"):
            from ludic.data.jsonl import read_jsonl

            replies = [r["reply"] for r in read_jsonl(path, {"reply": str})]
        else:
            replies = [line.strip() for line in path.read_text().splitlines() if line.strip()]
        if not replies:
            raise ValueError(f"--format-demos: {path} holds no example reply")
        rng = random.Random(seed)
        fn = lambda obs: rng.choice(replies)  # noqa: E731
    elif ":" in spec:
        fn = import_attr(spec)
    else:
        raise ValueError(f"--format-demos {spec!r}: give a .jsonl / .txt of example replies or module:function")

    if _takes_messages(fn):
        return lambda messages: str(fn(messages))

    def reply(messages: list[dict]) -> str:  # the latest observation, or a tool's result
        last = next((m["content"] for m in reversed(messages) if m["role"] in ("user", "tool")), "")
        return str(fn(last))

    return reply


def _takes_messages(fn: Callable) -> bool:
    import inspect

    try:
        params = list(inspect.signature(fn).parameters)
    except (TypeError, ValueError):  # a builtin without a signature
        return False
    return bool(params) and params[0] == "messages"


async def format_demo_items(cfg: Any, env: Any, tok: Any, teacher_spec: Any, held: Any = None,
                            out: Path | None = None) -> list[Any]:
    """SFT items from the teacher playing ``FORMAT_DEMO_EPISODES`` training episodes (every seat) through
    the same agent, context and chat template as the policy, none on a held-out instance (``held``; the
    instances it plays count as trained); ``out``: a JSONL of the teacher's episodes."""
    from ludic.inference.client import FunctionClient, SamplingParams
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import SAWItem

    teacher = FunctionClient(tok, demo_teacher(teacher_spec, cfg.seed))
    sampling = SamplingParams(temperature=0.0, max_tokens=cfg.env.max_completion_tokens)
    protos = protocols(teacher, cfg.env, env, sampling)
    key = "single_agent" if "single_agent" in protos else "self"
    draw = TrainingSeeds(replace(cfg, seed=cfg.seed + 7), n_seats=1, multi=False, held=held)
    spec = EnvSpec(cfg.env.env, cfg.env.kwargs())
    reqs = [RolloutRequest(spec, protocol=key, env_seed=draw._seed(), max_steps=cfg.env.max_turns or None)
            for _ in range(FORMAT_DEMO_EPISODES)]
    rollouts = await RolloutEngine(protos, jsonl_path=out).generate_rollouts(reqs, progress="format demos")
    return [SAWItem(prompt_ids=s.trace.prompt_ids, completion_ids=s.trace.completion_ids, weight=1.0)
            for r in rollouts if not r.meta.get("failed") for s in r.steps if s.trace is not None]


