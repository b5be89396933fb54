"""Lazy package exports: ``from ludic.agents import Agent`` works without importing torch until used.

A package's ``__init__`` declares ``{name: module}`` and takes ``__getattr__`` / ``__dir__`` from here;
the module is imported on first access of the name (PEP 562)."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def lazy_exports(package: str, names: dict[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``(__getattr__, __dir__)`` for ``package`` exporting ``names`` (name -> defining module)."""

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:  # the module's own names and the lazy ones
        return sorted(set(vars(sys.modules[package])) | set(names))

    return __getattr__, __dir__
