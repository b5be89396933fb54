"""The code-trace task: print injection, the scorer, the sandbox's limits, and the env."""

import json
import os
import re
import time

import pytest

from ludic.envs.sandbox import run_python
from ludic.envs.trace import (
    TraceEnv,
    TraceProgramError,
    answer_text,
    generate_program,
    inject_prints,
    load_trace_records,
    make_task,
    score_answer,
)


def test_injected_prints_on_a_hand_written_program():
    program = "n = int(input())\nname = 'ab' * n\nitems = [n, n]\nif n > 5:\n    y = 1\nz = n * 2\nprint(z)\n"
    shown = inject_prints(program, seed=0, p_assign=1.0, p_if=1.0)
    out = run_python(shown, "4")
    assert out.ok, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0] == "__DBG_0__ 4"  # after n = int(input()): n
    assert lines[-1] == "8"
    tags = [line.split()[0] for line in lines[:-1]]
    # n, name, items, y (inside the branch, not taken with n = 4), the if, z: six prints, five run
    assert tags == ["__DBG_0__", "__DBG_1__", "__DBG_2__", "__DBG_4__", "__DBG_5__"] and "__DBG_3__" in shown
    by_tag = dict(line.split(" ", 1) for line in lines[:-1])
    assert "'abababab'" in by_tag["__DBG_1__"] or "4" in by_tag["__DBG_1__"]  # a str shows its repr
    assert all("list" in v or "'" in v or v.replace(" ", "").lstrip("-").isdigit() for v in by_tag.values())
    assert not re.search(r"\by\b", shown.split("z = n * 2", 1)[1])  # y (bound in one branch only) is never printed after


def test_injection_is_deterministic_capped_and_never_names_an_unbound_variable():
    for task in range(60):
        program, stdin = generate_program(task)
        a, b = inject_prints(program, task), inject_prints(program, task)
        assert a == b
        assert a.count("__DBG_") <= 6
        out = run_python(a, stdin)
        assert out.ok, (task, out.stderr)
    assert inject_prints(*generate_program(1)[:1], seed=1) != inject_prints(generate_program(1)[0], seed=2)


def test_scorer_normalisation():
    expected = "__DBG_0__ 4\nHello World\n8"
    assert score_answer("__dbg_0__ 4 hello world 8", expected) == 1.0  # whitespace and case
    assert score_answer("<think>it prints 9</think>```\n__DBG_0__ 4\nHello World\n8\n```", expected) == 1.0
    assert score_answer("so the output is:\n```text\n__DBG_0__ 4\nHello World\n8\n```\n```\n9\n```", expected) == 1.0
    assert score_answer("reasoning that was cut</think>__DBG_0__ 4\nHello World\n8", expected) == 1.0
    assert score_answer("<thinking>x</thinking>__DBG_0__ 4 Hello World 9", expected) == 0.0
    assert score_answer("", "") == 0.0 and score_answer("   ", expected) == 0.0
    assert answer_text("a ```py\nX\n``` b") == "X\n"


def _cgroup_pids():
    root = "/sys/fs/cgroup/pids"
    if not os.path.isdir(root):
        return []
    return [d for d in os.listdir(root) if d.startswith("ludic-sandbox-")]


@pytest.mark.parametrize("name,code,reason", [
    ("socket", "import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('connected')", "network"),
    ("memory", "x = bytearray(10 * 1024 ** 3)\nprint(len(x))", "memory"),
    ("forever", "while True:\n    pass", "timeout"),
    ("fork_bomb", "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass", "timeout"),
    ("output", "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", "output"),
])
def test_sandbox_stops_hostile_programs_and_the_host_is_unharmed(name, code, reason):
    t0 = time.perf_counter()
    out = run_python(code, timeout_s=3, max_output_bytes=1 << 20)
    assert out.reason == reason, (out.reason, out.stderr[-300:])
    assert "connected" not in out.stdout
    assert time.perf_counter() - t0 < 15
    assert _cgroup_pids() == []  # every sandbox cgroup was emptied and removed: none of its processes is left
    assert run_python("print(1 + 1)").stdout == "2\n"  # the machine still runs programs


def test_trace_env_episode_and_task_errors(tmp_path):
    env = TraceEnv(task_id=3)
    obs, info = env.reset(seed=0)["agent_0"]
    assert obs.startswith("Predict the exact and complete standard output") and "```python" in obs
    task = env.task
    out = env.step({"agent_0": f"```\n{task.expected}\n```"})["agent_0"]
    assert out.reward == 1.0 and out.terminated and out.info["test_result"] == "1/1"
    env.reset(seed=0)
    assert env.step({"agent_0": "no idea"})["agent_0"].reward == 0.0
    assert make_task(3).expected == task.expected  # deterministic
    path = tmp_path / "progs.jsonl"
    path.write_text(json.dumps({"program": "print(int(input()) + 1)", "inputs": "41"}) + "\n"
                    + json.dumps({"program": "raise SystemExit(3)", "inputs": ""}) + "\n")
    assert make_task(0, load_trace_records(path)).expected == "42"
    with pytest.raises(TraceProgramError, match="trace task 1: the program failed in the sandbox"):
        make_task(1, load_trace_records(path))
    path.write_text('{"program": "print(1)"}\n{"inputs": "x"}\n')
    with pytest.raises(ValueError, match=r"progs.jsonl:2: a trace record needs 'program'"):
        load_trace_records(path)
