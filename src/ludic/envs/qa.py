"""Question answering and math: ``QAEnv`` (one question), ``DatasetQAEnv`` (a dataset row by seed),
pluggable graders, answer parsers, dataset loaders and an offline arithmetic word-problem set.

Graders (``GRADERS``, ``grade(name, predicted, reference)``):
    ``exact``    case-, space- and trailing-period-insensitive string equality
    ``numeric``  numbers equal within a tolerance (commas, ``$``, ``%`` and ``a/b`` read)
    ``math``     symbolic equivalence through ``math-verify`` (``0.5`` = ``1/2``, ``\\boxed{}`` read),
                 with the numeric grader as a fallback when math-verify cannot parse either side

Answer parsers (``make_answer_parser``) turn the model's reply into the answer string
the env grades. The recipe (``ludic train qa``), ``ludic eval qa`` and the GSM8K examples
all build theirs here by name, so training and evaluation read answers the same way.

Sources (``load_qa_records``):
    ``arith``                  generated word problems with known answers (offline; split train/test)
    ``path.jsonl``             records with ``question`` / ``answer`` fields (names configurable)
    ``path.parquet``           the same, through ``datasets``
    ``openai/gsm8k[:config]``  a hub dataset through ``datasets`` (GSM8K's ``#### 72`` answers are read)
"""

from __future__ import annotations

import ast
import functools
import math
import operator
import random
import re
from fractions import Fraction
from pathlib import Path
from typing import Callable

from ludic.data.jsonl import DatasetError, read_jsonl
from ludic.envs.base import SingleAgentEnv
from ludic.envs.registry import Registry
from ludic.errors import stage
from ludic.parsers import ParseResult, Parser, extract_last_boxed, hedged
from ludic.types import JSON, StepOutcome

# ---------------------------------------------------------------------------------------------
# Graders
# ---------------------------------------------------------------------------------------------

Grader = Callable[[str, str], bool]
"""``(predicted, reference) -> correct``."""

_NUM = r"[-+]?\$?\s*(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?%?|[-+]?\.\d+"


def parse_number(text: str) -> float | None:
    """A number from an answer string: ``1,000`` -> 1000, ``$3.50`` -> 3.5, ``50%`` -> 50, ``3/4`` -> 0.75."""
    t = text.strip().rstrip(".").replace("\\$", "").replace("$", "").replace("\\%", "%").strip()
    boxed = extract_last_boxed(t)
    if boxed is not None:
        t = boxed.strip()
    m = re.fullmatch(r"\\?d?frac\{([^{}]+)\}\{([^{}]+)\}|(-?\d+)\s*/\s*(\d+)", t.replace(" ", ""))
    try:
        if m and m.group(1) is not None:
            return float(Fraction(m.group(1)) / Fraction(m.group(2)))
        if m:
            return float(Fraction(int(m.group(3)), int(m.group(4))))
        return float(t.replace(",", "").rstrip("%"))
    except (ValueError, ZeroDivisionError):
        return None


def normalize_text(text: str) -> str:
    return re.sub(r"\s+", " ", text.strip().rstrip(".").strip().lower())


def exact_grader(predicted: str, reference: str) -> bool:
    return normalize_text(predicted) == normalize_text(reference)


def numeric_grader(predicted: str, reference: str, rel_tol: float = 1e-6, abs_tol: float = 1e-6) -> bool:
    a, b = parse_number(predicted), parse_number(reference)
    return a is not None and b is not None and math.isclose(a, b, rel_tol=rel_tol, abs_tol=abs_tol)


def _for_math_verify(text: str) -> str:
    t = text.strip()
    return f"${t}$" if "\\" in t and "$" not in t else t


def math_grader(predicted: str, reference: str) -> bool:
    """Symbolic equivalence via math-verify (``pip install math-verify``), numeric as a fallback."""
    try:
        from math_verify import parse, verify
    except ImportError as e:
        raise ImportError("the 'math' grader needs math-verify: pip install 'ludic[qa]'") from e
    gold, pred = parse(_for_math_verify(reference)), parse(_for_math_verify(predicted))
    if gold and pred:
        return bool(verify(gold, pred))
    return numeric_grader(predicted, reference)


GRADERS: Registry[Grader] = Registry("grader", {
    "exact": "ludic.envs.qa:exact_grader",
    "numeric": "ludic.envs.qa:numeric_grader",
    "math": "ludic.envs.qa:math_grader",
})


def grade(grader: str, predicted: str, reference: str) -> bool:
    return bool(GRADERS.get(grader)(predicted, reference))


# ---------------------------------------------------------------------------------------------
# Answer parsers
# ---------------------------------------------------------------------------------------------

_FEEDBACK = "Give the final answer as a number."


def extract_answer(text: str, style: str = "auto") -> str | None:
    """The final answer in a reply, or None.

    ``boxed``: the last ``\\boxed{}``; ``hash``: after the last ``####``; ``number``: the last number;
    ``auto``: boxed, then ``####``, then ``answer is``/``Final Answer:``, then the last number.
    """
    if style in ("boxed", "auto"):
        b = extract_last_boxed(text)
        if b is not None and b.strip():
            return b.strip()
        if style == "boxed":
            return None
    if style in ("hash", "auto") and "####" in text:
        ans = text.rsplit("####", 1)[1].strip().splitlines()
        if ans and ans[0].strip():
            return ans[0].strip()
    if style == "hash":
        return None
    if style == "auto":
        m = list(re.finditer(r"(?:final answer|answer is|answer:)\s*:?\s*(" + _NUM + ")", text, re.IGNORECASE))
        if m:
            return m[-1].group(1).replace(" ", "")
    nums = re.findall(_NUM, text)
    return nums[-1].replace(" ", "") if nums else None


def make_answer_parser(style: str = "auto", error_reward: float = 0.0) -> Parser:
    """A parser returning the extracted answer (``extract_answer``); no answer is a parse failure."""
    if style not in ("auto", "boxed", "hash", "number"):
        raise ValueError(f"unknown answer style {style!r}: expected auto, boxed, hash or number")

    def parse(raw: str) -> ParseResult:
        ans = extract_answer(raw, style)
        return ParseResult(None, error_reward, _FEEDBACK) if ans is None else ParseResult(ans, 0.0, None)

    parse.__name__ = f"answer_parser_{style}"
    return parse


# ---------------------------------------------------------------------------------------------
# Envs
# ---------------------------------------------------------------------------------------------


class QAEnv(SingleAgentEnv):
    """One question, one graded answer: reward 1 when correct, else 0.

    Args:
        question, answer: the record (``answer`` is the reference, e.g. ``"72"``).
        grader: a ``GRADERS`` name.
        template: how the question is shown (``{question}`` is replaced).
        id: the record's id, copied into the step info.
    """

    def __init__(self, question: str, answer: str, grader: str = "math", template: str = "{question}",
                 id: str | None = None, agent_id: str = "agent_0") -> None:
        super().__init__(agent_id)
        GRADERS.get(grader)  # an unknown grader fails at construction, not at the first answer
        self.question, self.answer, self.grader, self.template, self.id = question, str(answer), grader, template, id

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        return self.template.format(question=self.question), {"id": self.id, "instance": self.question}

    def env_step(self, action: str) -> StepOutcome:
        hedge = hedged(action, self.answer)  # several numbers for a one-number reference: wrong, whatever the grader
        with stage("reward"):
            ok = not hedge and grade(self.grader, action, self.answer)
        info = {"id": self.id, "correct": ok, "reference": self.answer, "predicted": action, "grader": self.grader,
                "hedged": hedge}
        return StepOutcome("", float(ok), terminated=True, info=info)


class DatasetQAEnv(QAEnv):
    """A row of a QA dataset (``load_qa_records``): ``index`` when given, else ``seed % len``.

    The dataset is loaded once per process and source; requests stay small
    (``EnvSpec("dataset_qa", {"source": "arith", "split": "test", "index": 3})``).
    """

    def __init__(self, source: str, split: str = "train", index: int | None = None, grader: str = "math",
                 template: str = "{question}", question_key: str = "question", answer_key: str = "answer",
                 agent_id: str = "agent_0") -> None:
        self.records = load_qa_records(source, split, question_key, answer_key)
        self.index = index
        r = self.records[(index or 0) % len(self.records)]
        super().__init__(r["question"], r["answer"], grader, template, r["id"], agent_id)

    def env_reset(self, seed: int | None = None) -> tuple[str, JSON]:
        if self.index is None:
            r = self.records[(seed or 0) % len(self.records)]
            self.question, self.answer, self.id = r["question"], r["answer"], r["id"]
        return super().env_reset(seed)


# ---------------------------------------------------------------------------------------------
# Datasets
# ---------------------------------------------------------------------------------------------


def gsm8k_answer(text: str) -> str:
    """GSM8K's reference: the text after the last ``####``, commas removed (``"... #### 1,000"`` -> ``1000``)."""
    return text.rsplit("####", 1)[1].strip().replace(",", "") if "####" in text else text.strip()


def _rows(source: str, split: str) -> tuple[list[dict], str]:
    """(rows, where) for a file or hub source; ``where`` names it in errors."""
    path = Path(source)
    if path.suffix == ".jsonl":
        return read_jsonl(path), str(path)
    try:
        import datasets
    except ImportError as e:
        raise ImportError(f"reading {source} needs the datasets package: pip install 'ludic[qa]'") from e
    if path.suffix == ".parquet":
        if not path.exists():
            raise FileNotFoundError(f"QA dataset {path} does not exist")
        ds = datasets.load_dataset("parquet", data_files=str(path), split="train")
        return [dict(r) for r in ds], str(path)
    name, _, config = source.partition(":")
    if name == "openai/gsm8k" and not config:
        config = "main"
    ds = datasets.load_dataset(name, config or None, split=split)
    return [dict(r) for r in ds], f"{source} ({split})"


@functools.lru_cache(maxsize=16)
def _load(source: str, split: str, question_key: str, answer_key: str) -> tuple[dict, ...]:
    if source == "arith" or source.startswith("arith:"):
        n = int(source.partition(":")[2] or 0) or None
        return tuple(arithmetic_problems(split, n))
    rows, where = _rows(source, split)
    out = []
    for i, row in enumerate(rows):
        line = f"{where}:{i + 1}" if where.endswith(".jsonl") else f"{where}: record {i}"
        for key in (question_key, answer_key):
            if key not in row or row[key] is None or str(row[key]).strip() == "":
                raise DatasetError(f"{line}: missing field {key!r} (fields: {sorted(row)})")
        out.append({"id": str(row.get("id", f"{Path(source).stem}-{split}-{i}")),
                    "question": str(row[question_key]), "answer": gsm8k_answer(str(row[answer_key]))})
    if not out:
        raise DatasetError(f"{where}: no records")
    return tuple(out)


def load_qa_records(source: str, split: str = "train", question_key: str = "question",
                    answer_key: str = "answer", limit: int | None = None) -> list[dict]:
    """Records ``{"id", "question", "answer"}`` of a source (module doc); answers normalised."""
    records = list(_load(source, split, question_key, answer_key))
    return records[:limit] if limit else records


_NAMES = ["Ana", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jia", "Kai", "Lea", "Mo", "Nia"]
_ITEMS = ["apples", "books", "coins", "stickers", "marbles", "pencils", "cards", "shells", "cookies", "stamps"]


def _problem(rng: random.Random) -> tuple[str, int, str]:
    """(question, answer, expression) of one generated word problem."""
    name, item = rng.choice(_NAMES), rng.choice(_ITEMS)
    kind = rng.randrange(6)
    a, b = rng.randint(2, 20), rng.randint(2, 20)
    if kind == 0:
        return f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?", a + b, f"{a}+{b}"
    if kind == 1:
        a, b = max(a, b) + rng.randint(1, 9), min(a, b)
        return f"{name} has {a} {item} and gives {b} away. How many {item} are left?", a - b, f"{a}-{b}"
    if kind == 2:
        a, b = rng.randint(2, 9), rng.randint(2, 9)
        return f"{name} buys {a} boxes with {b} {item} in each box. How many {item} is that?", a * b, f"{a}*{b}"
    if kind == 3:
        b, q = rng.randint(2, 6), rng.randint(2, 9)
        return (f"{name} shares {b * q} {item} equally among {b} friends. How many {item} does each friend get?",
                q, f"{b * q}/{b}")
    c = rng.randint(1, a + b - 1)
    if kind == 4:
        return (f"{name} has {a} {item}, finds {b} more, then loses {c}. How many {item} does {name} have?",
                a + b - c, f"{a}+{b}-{c}")
    a, b = rng.randint(2, 6), rng.randint(2, 6)
    c = rng.randint(1, 9)
    return (f"{name} has {a} bags of {b} {item} and {c} loose {item}. How many {item} in total?",
            a * b + c, f"{a}*{b}+{c}")


def arithmetic_problems(split: str = "train", n: int | None = None) -> list[dict]:
    """Generated arithmetic word problems with known integer answers (offline, deterministic).

    ``train`` (default 2,000) and ``test`` (default 200) never share a question.
    Records also carry ``expression`` (for the calculator tool variant).
    """
    if split not in ("train", "test"):
        raise ValueError(f"arithmetic problems have splits train and test, not {split!r}")
    test_rng, test = random.Random(7_001), {}
    n_test = max(200, n or 0) if split == "test" else 200
    while len(test) < n_test:
        q, a, e = _problem(test_rng)
        test.setdefault(q, (a, e))
    if split == "test":
        items = list(test.items())[: n or 200]
    else:
        rng, seen = random.Random(1_001), {}
        while len(seen) < (n or 2000):
            q, a, e = _problem(rng)
            if q not in test:
                seen.setdefault(q, (a, e))
        items = list(seen.items())
    return [{"id": f"arith-{split}-{i}", "question": q, "answer": str(a), "expression": e}
            for i, (q, (a, e)) in enumerate(items)]


CALC_MAX_CHARS = 200
"""Longest expression the calculator reads."""
CALC_MAX_DIGITS = 30
"""Most digits in one number, written or computed: a sampled call never starts a big-integer computation."""
_CALC_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / and parentheses.

    Args:
        expression: for example "3*(4+5)".
    """
    # A model's tool call is untrusted input: the expression is parsed and checked whole (numbers of at
    # most CALC_MAX_DIGITS digits, + - * /, unary minus and plus, parentheses) before any arithmetic,
    # and every intermediate value is bounded too. No eval: ``9**9**9**9`` would hold the GIL for
    # good, and a tool timeout cannot stop a thread.
    if re.search(r"\d{%d}" % (CALC_MAX_DIGITS + 1), expression):
        raise ValueError(f"a number has more than {CALC_MAX_DIGITS} digits")
    if len(expression) > CALC_MAX_CHARS:
        raise ValueError(f"expression too long: {len(expression)} characters (at most {CALC_MAX_CHARS})")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression ({e.msg}): only numbers and + - * / ( ) are allowed") from None
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant):
            if type(node.value) not in (int, float):
                raise ValueError(f"only numbers and + - * / ( ) are allowed, got {node.value!r}")
            _check_size(node.value)
        elif isinstance(node, ast.BinOp) and type(node.op) not in _CALC_OPS or \
                isinstance(node, ast.UnaryOp) and not isinstance(node.op, (ast.USub, ast.UAdd)):
            op = type(getattr(node, "op", node)).__name__
            raise ValueError(f"operator {op} is not allowed: only numbers and + - * / ( ) are allowed")
        elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.operator, ast.unaryop)):
            raise ValueError(f"only numbers and + - * / ( ) are allowed, got {type(node).__name__}")
    value = _calc(tree.body)
    return str(int(value)) if float(value).is_integer() else f"{value:.6g}"


def _check_size(x: int | float) -> None:
    if not math.isfinite(x) or abs(x) >= 10 ** CALC_MAX_DIGITS:
        raise ValueError(f"a number has more than {CALC_MAX_DIGITS} digits")


def _calc(node: ast.AST) -> int | float:
    """The value of a checked expression tree, every step bounded (``_check_size``)."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp):
        x = _calc(node.operand)
        return -x if isinstance(node.op, ast.USub) else x
    a, b = _calc(node.left), _calc(node.right)  # type: ignore[attr-defined]
    if isinstance(node.op, ast.Div) and b == 0:  # type: ignore[attr-defined]
        raise ValueError("division by zero")
    out = _CALC_OPS[type(node.op)](a, b)  # type: ignore[attr-defined]
    _check_size(out)
    return out


__all__ = [
    "DatasetQAEnv", "GRADERS", "QAEnv", "arithmetic_problems", "calculator", "exact_grader", "extract_answer",
    "grade", "gsm8k_answer", "load_qa_records", "make_answer_parser", "math_grader", "numeric_grader",
    "parse_number",
]
