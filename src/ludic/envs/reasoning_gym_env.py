"""reasoning-gym datasets as single-turn Ludic envs: ``EnvSpec("reasoning_gym:leg_counting")``.

Any dataset reasoning-gym registers works, by name and config (``config={"min_animals": 2}``). An
episode is one question; the reply's last ``<answer>...</answer>`` (``answer="auto"``: else, for a numeric
reference, the reply's last number; ``"tag"``: the tag only) is graded by the dataset's own ``score_answer``.
The reward is success, 1 for a full score and 0 otherwise; ``partial_credit=True`` pays the dataset's score in
[0, 1] instead (which pays ``len(oracle) / len(answer)`` for the right answer inside a longer one). A hedged
reply (several different answer tags, or several numbers for a one-number reference: ``parsers.hedged``)
earns what a wrong one does, and a reply with no answer scores ``no_answer_reward``. ``info["success"]`` is 1
for a full score; ``info["instance"]`` is the question (``eval.instances``).

Train and evaluation questions are disjoint by index: the generator is built once with
``dataset_seed`` and ``train_size + eval_size`` entries; ``split="train"`` episodes draw entry
``seed % train_size`` and ``split="eval"`` ones entry ``train_size + seed % eval_size``. (reasoning-gym
makes each entry from its own seeded RNG, so the two splits are different draws; a task whose question
space is tiny can still repeat a question across them.)

Needs ``pip install 'ludic[envs]'`` (or ``reasoning-gym``).
"""

from __future__ import annotations

import functools
import json
import re
from typing import Any

from ludic.envs.base import SingleAgentEnv
from ludic.parsers import hedged
from ludic.types import JSON, StepOutcome

INSTRUCTION = "Give the final answer inside <answer></answer> tags."
"""No example answer: a small model copies it (with "e.g. <answer>42</answer>", SmolLM2-135M answered 42
to most questions)."""
_ANSWER = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL | re.IGNORECASE)


_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def extract_answer(reply: str, reference: str | None = None, mode: str = "auto") -> str | None:
    """The answer in a reply. ``tag``: the last ``<answer>...</answer>``, stripped (None when there is
    none). ``auto``: that, else, when the reference answer is a number, the reply's last number."""
    found = _ANSWER.findall(reply)
    if found:
        return found[-1].strip()
    if mode == "auto" and reference is not None and _NUMBER.fullmatch(reference.strip()):
        numbers = _NUMBER.findall(reply)
        return numbers[-1] if numbers else None
    if mode not in ("auto", "tag"):
        raise ValueError(f"answer mode must be 'auto' or 'tag', got {mode!r}")
    return None


def config_key(name: str, config: dict[str, Any] | None) -> str:
    """A dataset config as canonical JSON (sorted keys): the cache key of ``_dataset``, hashable where the
    config holds lists (``--env-kwargs '{"config": {"operators": ["+"]}}'``)."""
    try:
        return json.dumps(config or {}, sort_keys=True)
    except TypeError as e:
        raise ValueError(f"reasoning-gym {name}: config must be JSON values (numbers, strings, lists, "
                         f"objects): {e}") from None


@functools.lru_cache(maxsize=32)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    """The dataset ``name`` built once per (config, seed, size); the config is read back from its key, so a
    config from Python and the same one from ``--env-kwargs`` build the same dataset."""
    try:
        import reasoning_gym
    except ImportError as e:
        raise ImportError("the reasoning-gym adapter needs reasoning-gym: pip install 'ludic[envs]'") from e
    from reasoning_gym.factory import DATASETS

    if name not in DATASETS:
        near = sorted(k for k in DATASETS if name.split("_")[0] in k)[:10]
        raise ValueError(f"reasoning-gym has no dataset {name!r}" + (f"; similar: {near}" if near else ""))
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


class ReasoningGymEnv(SingleAgentEnv):
    """One reasoning-gym question per episode (see the module docstring).

    Args:
        name: a reasoning-gym dataset, e.g. ``"leg_counting"``.
        config: the dataset's own config fields (difficulty ranges, ...).
        split: ``"train"`` or ``"eval"`` (disjoint entries).
        train_size / eval_size: entries in each split.
        dataset_seed: the generator's seed.
        instruction: appended to the question (how to format the answer).
        answer: ``auto`` (the answer tag, else the last number for numeric answers) or ``tag`` only.
        no_answer_reward: reward of a reply without an answer (its score would be 0 anyway).
        partial_credit: pay the dataset's score (partial credit) instead of success.
    """

    max_turns = 1

    def __init__(self, name: str, *, config: dict[str, Any] | None = None, split: str = "train",
                 train_size: int = 100_000, eval_size: int = 1_000, dataset_seed: int = 0,
                 instruction: str = INSTRUCTION, answer: str = "auto", no_answer_reward: float = 0.0,
                 partial_credit: bool = False) -> None:
        super().__init__()
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if answer not in ("auto", "tag"):
            raise ValueError(f"answer must be 'auto' or 'tag', got {answer!r}")
        self.name, self.split, self.instruction, self.answer_mode = name, split, instruction, answer
        self.train_size, self.eval_size, self.no_answer_reward = int(train_size), int(eval_size), no_answer_reward
        self.partial_credit = bool(partial_credit)
        self.dataset = _dataset(name, config_key(name, config), int(dataset_seed), self.train_size + self.eval_size)
        self.entry: dict[str, Any] = {}

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        seed = 0 if seed is None else int(seed)
        index = seed % self.train_size if self.split == "train" else self.train_size + seed % self.eval_size
        self.entry = self.dataset[index]
        question = str(self.entry["question"]).strip()
        return (f"{question}\n\n{self.instruction}" if self.instruction else question,
                {"dataset": self.name, "index": index, "split": self.split, "instance": question})

    def env_step(self, action: str) -> StepOutcome:
        reference = str(self.entry.get("answer", ""))
        answer = extract_answer(action, reference, self.answer_mode)
        tags = {t.strip() for t in _ANSWER.findall(action) if t.strip()}
        hedge = answer is not None and (len(tags) > 1 or hedged(answer, reference))
        if answer is None or hedge:
            score, reward = 0.0, (self.no_answer_reward if answer is None else 0.0)
        else:
            score = float(self.dataset.score_answer(answer, self.entry))
            reward = score if self.partial_credit else float(score >= 1.0)
        info = {"answer": answer, "reference": reference, "score": score, "success": float(score >= 1.0),
                "no_answer": answer is None, "hedged": hedge}
        return StepOutcome("Correct." if score >= 1.0 else "Graded.", reward, terminated=True, info=info)
