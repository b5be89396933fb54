"""What a newcomer types: the public names import from ``ludic`` and its packages (lazily: a bare import
loads no torch), every import line of the README, the documentation pages and the examples works, and the
README's own-env example trains on the tiny model in one call."""

import ast
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(code, **env):
    return subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, **env})


def test_public_names_import_lazily():
    code = ("import sys, ludic, ludic.agents, ludic.envs, ludic.training, ludic.rollouts, ludic.interaction\n"
            "assert 'torch' not in sys.modules and 'transformers' not in sys.modules, 'a bare import loaded torch'\n"
            "from ludic.agents import Agent, ToolAgent, ReActAgent\n"
            "from ludic.envs import LudicEnv, SingleAgentEnv, register_env, TextArenaEnv, ReasoningGymEnv, GymTextEnv\n"
            "from ludic.training import Trainer, TrainerConfig, make_algorithm, load_policy, LoraSettings\n"
            "from ludic.rollouts import RolloutEngine, RolloutBatchSource, GRPORequestStrategy\n"
            "from ludic import train, TrainResult, Agent as A2, Trainer as T2, StepOutcome, SingleAgentEnv as S2\n"
            "import ludic\n"
            "missing = [n for n in ludic.__all__ if not hasattr(ludic, n)]\n"
            "assert not missing, missing\n"
            "for pkg in (ludic.agents, ludic.envs, ludic.training, ludic.rollouts):\n"
            "    bad = [n for n in pkg.__all__ if not hasattr(pkg, n)]\n"
            "    assert not bad, (pkg.__name__, bad)\n")
    proc = _run(code)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _import_lines(text):
    """Every import statement of ludic (or of the examples' own modules) in a text, one per statement."""
    out = []
    for block in re.findall(r"```(?:python|py)?\n(.*?)```", text, re.DOTALL) if "```" in text else [text]:
        try:
            tree = ast.parse(block)
        except SyntaxError:
            continue  # shell blocks
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("ludic"):
                out.append(ast.unparse(node))
            elif isinstance(node, ast.Import) and any(a.name.startswith("ludic") for a in node.names):
                out.append(ast.unparse(node))
    return out


def test_every_import_in_the_readme_the_docs_and_the_examples_works():
    sources = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").rglob("*.py")),
               *sorted((ROOT / "examples").rglob("*.md"))]
    lines = sorted({line for p in sources for line in _import_lines(p.read_text())})
    assert len(lines) >= 10, lines
    code = "\n".join(f"try:\n    {line}\nexcept Exception as e:\n    bad.append(({line!r}, repr(e)))" for line in lines)
    proc = _run("bad = []\n" + code + "\nassert not bad, bad\n")
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.slow
def test_the_readme_own_env_example_trains_on_the_tiny_model(tiny_model_dir, tmp_path):
    """The README shows examples/own_env/guess.py verbatim; run as a user would (two steps, tiny model): it
    evaluates, runs the format cold start, trains, evaluates, and writes its report."""
    example = (ROOT / "examples" / "own_env" / "guess.py").read_text()
    assert example.strip() in (ROOT / "README.md").read_text(), "README's example differs from examples/own_env/guess.py"
    proc = subprocess.run([sys.executable, str(ROOT / "examples" / "own_env" / "guess.py")], cwd=tmp_path,
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "MODEL": str(tiny_model_dir), "STEPS": "2"})
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert re.search(r"success \d+\.\d% -> \d+\.\d%; report: ", proc.stdout), proc.stdout[-2000:]
    (run,) = (tmp_path / "runs").iterdir()
    assert (run / "report.html").exists() and (run / "summary.json").exists() and (run / "final").is_dir()
    assert "format demos" in proc.stdout
