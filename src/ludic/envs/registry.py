"""Name -> factory registries, so requests and configs stay serialisable.

``EnvSpec(kind, kwargs)`` builds ``ENVS[kind](**kwargs)``; built-in entries are
given as ``"module:attr"`` strings and imported on first use (heavy optional
dependencies such as pyspiel load only when their env is asked for).

An env kind is one of (``ludic train env --env`` takes the same strings):

    tictactoe, qa, my_env, ...   a registered name (``register_env``)
    textarena:<game id>          a TextArena game (``ludic.envs.textarena_env``)
    reasoning_gym:<dataset>      a reasoning-gym dataset (``ludic.envs.reasoning_gym_env``)
    gem:<id> / gym:<id>          a GEM / Gymnasium text env (``ludic.envs.gym_text``)
    verifiers:<taskset|module>   a verifiers environment, unchanged (``ludic.envs.verifiers_env``)
    package.module:factory       any importable callable that returns a ``LudicEnv``
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from typing import Any, Callable, Generic, TypeVar

from ludic.envs.base import LudicEnv
from ludic.types import EnvSpec

T = TypeVar("T")


def import_attr(path: str) -> Any:
    """``"package.module:attr"`` -> the object, the working directory importable as under ``python -m``
    (a console script's ``sys.path`` lacks it)."""
    module, attr = path.split(":", 1)
    cwd_importable()
    return getattr(importlib.import_module(module), attr)


def cwd_importable() -> None:
    """Put the working directory on ``sys.path`` when it is not (a console script's path lacks it)."""
    if os.getcwd() not in sys.path and "" not in sys.path:
        sys.path.append(os.getcwd())


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
            found = self._resolve(name)
            if found is None:
                raise KeyError(f"unknown {self.what} {name!r}; registered: {self.names()}")
            self._table[name] = found
        return self._table[name]

    def _resolve(self, name: str) -> T | None:
        """A name the table does not hold: subclasses read prefixes and import paths here."""
        return None

    def names(self) -> list[str]:
        return sorted(set(self._table) | set(self._builtins))


EnvFactory = Callable[..., LudicEnv]

ADAPTERS = {
    "textarena": "ludic.envs.textarena_env:TextArenaEnv",
    "reasoning_gym": "ludic.envs.reasoning_gym_env:ReasoningGymEnv",
    "gem": "ludic.envs.gym_text:make_gem",
    "gym": "ludic.envs.gym_text:make_gymnasium",
    "verifiers": "ludic.envs.verifiers_env:VerifiersEnv",
}
"""Spec prefix -> adapter factory; ``prefix:rest`` builds ``factory(rest, **kwargs)``."""


class EnvRegistry(Registry[EnvFactory]):
    """Env kinds: registered names, adapter prefixes (``textarena:TicTacToe-v0``) and import paths."""

    def _resolve(self, name: str) -> EnvFactory | None:
        if ":" not in name:
            return None
        prefix, rest = name.split(":", 1)
        if prefix in ADAPTERS:
            return functools.partial(import_attr(ADAPTERS[prefix]), rest)
        try:
            obj = import_attr(name)
        except (ImportError, AttributeError) as e:
            raise KeyError(f"env kind {name!r}: not a registered name ({self.names()}), not an adapter prefix "
                           f"({sorted(ADAPTERS)}), and {prefix}:{rest} does not import ({type(e).__name__}: {e})") from e
        if not callable(obj):
            raise KeyError(f"env kind {name!r}: {prefix}.{rest} is not callable (a LudicEnv class or factory)")
        return obj


ENVS: Registry[EnvFactory] = EnvRegistry("env kind", {
    "tictactoe": "ludic.tictactoe.env:TicTacToeEnv",
    "tictactoe_selfplay": "ludic.tictactoe.env:TicTacToeGame",
    "prompt": "ludic.envs.prompt_env:PromptEnv",
    "tictactoe_position": "ludic.tictactoe.positions:TicTacToePositionEnv",
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
