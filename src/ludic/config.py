"""Dataclass configs -> argparse CLIs, and config dumps into run directories.

Each command has one dataclass. Its fields become ``--kebab-case`` flags;
the string literal under a field (an attribute docstring) becomes the flag's
help. Booleans get ``--flag`` / ``--no-flag``; a tuple of floats is written
``0.9,0.999``. A field whose type is itself a dataclass is a *section*
shared by several commands (every training recipe embeds ``trainer:
TrainerConfig``): its fields become flags of their own names (``--lr``,
``--max-grad-norm``, ...), with the command's default instance as defaults.
Flag names must be unique across a command and its sections. The groups of
flags most commands share (model, LoRA, sampling, run) are *blocks*
(``ludic.recipes.blocks``): dataclasses a command config inherits, so their
fields stay the command's own attributes and flags; ``--help`` lists each
block and each section as one group. Every run writes its resolved config
(sections nested) as JSON into its run directory.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
import json
import textwrap
import typing
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")


def field_docs(cls: type) -> dict[str, str]:
    """Attribute docstrings of a dataclass (the string right after each field)."""
    docs: dict[str, str] = {}
    for klass in reversed(cls.__mro__):
        if not dataclasses.is_dataclass(klass):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError):
            continue
        body = tree.body[0].body  # type: ignore[attr-defined]
        for a, b in zip(body, body[1:]):
            if isinstance(a, ast.AnnAssign) and isinstance(a.target, ast.Name):
                if isinstance(b, ast.Expr) and isinstance(getattr(b, "value", None), ast.Constant):
                    if isinstance(b.value.value, str):
                        docs[a.target.id] = " ".join(b.value.value.split())
    return docs


def _base_type(tp: Any) -> tuple[type, bool]:
    """(scalar type, optional?) for int/float/str/bool and their ``| None`` forms."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return args[0], True
    return tp, False


def _default(f: dataclasses.Field) -> Any:
    return f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]


def _floats(text: str) -> tuple[float, ...]:
    return tuple(float(x) for x in text.split(",") if x.strip())


def _home(cls: type, name: str) -> type:
    """The block whose ``--help`` group lists field ``name`` of ``cls``: the most basic dataclass in its
    MRO that has the field (a command that only changes a block field's default still lists it under the
    block), or for a block that extends another block, that other block (one group for both)."""
    home = next((k for k in reversed(cls.__mro__)
                 if dataclasses.is_dataclass(k) and any(f.name == name for f in dataclasses.fields(k))), cls)
    while home is not cls:
        base = next((b for b in home.__bases__ if dataclasses.is_dataclass(b)), None)
        if base is None:
            break
        home = base
    return home


def _title(klass: type) -> str:
    return (klass.__doc__ or klass.__name__).strip().split("\n")[0].rstrip(".")


def add_dataclass_args(parser: argparse.ArgumentParser, cls: type, defaults: Any = None,
                       _seen: dict[str, str] | None = None, _groups: dict[type, Any] | None = None) -> None:
    """Add one flag per field of ``cls``, recursing into section fields. The command's own fields go
    into the parser's main group; each block it inherits and each section gets a group of its own,
    titled by the block's docstring (``ludic.recipes.blocks``)."""
    seen = {} if _seen is None else _seen
    groups: dict[type, Any] = {cls: parser} if _groups is None else _groups
    homes = {f.name: _home(cls, f.name) for f in dataclasses.fields(cls)}
    for klass in cls.__mro__[1:]:  # the blocks' groups, in the order the command lists the blocks
        if klass in homes.values() and klass not in groups:
            groups[klass] = parser.add_argument_group(_title(klass))
    docs = field_docs(cls)
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, optional = _base_type(hints[f.name])
        default = getattr(defaults, f.name) if defaults is not None else _default(f)
        if dataclasses.is_dataclass(tp):
            if tp not in groups:
                groups[tp] = parser.add_argument_group(_title(tp))
            add_dataclass_args(parser, tp, default, seen, groups)  # a section: flatten its fields
            continue
        if f.name in seen:
            raise TypeError(f"{cls.__name__}.{f.name}: flag --{f.name} is also defined by {seen[f.name]}")
        seen[f.name] = cls.__name__
        group = groups.get(homes[f.name], parser)
        flag = "--" + f.name.replace("_", "-")
        help_text = docs.get(f.name, "").replace("%", "%%")  # argparse %-formats help strings
        if tp is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=default,
                               help=help_text)
        elif tp in (int, float, str):
            conv = tp
            if optional:
                conv = lambda s, _t=tp: None if s.lower() in ("none", "") else _t(s)  # noqa: E731
            group.add_argument(flag, dest=f.name, type=conv, default=default,
                               help=f"{help_text} (default: {str(default).replace('%', '%%')})")
        elif typing.get_origin(tp) is tuple and all(a in (float, Ellipsis) for a in typing.get_args(tp)):
            group.add_argument(flag, dest=f.name, type=_floats, default=default,
                               help=f"{help_text} (comma-separated; default: {','.join(map(str, default))})")
        else:
            raise TypeError(f"{cls.__name__}.{f.name}: unsupported config type {hints[f.name]}")


def dataclass_from_args(cls: type[T], ns: argparse.Namespace) -> T:
    """Build ``cls`` (and its sections) from a flat namespace of flags."""
    hints = typing.get_type_hints(cls)
    values = {}
    for f in dataclasses.fields(cls):
        tp, _ = _base_type(hints[f.name])
        values[f.name] = dataclass_from_args(tp, ns) if dataclasses.is_dataclass(tp) else getattr(ns, f.name)
    return cls(**values)  # type: ignore[arg-type]


def parse_config(cls: type[T], argv: list[str] | None = None, prog: str | None = None,
                 defaults: dict[str, Any] | None = None) -> T:
    """Parse ``argv`` into ``cls``. ``defaults`` (field name -> value) replace the dataclass's own defaults,
    e.g. a mode's (flags given in ``argv`` still win). A command's ``--no-fast-path`` (a ``fast_path`` field,
    in the config or a section) turns Ludic's hand-written fast path off for the whole process (``ludic.fastpath``)."""
    parser = argparse.ArgumentParser(prog=prog, description=(cls.__doc__ or "").strip().split("\n")[0])
    add_dataclass_args(parser, cls)
    if defaults:
        unknown = sorted(set(defaults) - {a.dest for a in parser._actions})
        if unknown:
            raise ValueError(f"parse_config: {cls.__name__} has no field(s) {unknown} to take a default for")
        parser.set_defaults(**defaults)
    cfg = dataclass_from_args(cls, parser.parse_args(argv))
    if not _fast_path(cfg):
        from ludic import fastpath

        fastpath.set_off()
    return cfg


def _fast_path(cfg: Any) -> bool:
    """False when ``cfg`` or one of its sections sets ``fast_path=False``."""
    if getattr(cfg, "fast_path", True) is False:
        return False
    return all(_fast_path(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)
               if dataclasses.is_dataclass(getattr(cfg, f.name)))


def dump_config(cfg: Any, path: str | Path) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(dataclasses.asdict(cfg), indent=2, default=str))


def to_argv(cfg: Any) -> list[str]:
    """Flags that ``parse_config(type(cfg), ...)`` turns back into ``cfg`` (sections flattened):
    how a process hands its configuration to the processes it starts."""
    argv: list[str] = []
    hints = typing.get_type_hints(type(cfg))
    for f in dataclasses.fields(cfg):
        value = getattr(cfg, f.name)
        tp, _ = _base_type(hints[f.name])
        if dataclasses.is_dataclass(tp):
            argv += to_argv(value)
            continue
        flag = "--" + f.name.replace("_", "-")
        if tp is bool:
            argv.append(flag if value else "--no-" + f.name.replace("_", "-"))
        elif isinstance(value, tuple):
            argv += [flag, ",".join(map(str, value))]
        else:
            argv += [flag, "none" if value is None else str(value)]
    return argv
