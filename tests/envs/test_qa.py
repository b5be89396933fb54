"""QA envs: grading equivalences, answer parsing, dataset loading errors, the offline arithmetic set,
and one parser for training and evaluation, checked through the two command-line paths."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ludic.data.jsonl import DatasetError
from ludic.envs.qa import (
    DatasetQAEnv, QAEnv, arithmetic_problems, calculator, extract_answer, grade, gsm8k_answer, load_qa_records,
    parse_number,
)
from ludic.recipes.qa import pass_at_k

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("pred, ref", [
    ("0.5", "1/2"), ("1/2", "0.5"), ("\\frac{1}{2}", "0.5"), ("\\boxed{\\frac{1}{2}}", "0.5"),
    ("1,000", "1000"), ("$1,000", "1000"), ("72.0", "72"), ("\\boxed{72}", "72"), ("50%", "50"),
])
def test_math_grader_equivalences(pred, ref):
    assert grade("math", pred, ref)


@pytest.mark.parametrize("pred, ref", [("0.51", "1/2"), ("72", "27"), ("1,001", "1000"), ("abc", "72"), ("", "1")])
def test_math_grader_rejects(pred, ref):
    assert not grade("math", pred, ref)


def test_numeric_and_exact_graders():
    assert grade("numeric", "1,000", "1000") and grade("numeric", "3/4", "0.75") and grade("numeric", "$3.50", "3.5")
    assert not grade("numeric", "3.5001", "3.5") and not grade("numeric", "x", "1")
    assert grade("exact", " Paris. ", "paris") and not grade("exact", "Paris, France", "paris")
    assert parse_number("\\boxed{12}") == 12.0 and parse_number("-7") == -7.0
    with pytest.raises(KeyError, match="unknown grader 'fuzzy'"):
        QAEnv("q", "1", grader="fuzzy")


def test_extract_answer_styles():
    text = "We add 3 and 4 to get 7.\n#### 7"
    assert extract_answer(text, "hash") == "7" and extract_answer(text, "auto") == "7"
    assert extract_answer("so \\boxed{1,000} apples", "auto") == "1,000"
    assert extract_answer("The answer is 12. (Check: 3 * 4)", "auto") == "12"
    assert extract_answer("3 plus 4 is 7", "number") == "7" and extract_answer("none", "number") is None
    assert extract_answer("no box 5", "boxed") is None and extract_answer("no hash 5", "hash") is None
    assert gsm8k_answer("Natalia sold 48/2 = 24 clips.\n#### 1,072") == "1072"


def test_qa_env_grades_and_records():
    env = QAEnv("What is 2+2?", "4", grader="math", template="Q: {question}", id="q1")
    obs, info = env.reset()[env.agent_id]
    assert obs == "Q: What is 2+2?" and info == {"id": "q1", "instance": "What is 2+2?"}
    out = env.step({env.agent_id: "4.0"})[env.agent_id]
    assert out.reward == 1.0 and out.terminated
    assert out.info == {"id": "q1", "correct": True, "reference": "4", "predicted": "4.0", "grader": "math", "hedged": False}


def test_arithmetic_set_is_deterministic_with_disjoint_splits():
    train, test = arithmetic_problems("train"), arithmetic_problems("test")
    assert len(train) == 2000 and len(test) == 200 and arithmetic_problems("train") == train
    assert not {r["question"] for r in train} & {r["question"] for r in test}
    for r in train[:300] + test:
        assert int(calculator(r["expression"])) == int(r["answer"])  # the known answers are right
    assert load_qa_records("arith:10", "test") == test[:10]
    env = DatasetQAEnv("arith", "test")
    assert env.reset(seed=3)[env.agent_id][0] == test[3]["question"]
    assert DatasetQAEnv("arith", "test", index=5).reset(seed=0)[env.agent_id][0] == test[5]["question"]


def test_calculator_refuses_non_arithmetic():
    assert calculator("3*(4+5)") == "27" and calculator("7/2") == "3.5"
    with pytest.raises(ValueError, match="only numbers"):
        calculator("__import__('os')")


CALC_ATTACKS = {
    "9**9**9**9": "operator",  # the power tower: a sampled tool call that would hold the GIL for good
    "1" * 10_000: "digits",    # a 10,000-digit literal
    "(10**5)": "operator",
    "2*" * 100 + "2": "too long",
}


def test_calculator_refuses_powers_and_huge_operands_before_computing():
    """Each attack is refused with a message naming what is not allowed, before any arithmetic: a
    child process runs them under a timeout (an ``eval`` of the power tower never returns), and the
    test asserts on the refusals it reports, not on a time."""
    import subprocess
    import sys

    code = ("import json, sys\nfrom ludic.envs.qa import calculator\nout = {}\n"
            "for e in json.loads(sys.stdin.read()):\n"
            "    try:\n        out[e] = 'computed ' + calculator(e)[:20]\n"
            "    except ValueError as x:\n        out[e] = str(x)\n"
            "print(json.dumps(out))\n")
    try:
        done = subprocess.run([sys.executable, "-c", code], input=json.dumps(list(CALC_ATTACKS)), capture_output=True,
                              text=True, timeout=20)
    except subprocess.TimeoutExpired:
        pytest.fail("the calculator started computing an attack instead of refusing it (killed after 20 s)")
    got = json.loads(done.stdout)
    for expr, word in CALC_ATTACKS.items():
        assert not got[expr].startswith("computed") and word in got[expr], (expr[:30], got[expr])
    assert calculator("-(3 - 5) * 2.5 / 4") == "1.25" and calculator("12345678 * 87654321") == "1082152022374638"
    with pytest.raises(ValueError, match="division by zero"):
        calculator("1/(2-2)")


def test_dataset_errors_name_file_and_record(tmp_path):
    bad = tmp_path / "qa.jsonl"
    bad.write_text('{"question": "a", "answer": "1"}\n{"question": "b"}\n')
    with pytest.raises(DatasetError, match=r"qa.jsonl:2: missing field 'answer'"):
        load_qa_records(str(bad))
    broken = tmp_path / "broken.jsonl"
    broken.write_text('{"question": "a", "answer": "1"}\n{"question": \n')
    with pytest.raises(DatasetError, match=r"broken.jsonl:2: invalid JSON"):
        load_qa_records(str(broken))
    ok = tmp_path / "gsm.jsonl"
    ok.write_text(json.dumps({"question": "q", "answer": "steps\n#### 1,234"}) + "\n")
    assert load_qa_records(str(ok))[0]["answer"] == "1234"


def test_parquet_records_and_missing_field(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "math.parquet"
    pq.write_table(pa.table({"problem": ["1+1?", "2+2?"], "solution": ["#### 2", None]}), path)
    with pytest.raises(DatasetError, match=r"math.parquet: record 1: missing field 'solution'"):
        load_qa_records(str(path), question_key="problem", answer_key="solution")
    pq.write_table(pa.table({"problem": ["1+1?"], "solution": ["#### 2"]}), path)
    from ludic.envs import qa

    qa._load.cache_clear()
    assert load_qa_records(str(path), question_key="problem", answer_key="solution")[0]["answer"] == "2"


def test_pass_at_k():
    assert pass_at_k(4, 0, 1) == 0.0 and pass_at_k(4, 4, 2) == 1.0
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25) and pass_at_k(4, 1, 2) == pytest.approx(0.5)
    assert pass_at_k(5, 2, 3) == pytest.approx(1 - (3 / 5) * (2 / 4) * (1 / 3))


@pytest.mark.slow
def test_train_and_eval_read_answers_the_same_way(tmp_path, packaged_dir):
    """`ludic train qa` (the reward path) and the GSM8K eval script, on the same questions, greedy:
    where the two runs produced the same reply, they must have read the same answer and graded it alike."""
    data = tmp_path / "qa.jsonl"
    rows = arithmetic_problems("test")[:6]
    data.write_text("".join(json.dumps({"question": r["question"], "answer": r["answer"]}) + "\n" for r in rows))
    common = ["--model", str(packaged_dir), "--data", str(data), "--dtype", "float32", "--grader", "math",
              "--answer", "auto", "--max-completion-tokens", "12"]
    run = tmp_path / "run"
    subprocess.run([sys.executable, "-m", "ludic", "train", "qa", *common, "--split", "train", "--eval-limit", "0",
                    "--temperature", "0", "--train-steps", "1", "--prompts-per-step", "6", "--group-size", "2",
                    "--run-dir", str(run), "--logger", "none"], check=True, cwd=tmp_path, timeout=600)
    out = tmp_path / "eval.jsonl"
    subprocess.run([sys.executable, str(ROOT / "examples/gsm8k/eval_gsm8k_vllm.py"), *common, "--split", "train",
                    "--inference", "transformers", "--system-prompt", "", "--template",
                    "{question}\nReply with the answer as a number only.", "--out", str(out)],
                   check=True, cwd=tmp_path, timeout=600)
    train = {}
    for line in (run / "rollouts.jsonl").read_text().splitlines():
        step = json.loads(line)["steps"][-1]
        train[step["action"]] = (step["parsed_action"], step["info"].get("correct"))
    evals = {json.loads(line)["reply"]: (json.loads(line)["parsed"], json.loads(line)["correct"])
             for line in out.read_text().splitlines()}
    shared = set(train) & set(evals)
    assert len(shared) >= 3, (sorted(train), sorted(evals))
    for reply in shared:
        assert train[reply] == evals[reply], reply


def test_tool_demos_are_teacher_transcripts_through_the_real_agent(tokenizer):
    """--tool-demos: a calculator call on the record's expression, then the result, rendered by the real
    ToolAgent and chat template; the second turn's prompt holds the first turn and the tool's message."""
    import asyncio

    from ludic.recipes.qa import QAOptions, tool_demo_items

    recs = arithmetic_problems("train")[:3]
    items = asyncio.run(tool_demo_items(QAOptions(tools=True, max_completion_tokens=40), recs, tokenizer))
    assert len(items) == 6
    call, answer = items[0], items[1]
    text = tokenizer.decode(call.completion_ids)
    assert text == f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{recs[0]["expression"]}"}}}}</tool_call>' + tokenizer.eos_token
    assert tokenizer.decode(answer.completion_ids) == recs[0]["answer"] + tokenizer.eos_token
    assert answer.prompt_ids[: len(call.prompt_ids) + len(call.completion_ids)] == call.prompt_ids + call.completion_ids
    assert f"tool\n{recs[0]['answer']}" in tokenizer.decode(answer.prompt_ids)  # the tool's result, as a tool message
    with pytest.raises(ValueError, match="expression"):
        asyncio.run(tool_demo_items(QAOptions(tools=True), [{"id": "x", "question": "q", "answer": "1"}], tokenizer))


def test_train_qa_with_tool_demos_reports_each_stage(tiny_model_dir, tmp_path):
    from ludic.recipes.qa import QAOptions, TrainQAConfig, train_qa

    run = tmp_path / "run"
    out = train_qa(TrainQAConfig(model=str(tiny_model_dir), qa=QAOptions(tools=True, max_completion_tokens=8),
                                 tool_demos=2, train_steps=1, eval_limit=2, group_size=2, prompts_per_step=2,
                                 run_dir=str(run), logger="none", dtype="float32"))
    assert set(out) >= {"before", "after_demos", "after"} and (run / "eval_after_demos.jsonl").exists()
    with pytest.raises(ValueError, match="add --tools"):
        train_qa(TrainQAConfig(model=str(tiny_model_dir), tool_demos=1, train_steps=1, eval_limit=0,
                               run_dir=str(tmp_path / "r2"), logger="none"))


def test_train_qa_keep_best_chooses_on_held_out_training_records(tiny_model_dir, tmp_path):
    """``--eval-every --keep-best``: the validation records are the eval split's after the test ones, never
    trained on; the start (after the tool demos) is a candidate; the test records score the kept weights."""
    import json

    from ludic.recipes.qa import QAOptions, TrainQAConfig, train_qa

    run = tmp_path / "run"
    out = train_qa(TrainQAConfig(model=str(tiny_model_dir), qa=QAOptions(data="arith:40", tools=True, max_completion_tokens=8),
                                 tool_demos=1, train_steps=2, eval_limit=2, group_size=2, prompts_per_step=2,
                                 eval_every=1, keep_best=True, val_limit=3, run_dir=str(run), logger="none",
                                 dtype="float32"))
    kept = out["kept"]
    assert kept["episodes"] == 3 and kept["step"] in (0, 1, 2) and kept["last_step"] == 2 and "records" in kept["note"]
    val = {json.loads(line)["question"] for line in (run / "eval_val.jsonl").read_text().splitlines()}
    trained = {json.loads(line)["steps"][0]["prev_obs"] for line in (run / "rollouts.jsonl").read_text().splitlines()}
    test = {json.loads(line)["question"] for line in (run / "eval_after.jsonl").read_text().splitlines()}
    assert len(val) == 3 and len(test) == 2 and not val & test and not any(q in obs for q in val for obs in trained)
    logged = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert sorted(r["step"] for r in logged if "eval/accuracy" in r) == [0, 1, 2]
    assert "validation records" in (run / "report.html").read_text()
    with pytest.raises(ValueError, match="--keep-best needs --eval-every"):
        train_qa(TrainQAConfig(model=str(tiny_model_dir), keep_best=True, train_steps=1, eval_limit=0,
                               run_dir=str(tmp_path / "r2"), logger="none"))
