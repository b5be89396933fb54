"""The package's shape: no import circles between Ludic's modules.

Every ``import`` of a ``ludic`` module counts, at module level or inside a function (a lazy import
still makes a module depend on another: read the two together, or a change to one breaks the
other at run time), except those under ``if TYPE_CHECKING:`` (annotations only). A name imported
from a package resolves to the submodule it names, or, for a package with lazy exports
(``ludic._lazy``), to the module the name comes from.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"


def _modules() -> dict[str, Path]:
    out = {}
    for p in (SRC / "ludic").rglob("*.py"):
        name = ".".join(p.relative_to(SRC).with_suffix("").parts)
        out[name.removesuffix(".__init__")] = p
    return out


def _lazy_exports(package: str) -> dict[str, str]:
    """``_EXPORTS`` of a package using ``ludic._lazy`` (name -> module), else {}."""
    try:
        return dict(getattr(importlib.import_module(package), "_EXPORTS", {}) or {})
    except Exception:  # a package that needs an optional dependency: no lazy map to read
        return {}


def _imports(tree: ast.AST):
    """Import nodes, skipping the bodies of ``if TYPE_CHECKING:``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for other in node.orelse:
                yield from _imports(other)
            continue
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            yield node
        yield from _imports(node)


def import_graph() -> dict[str, set[str]]:
    mods = _modules()
    lazy: dict[str, dict[str, str]] = {}

    def owner(name: str) -> str | None:
        while name and name not in mods:
            name = name.rpartition(".")[0]
        return name or None

    graph: dict[str, set[str]] = {m: set() for m in mods}
    for mod, path in mods.items():
        is_pkg = path.name == "__init__.py"
        for node in _imports(ast.parse(path.read_text())):
            targets = []
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                base = node.module or ""
                if node.level:
                    parts = mod.split(".")[: len(mod.split(".")) - node.level + (1 if is_pkg else 0)]
                    base = ".".join(parts + ([base] if base else []))
                for a in node.names:
                    full = f"{base}.{a.name}"
                    if full in mods:
                        targets.append(full)
                    elif base in mods and mods[base].name == "__init__.py":
                        exports = lazy.setdefault(base, _lazy_exports(base))
                        targets.append(exports.get(a.name, base))
                    else:
                        targets.append(base)
            for t in targets:
                o = owner(t) if t.startswith("ludic") else None
                if o and o != mod:
                    graph[mod].add(o)
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_the_checker_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_import_circles():
    graph = import_graph()
    assert len(graph) > 100 and any(graph.values())
    found = circles(graph)
    assert not found, "import circles (each a group of modules that import each other):\n" + "\n".join(
        " <-> ".join(c) for c in found)


def test_the_game_packages_sit_on_top_of_the_generic_library():
    """``ludic.tictactoe`` is one game's folder on the generic pieces: no generic package imports it (the
    registries name its envs by string), so the library reads and runs without it."""
    graph = import_graph()
    generic = ("envs", "agents", "context", "interaction", "rollouts", "training", "inference", "pipeline",
               "recipes", "data", "eval")
    wrong = sorted(f"{m} -> {t}" for m, targets in graph.items() if m.split(".")[1:2] and m.split(".")[1] in generic
                   for t in targets if t.startswith("ludic.tictactoe"))
    assert not wrong, "generic modules import the tic-tac-toe package:\n" + "\n".join(wrong)


def test_every_module_is_under_500_lines_unless_its_docstring_says_why():
    long = []
    for path in sorted((SRC / "ludic").rglob("*.py")):
        text = path.read_text()
        if text.count("\n") > 500 and "over 500 lines" not in text[:3000]:
            long.append(f"{path.relative_to(SRC)}: {text.count(chr(10))} lines")
    assert not long, "modules over 500 lines whose docstring does not say why:\n" + "\n".join(long)
