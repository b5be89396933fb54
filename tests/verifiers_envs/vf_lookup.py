"""A verifiers tool environment: the answer sits in a table the model can only read through a tool (a
``Toolset`` with one ``@vf.tool`` method, verifiers' tool servers). Loaded as ``verifiers:vf_lookup``."""

import verifiers.v1 as vf

TABLE = {"alpha": "17", "beta": "42", "gamma": "8", "delta": "23", "omega": "5", "sigma": "31", "kappa": "64",
         "theta": "12", "zeta": "90", "iota": "3"}


class KeyData(vf.TaskData):
    """The key asked about and its value."""

    key: str
    value: str


class TableConfig(vf.BaseConfig):
    """No settings."""


class Table(vf.Toolset[TableConfig, vf.State]):
    """The lookup table, served to the model as ``table_lookup``."""

    @vf.tool
    async def lookup(self, key: str) -> str:
        """The value stored under a key.

        Args:
            key: the key to look up.
        """
        return TABLE.get(key, f"no key {key!r}")


class KeyTask(vf.Task[KeyData, vf.State, vf.TaskConfig]):
    """Rewards: the value in the final reply (weight 1), a lookup made (weight 0.2)."""

    @classmethod
    def toolsets(cls, config):
        return [Table(TableConfig())]

    @vf.reward(weight=1.0)
    async def correct(self, task: KeyData, trace: vf.Trace) -> float:
        return float(task.value in trace.last_reply)

    @vf.reward(weight=0.2)
    async def looked_up(self, trace: vf.Trace) -> float:
        return float(bool(trace.tool_messages))


class KeyTaskset(vf.Taskset[KeyTask, vf.TasksetConfig]):
    """One task per key."""

    def load(self):
        for key, value in TABLE.items():
            yield KeyTask(KeyData(prompt=f"What is the value of key '{key}'? Use the tool.", key=key, value=value),
                          self.config.task)


__all__ = ["KeyTaskset"]
