"""Reward functions for ``ludic eval rescore`` on the study's reasoning-gym episodes (``examples/study/passk.sh``).

``tagged``: success only when the reply's last ``<answer>...</answer>`` holds the reference answer. Training and
evaluation grade with ``answer="auto"`` (the tag, else a numeric reply's last number), so this says how much of a
score leans on that fallback rather than on the format the prompt asks for.
"""

from __future__ import annotations

from ludic.envs.reasoning_gym_env import extract_answer
from ludic.eval.samples import normalize_answer


def tagged(reply: str, info: dict) -> bool:
    answer = extract_answer(reply, info.get("reference"), mode="tag")
    return answer is not None and normalize_answer(answer) == normalize_answer(info.get("reference"))
