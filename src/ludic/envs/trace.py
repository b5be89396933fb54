"""The code-trace task: predict a program's exact stdout, debug prints included.

A task is a Python program plus its stdin. Up to 6 debug prints tagged ``__DBG_<k>__`` are
injected (``inject_prints``, seeded by the task id): after assignments and ``if`` statements,
each printing 1-3 variables that are live there. The agent must reproduce the program's stdout;
an answer is compared with the true output after thinking blocks are stripped, the first fenced
block taken, and all whitespace removed and case folded (``score_answer``).

Programs come from ``generate_program`` (a procedural generator of small deterministic programs,
so everything runs offline) or from JSONL records with ``program`` and ``inputs``
(``load_trace_records``). The true output comes from running the injected program in the
sandbox (``ludic.envs.sandbox``: timeout, memory cap, process cap, no network, a temporary
directory); a program that fails there is a ``TraceProgramError`` naming the task.
"""

from __future__ import annotations

import ast
import random
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

from ludic.envs.base import SingleAgentEnv
from ludic.types import JSON, StepOutcome

MAX_PRINTS = 6
PROMPT = (
    "Predict the exact and complete standard output (stdout) of the following Python program, including every "
    "single print statement.\n\nThe program contains injected debug prints starting with '__DBG_' that must "
    "appear exactly as printed, together with all other output.\n\nProgram:\n```python\n{program}\n```\n\n"
    "Input (stdin):\n```\n{inputs}\n```\n\nProvide the full stdout content. Do not provide any explanations or "
    "commentary outside of the predicted output."
)


class TraceProgramError(RuntimeError):
    """A trace program that does not run to completion in the sandbox."""


# --------------------------------------------------------------------------- print injection
_SIMPLE = "(int, float, str, bool, type(None))"


def _debug_print(tag: str, names: Sequence[str]) -> ast.stmt:
    shown = ", ".join(f"(repr({v}) if isinstance({v}, {_SIMPLE}) else type({v}).__name__)" for v in names)
    return ast.parse(f"print({tag!r}, {shown})").body[0]


def _targets(node: ast.AST) -> list[str]:
    """Plain names bound by an assignment target (tuples unpacked; attributes and subscripts skipped)."""
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, (ast.Tuple, ast.List)):
        return [n for elt in node.elts for n in _targets(elt)]
    return []


class _Injector:
    def __init__(self, seed: int, max_prints: int, p_assign: float, p_if: float) -> None:
        self.rng = random.Random(seed)
        self.max_prints, self.p_assign, self.p_if = max_prints, p_assign, p_if
        self.count = 0

    def _maybe(self, p: float, live: list[str], out: list[ast.stmt]) -> None:
        if self.count >= self.max_prints or not live or self.rng.random() >= p:
            return
        k = self.rng.randint(1, min(3, len(live)))
        out.append(_debug_print(f"__DBG_{self.count}__", self.rng.sample(live, k)))
        self.count += 1

    def block(self, stmts: list[ast.stmt], live: list[str]) -> list[ast.stmt]:
        """Rewrite one block; ``live`` are names bound before it on every path (not changed here)."""
        live = list(live)
        out: list[ast.stmt] = []
        for st in stmts:
            if isinstance(st, ast.FunctionDef):
                args = [a.arg for a in st.args.posonlyargs + st.args.args + st.args.kwonlyargs]
                st.body = self.block(st.body, args)
                out.append(st)
                live = _add(live, [st.name])
                continue
            if isinstance(st, (ast.For, ast.AsyncFor)):
                st.body = self.block(st.body, _add(live, _targets(st.target)))
                st.orelse = self.block(st.orelse, live)
            elif isinstance(st, ast.While):
                st.body = self.block(st.body, live)
                st.orelse = self.block(st.orelse, live)
            elif isinstance(st, ast.If):
                st.body = self.block(st.body, live)
                st.orelse = self.block(st.orelse, live)
            elif isinstance(st, ast.With):
                st.body = self.block(st.body, live)
            out.append(st)
            if isinstance(st, ast.Assign):
                live = _add(live, [n for t in st.targets for n in _targets(t)])
                self._maybe(self.p_assign, live, out)
            elif isinstance(st, (ast.AugAssign, ast.AnnAssign)) and st.value is not None:
                live = _add(live, _targets(st.target))
                self._maybe(self.p_assign, live, out)
            elif isinstance(st, ast.If):
                self._maybe(self.p_if, live, out)
        return out


def _add(live: list[str], names: Sequence[str]) -> list[str]:
    return live + [n for n in names if n not in live]


def strip_fences(code: str) -> str:
    """The code inside a markdown fence, if the text is fenced."""
    m = re.search(r"```(?:python|py)?\s*\n(.*?)```", code, re.DOTALL)
    return m.group(1) if m else code


def inject_prints(program: str, seed: int, max_prints: int = MAX_PRINTS, p_assign: float = 0.6,
                  p_if: float = 0.4) -> str:
    """``program`` with up to ``max_prints`` ``__DBG_<k>__`` prints (deterministic in ``seed``)."""
    tree = ast.parse(strip_fences(program))
    tree.body = _Injector(seed, max_prints, p_assign, p_if).block(tree.body, [])
    return ast.unparse(ast.fix_missing_locations(tree))


# ------------------------------------------------------------------------------- scoring
_THINK_BLOCK = re.compile(r"<(think|thinking)>.*?</\1>", re.DOTALL | re.IGNORECASE)
_DANGLING_CLOSE = re.compile(r"^.*</(think|thinking)>", re.DOTALL | re.IGNORECASE)
_FENCE = re.compile(r"```[^\n`]*\n?(.*?)```", re.DOTALL)


def answer_text(answer: str) -> str:
    """The predicted output in an answer: thinking removed, the first fenced block if any."""
    text = _THINK_BLOCK.sub("", answer)
    text = _DANGLING_CLOSE.sub("", text)
    m = _FENCE.search(text)
    return m.group(1) if m else text


def normalise(text: str) -> str:
    """All whitespace removed, lower-cased: the comparison the task uses."""
    return re.sub(r"\s+", "", text).lower()


def score_answer(answer: str, expected: str) -> float:
    """1.0 when the answer's output equals the expected stdout up to whitespace and case; an empty answer scores 0."""
    got = normalise(answer_text(answer))
    return float(bool(got) and got == normalise(expected))


# ----------------------------------------------------------------------------- programs
_WORDS = ("ab", "cd", "x", "yz", "q", "mn", "op", "rs")


def generate_program(task_id: int) -> tuple[str, str]:
    """A small deterministic program reading two lines of stdin, and that stdin (seeded by ``task_id``)."""
    rng = random.Random(int(task_id))
    n = rng.randint(3, 7)
    nums = [rng.randint(-9, 20) for _ in range(n)]
    lines = ["n = int(input())", "nums = list(map(int, input().split()))"]
    blocks = rng.sample(range(8), rng.randint(3, 5))
    for b in blocks:
        a, c = rng.randint(2, 5), rng.randint(5, 30)
        if b == 0:
            lines += ["total = 0", "for x in nums:", f"    if x % {a} == 0:", "        total += x", "    else:",
                      "        total -= 1", "print(total)"]
        elif b == 1:
            lines += ["best = nums[0]", "for x in nums[1:]:", "    if x > best:", "        best = x", "print(best)"]
        elif b == 2:
            lines += ["i = 0", "acc = 1", f"while i < n and acc < {c * 10}:", f"    acc = acc * {a} + nums[i % len(nums)]",
                      "    i += 1", "print(i, acc)"]
        elif b == 3:
            lines += ["def f(a, b):", f"    c = a * b - {a}", f"    if c > {c}:", "        return c // 2",
                      "    return c + b", "r = f(n, nums[-1])", "print(r)"]
        elif b == 4:
            words = rng.sample(_WORDS, 3)
            lines += [f"words = {words!r}", "s = ''", "for k in range(n):", "    s += words[k % len(words)]",
                      "print(s)"]
        elif b == 5:
            lines += ["counts = {}", "for x in nums:", f"    key = x % {a}", "    counts[key] = counts.get(key, 0) + 1",
                      "print(sorted(counts.items()))"]
        elif b == 6:
            lines += [f"picked = [x for x in nums if x > {a}]", "print(len(picked), sum(picked))"]
        else:
            lines += ["m = n + 1", "steps = 0", "while m != 1 and steps < 30:", "    if m % 2 == 0:", "        m = m // 2",
                      "    else:", "        m = 3 * m + 1", "    steps += 1", "print(steps)"]
    return "\n".join(lines) + "\n", f"{n}\n{' '.join(map(str, nums))}\n"


def load_trace_records(path: str | Path) -> list[dict[str, str]]:
    """JSONL records with string fields ``program`` and ``inputs``; a bad line names its file and line
    (``read_jsonl``)."""
    from ludic.data.jsonl import DatasetError, read_jsonl

    def check(rec: dict) -> str | None:
        if not isinstance(rec.get("program"), str) or not isinstance(rec.get("inputs", ""), str):
            return "a trace record needs 'program' (string) and 'inputs' (string)"
        return None

    out = [{"program": r["program"], "inputs": r.get("inputs", "")} for r in read_jsonl(path, validate=check)]
    if not out:
        raise DatasetError(f"{path}: no trace records")
    return out


@dataclass(frozen=True)
class TraceTask:
    task_id: int
    program: str
    """The program as shown, debug prints injected."""
    inputs: str
    expected: str
    """Its stdout, stripped."""

    @property
    def prompt(self) -> str:
        return PROMPT.format(program=self.program, inputs=self.inputs.rstrip("\n"))


def make_task(task_id: int, records: Sequence[dict[str, str]] | None = None, *, timeout_s: float = 10.0,
              memory_mb: int = 512) -> TraceTask:
    """Task ``task_id``: record ``task_id % len(records)`` (or a generated program), prints injected
    with seed ``task_id``, expected output from the sandbox."""
    from ludic.envs.sandbox import run_python

    if records:
        rec = records[task_id % len(records)]
        source, inputs = rec["program"], rec["inputs"]
    else:
        source, inputs = generate_program(task_id)
    try:
        program = inject_prints(source, task_id)
    except SyntaxError as e:
        raise TraceProgramError(f"trace task {task_id}: the program does not parse ({e})") from e
    result = run_python(program, inputs, timeout_s=timeout_s, memory_mb=memory_mb)
    if not result.ok:
        raise TraceProgramError(f"trace task {task_id}: the program failed in the sandbox ({result.reason}): "
                                f"{result.stderr.strip()[-300:]}")
    return TraceTask(task_id, program, inputs, result.stdout.strip())


class TraceEnv(SingleAgentEnv):
    """One turn: the program and stdin in, the predicted stdout out; reward = score (1 or 0).

    Args:
        task_id: a fixed task; None draws one from the reset seed (``seed % 10**8``).
        records_path: a JSONL file of ``program`` / ``inputs`` records (default: generated programs).
        timeout_s, memory_mb: the sandbox's limits for the ground truth run.
    """

    def __init__(self, task_id: int | None = None, records_path: str | None = None, timeout_s: float = 10.0,
                 memory_mb: int = 512, agent_id: str = "agent_0") -> None:
        super().__init__(agent_id)
        self.task_id, self.timeout_s, self.memory_mb = task_id, timeout_s, memory_mb
        self.records = load_trace_records(records_path) if records_path else None
        self.task: TraceTask | None = None

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        tid = self.task_id if self.task_id is not None else (0 if seed is None else int(seed) % 10**8)
        self.task = make_task(tid, self.records, timeout_s=self.timeout_s, memory_mb=self.memory_mb)
        return self.task.prompt, {"task_id": tid}

    def env_step(self, action: str) -> StepOutcome:
        assert self.task is not None
        score = score_answer(action, self.task.expected)
        info: dict[str, Any] = {"score": score, "success": score > 0, "test_result": f"{int(score)}/1",
                                "task_id": self.task.task_id}
        return StepOutcome("Correct." if score else "Incorrect.", score, terminated=True, info=info)
