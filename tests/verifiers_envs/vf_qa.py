"""A single-turn verifiers environment, written with verifiers' own classes (0.4, ``verifiers.v1``): a taskset of
small sums from an in-memory ``datasets.Dataset`` and a rubric of two weighted rewards and a metric. Loaded as
``verifiers:vf_qa`` (verifiers' convention: the module exports its ``Taskset`` via ``__all__``)."""

import verifiers.v1 as vf
from datasets import Dataset

SYSTEM_PROMPT = "Answer with the number only."
PAIRS = [(1, 2), (2, 2), (3, 4), (5, 1), (6, 2), (7, 3), (2, 9), (4, 4), (8, 1), (3, 3), (6, 5), (9, 9), (1, 7),
         (5, 5), (2, 6), (8, 3), (4, 9), (7, 7), (6, 6), (3, 8)]
ROWS = {"question": [f"What is {a} + {b}?" for a, b in PAIRS], "answer": [str(a + b) for a, b in PAIRS]}


class QAData(vf.TaskData):
    """One row: the question is the prompt, the answer is for the rubric."""

    answer: str


class QATask(vf.Task[QAData, vf.State, vf.TaskConfig]):
    """The rubric: the answer appears in the reply (weight 1), the reply is short (weight 0.5)."""

    @vf.reward(weight=1.0)
    async def correct(self, task: QAData, trace: vf.Trace) -> float:
        return float(task.answer in trace.last_reply)

    @vf.reward(weight=0.5)
    async def short(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply) <= 12)

    @vf.metric
    async def reply_chars(self, trace: vf.Trace) -> float:
        return float(len(trace.last_reply))


class QAConfig(vf.TasksetConfig):
    """Which rows: ``all``, ``train`` (the first 16) or ``test`` (the last 4), as a dataset's own splits."""

    part: str = "all"


class QATaskset(vf.Taskset[QATask, QAConfig]):
    """The rows of ``ROWS``, one task each."""

    def load(self):
        rows = Dataset.from_dict(ROWS)
        picked = {"all": range(20), "train": range(16), "test": range(16, 20)}[self.config.part]
        for row in rows.select(picked):
            yield QATask(QAData(prompt=row["question"], system_prompt=SYSTEM_PROMPT, answer=row["answer"]),
                         self.config.task)


class FewShotTaskset(QATaskset):
    """The same questions, each prompt opened by a worked example (a prompt given as messages)."""

    def load(self):
        for task in super().load():
            shots = [vf.UserMessage(content="What is 1 + 1?"), vf.AssistantMessage(content="2"),
                     vf.UserMessage(content=task.data.prompt)]
            yield task.with_data(prompt=shots)


def few_shot(**config):
    """``verifiers:vf_qa:few_shot``: a taskset built by a function (``module:function``)."""
    return FewShotTaskset(QAConfig(**config))


__all__ = ["QATaskset"]
