"""The code-trace task: print injection, the scorer, the sandbox's limits, and the env."""

import json
import os
import re
import time
from pathlib import Path

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


ATTACKS = {  # name -> (program; {secret}, {escape} and {victim} are filled in; the reasons that count as stopped)
    "write outside the scratch folder": ("open({escape!r}, 'w').write('pwned')\nprint('wrote')", {"filesystem"}),
    "read a file of the trainer's": ("print(open({secret!r}).read())", {"filesystem"}),
    "kill the parent process": ("import os, signal\nos.kill(os.getppid(), signal.SIGKILL)\n"
                                "os.kill({victim}, signal.SIGKILL)\nprint('killed')", {"error", "processes"}),
    "open a socket": ("import socket\nsocket.create_connection(('1.1.1.1', 80), timeout=3)\nprint('connected')",
                      {"network"}),
    "fork bomb": ("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
                  {"timeout", "processes"}),
    "allocate 10 GB": ("x = bytearray(10 * 1024 ** 3)\nprint(len(x))", {"memory"}),
    "loop forever": ("while True:\n    pass", {"timeout"}),
    "write 1 GB": ("with open('big', 'wb') as f:\n    for _ in range(1024):\n        f.write(b'x' * (1 << 20))\n"
                   "print('wrote')", {"disk", "output"}),
}


ATTACK_RUNNER = """
import json, os, sys, time
from ludic.envs.sandbox import run_python
attacks, secret, escape, victim = json.loads(sys.stdin.read())
for name, code in attacks.items():
    t0 = time.perf_counter()
    out = run_python(code.format(secret=secret, escape=escape, victim=victim), timeout_s=3, max_output_bytes=1 << 20)
    print(json.dumps({"name": name, "reason": out.reason, "ok": out.ok, "stdout": out.stdout[-300:],
                      "stderr": out.stderr[-300:], "seconds": time.perf_counter() - t0,
                      "escaped": os.path.exists(escape)}), flush=True)
"""


@pytest.fixture(scope="module")
def attack_table():
    """Each attack run once in the sandbox by a stand-in trainer process (so an attack that kills its
    parent kills that process, not pytest), beside another host process it tries to kill; the rows
    print as the issue's table: attack, what stopped it, seconds to stop, the host unharmed."""
    import subprocess
    import sys
    import tempfile

    rows = {}
    with tempfile.TemporaryDirectory() as d:
        secret = os.path.join(d, "trainer_secret.txt")
        with open(secret, "w") as f:
            f.write("the trainer's secret")
        os.chmod(d, 0o755)
        os.chmod(secret, 0o644)  # readable by every user of this machine: only the sandbox's view hides it
        escape = os.path.join(d, "escaped.txt")
        victim = subprocess.Popen(["sleep", "300"])  # another process of the host, which the attack tries to kill
        try:
            trainer = subprocess.run([sys.executable, "-c", ATTACK_RUNNER], capture_output=True, text=True, timeout=240,
                                     input=json.dumps([{k: v[0] for k, v in ATTACKS.items()}, secret, escape, victim.pid]))
            for line in trainer.stdout.splitlines():
                row = json.loads(line)
                rows[row["name"]] = {**row, "victim_alive": victim.poll() is None}
            rows["trainer"] = {"returncode": trainer.returncode, "stderr": trainer.stderr[-2000:]}
        finally:
            victim.kill()
    print("\n| attack | stopped by | seconds | host unharmed |")
    for name in ATTACKS:
        r = rows.get(name)
        print(f"| {name} | {r and r['reason']} | {r and round(r['seconds'], 2)} | "
              f"{r is not None and not r['escaped'] and r['victim_alive']} |")
    return rows


@pytest.mark.parametrize("name", list(ATTACKS))
def test_sandbox_attack_is_stopped_and_the_host_lives(attack_table, name):
    assert attack_table["trainer"]["returncode"] == 0, f"the trainer died: {attack_table['trainer']}"
    r = attack_table[name]
    assert r["reason"] in ATTACKS[name][1], (name, r["reason"], r["stdout"], r["stderr"])
    assert not r["ok"] and "secret" not in r["stdout"] and "wrote" not in r["stdout"] and "connected" not in r["stdout"]
    assert not r["escaped"] and r["victim_alive"]
    assert _cgroup_pids() == []


FORK_64 = """import os, time
n = 0
for _ in range(64):
    try:
        pid = os.fork()
    except OSError:
        break
    if pid == 0:
        time.sleep(2)
        os._exit(0)
    n += 1
print(n)
"""
"""Forks up to 64 sleeping children (bounded: harmless without a cap too) and prints how many it got."""


def test_a_process_cap_always_applies():
    """Was: ``max_pids=None`` ran the program with no process cap at all (no pids cgroup, no RLIMIT_NPROC),
    though the docstring said the sandbox refuses to run without one: FORK_64 got all 64 children. Now None is
    refused with an error naming ``max_pids``, and the default cap contains the same program."""
    from ludic.envs.sandbox import SandboxUnavailable

    with pytest.raises((ValueError, SandboxUnavailable), match="max_pids"):
        out = run_python(FORK_64, timeout_s=20, max_pids=None)
        print("uncapped:", out.stdout.strip(), "children")
    capped = run_python(FORK_64, timeout_s=20)
    assert capped.stdout.strip() and int(capped.stdout) < 32, (capped.stdout, capped.stderr[-300:])
    assert _cgroup_pids() == []


def test_the_work_folder_is_private_and_the_program_still_runs():
    """Was: the host folder holding the program, its input and its output was made 0755 (main.py 0644, the
    output files by the umask), so any local user could read them while it ran. Now the folder is 0700 and
    no file in it is readable by group or others; the program (as ``nobody``, in bwrap) still runs. Watched
    from a thread while the program sleeps: every look at the folder (found by the run's own input) counts."""
    import tempfile
    import threading
    import uuid

    marker = f"private-{uuid.uuid4().hex}"
    looks, done = [], threading.Event()

    def watch():
        while not done.is_set():
            for d in Path(tempfile.gettempdir()).glob("ludic-sandbox-*"):
                try:
                    files = {f.name: f.stat().st_mode & 0o777 for f in d.iterdir() if f.is_file()}
                    if any(marker in f.read_text(errors="replace") for f in d.iterdir() if f.is_file()):
                        looks.append((d.stat().st_mode & 0o777, files))
                except OSError:
                    pass  # another run's folder, or this one removed in between
            time.sleep(0.02)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        out = run_python("import sys, time\ndata = sys.stdin.read()\nprint(data[::-1])\nsys.stdout.flush()\n"
                         "time.sleep(2)", stdin=marker, timeout_s=20)
    finally:
        done.set()
        watcher.join()
    assert out.ok and out.stdout == marker[::-1] + "\n", (out.reason, out.stderr[-300:])
    assert looks, "the run's work folder was never seen"
    print(f"{len(looks)} looks; last: folder {oct(looks[-1][0])}, files {({k: oct(v) for k, v in looks[-1][1].items()})}")
    assert all(mode == 0o700 for mode, _ in looks), {oct(m) for m, _ in looks}
    assert all(not m & 0o077 for _, files in looks for m in files.values()), looks[-1]


def test_the_sandbox_runs_as_an_unprivileged_user_in_its_own_pid_namespace():
    out = run_python("import os\nprint(os.getuid(), os.getgid(), os.getpid())\nprint(sorted(os.listdir('/proc'))[:3])")
    assert out.ok, out.stderr
    uid, gid, pid = out.stdout.split("\n")[0].split()
    assert uid != "0" and gid != "0" and int(pid) < 10  # its own PID namespace: the host's processes are not there


def test_an_attack_in_a_trace_record_is_a_failed_rollout(tmp_path):
    """A hostile program in a trace dataset: the env raises, the protocol records a failed rollout, the run goes on."""
    import asyncio

    from ludic.agents.agent import Agent
    from ludic.context import FullDialog
    from ludic.interaction import SingleAgentProtocol

    path = tmp_path / "hostile.jsonl"
    path.write_text(json.dumps({"program": "while True:\n    pass", "inputs": ""}) + "\n")

    class Never:
        tokenizer = None

        async def complete(self, request):
            raise AssertionError("no model call: the env failed first")

    env = TraceEnv(task_id=0, records_path=str(path), timeout_s=1.0)
    [r] = asyncio.run(SingleAgentProtocol(Agent(Never(), FullDialog("x"))).run(env, max_steps=1))
    assert r.meta["failed"] and "timeout" in r.meta["error"] and r.meta["error_stage"] == "env.reset"


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
