"""A tiny env registry: ``kind`` string -> factory, so requests stay serialisable."""

from __future__ import annotations

from typing import Callable

from ludic.envs.base import LudicEnv
from ludic.types import EnvSpec

EnvFactory = Callable[..., LudicEnv]
_REGISTRY: dict[str, EnvFactory] = {}
_BUILTINS = {
    "tictactoe": "ludic.envs.tictactoe:TicTacToeEnv",
    "tictactoe_selfplay": "ludic.envs.tictactoe:TicTacToeGame",
    "prompt": "ludic.envs.prompt_env:PromptEnv",
}


def register_env(kind: str, factory: EnvFactory) -> None:
    """Make ``EnvSpec(kind, kwargs)`` build ``factory(**kwargs)``."""
    _REGISTRY[kind] = factory


def get_env_factory(kind: str) -> EnvFactory:
    if kind not in _REGISTRY and kind in _BUILTINS:
        import importlib

        module, name = _BUILTINS[kind].split(":")
        _REGISTRY[kind] = getattr(importlib.import_module(module), name)
    if kind not in _REGISTRY:
        known = sorted(set(_REGISTRY) | set(_BUILTINS))
        raise KeyError(f"unknown env kind {kind!r}; registered: {known}")
    return _REGISTRY[kind]


def make_env(spec: EnvSpec) -> LudicEnv:
    """Build a fresh env from its spec."""
    return get_env_factory(spec.kind)(**spec.kwargs)
