"""Name -> factory registries, so requests and configs stay serialisable.

``EnvSpec(kind, kwargs)`` builds ``ENVS[kind](**kwargs)``; built-in entries are
given as ``"module:attr"`` strings and imported on first use (heavy optional
dependencies such as pyspiel load only when their env is asked for).
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

from ludic.envs.base import LudicEnv
from ludic.types import EnvSpec

T = TypeVar("T")


class Registry(Generic[T]):
    """A name -> object table with lazily imported built-ins."""

    def __init__(self, what: str, builtins: dict[str, str]) -> None:
        self.what = what
        self._builtins = dict(builtins)
        self._table: dict[str, T] = {}

    def register(self, name: str, obj: T) -> None:
        self._table[name] = obj

    def get(self, name: str) -> T:
        if name not in self._table and name in self._builtins:
            module, attr = self._builtins[name].split(":")
            self._table[name] = getattr(importlib.import_module(module), attr)
        if name not in self._table:
            raise KeyError(f"unknown {self.what} {name!r}; registered: {self.names()}")
        return self._table[name]

    def names(self) -> list[str]:
        return sorted(set(self._table) | set(self._builtins))


EnvFactory = Callable[..., LudicEnv]
ENVS: Registry[EnvFactory] = Registry("env kind", {
    "tictactoe": "ludic.envs.tictactoe:TicTacToeEnv",
    "tictactoe_selfplay": "ludic.envs.tictactoe:TicTacToeGame",
    "prompt": "ludic.envs.prompt_env:PromptEnv",
    "tictactoe_position": "ludic.envs.tictactoe_positions:TicTacToePositionEnv",
    "openspiel": "ludic.envs.openspiel:OpenSpielEnv",
    "trace": "ludic.envs.trace:TraceEnv",
    "qa": "ludic.envs.qa:QAEnv",
    "dataset_qa": "ludic.envs.qa:DatasetQAEnv",
})


def register_env(kind: str, factory: EnvFactory) -> None:
    """Make ``EnvSpec(kind, kwargs)`` build ``factory(**kwargs)``."""
    ENVS.register(kind, factory)


def get_env_factory(kind: str) -> EnvFactory:
    return ENVS.get(kind)


def make_env(spec: EnvSpec) -> LudicEnv:
    """Build a fresh env from its spec."""
    return ENVS.get(spec.kind)(**spec.kwargs)
