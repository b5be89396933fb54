"""A single-turn verifiers environment for the packaged model, written with verifiers' own classes (0.4,
``verifiers.v1``): sums of two two-digit numbers (8,100 distinct questions), a rubric of two weighted rewards (the
right number, weight 1; a bare number as the reply, weight 0.25) and a metric. Nothing in it knows Ludic.

    PYTHONPATH=examples/verifiers ludic train env --env verifiers:vf_sums --budget-minutes 10

The adapter holds out a fixed fifth of the rows (1,620 questions), disjoint by question text from the rows a run
trains on. ``correct`` reads the last integer of the reply: a reply that lists several numbers earns it only when
its last one is right, so hedging does not pay."""

import re

import verifiers.v1 as vf
from datasets import Dataset

SYSTEM_PROMPT = "Answer with the number only."


def last_int(text: str) -> int | None:
    found = re.findall(r"-?\d+", text.replace(",", ""))
    return int(found[-1]) if found else None


class SumData(vf.TaskData):
    """One row: the question is the prompt, the sum is for the rubric."""

    answer: int


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    """The rubric: the reply's last integer is the sum (weight 1); the reply is that number alone (weight 0.25)."""

    @vf.reward(weight=1.0)
    async def correct(self, task: SumData, trace: vf.Trace) -> float:
        return float(last_int(trace.last_reply) == task.answer)

    @vf.reward(weight=0.25)
    async def bare(self, trace: vf.Trace) -> float:
        return float(trace.last_reply.strip().isdigit())

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class SumTaskset(vf.Taskset[SumTask, vf.TasksetConfig]):
    """Every sum a + b with a and b in 10..99, in a fixed shuffled order."""

    def load(self):
        pairs = [(a, b) for a in range(10, 100) for b in range(10, 100)]
        order = sorted(range(len(pairs)), key=lambda i: (i * 7919) % len(pairs))  # a fixed shuffle
        rows = Dataset.from_dict({"question": [f"What is {pairs[i][0]} + {pairs[i][1]}?" for i in order],
                                  "answer": [sum(pairs[i]) for i in order]})
        for row in rows:
            yield SumTask(SumData(prompt=row["question"], system_prompt=SYSTEM_PROMPT, answer=row["answer"]),
                          self.config.task)


__all__ = ["SumTaskset"]
