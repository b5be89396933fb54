"""Peak memory of RL training per env kind: a few steps of each workload in a fresh process, the kernel's peak
resident set size (``ru_maxrss`` of the child: the peak is process-wide and only grows).

    python benchmarks/bench_memory.py [--steps 2] [--dtype auto] [--only chain_sum,tool,kuhn] [--old-budget]

Workloads (the packaged SmolLM2-135M-Instruct with LoRA r16 and the commands' defaults: groups of 8 on 8 seeds a
step for ``train env`` (64 episodes; 4 seeds before 2026-12-01) and 4 for ``train qa``; no evaluation; one thread
per process, so a busy machine slows it less):

    chain_sum  ludic train env --env reasoning_gym:chain_sum (2-3 terms of 1-2 digits): one turn, short replies
    tool       ludic train qa --data arith --tools --max-completion-tokens 32: the calculator ToolAgent, up to
               three turns (two tool calls and the answer), one merged sequence per episode
    kuhn       ludic train env --env textarena:KuhnPoker-v0 --env-kwargs '{"max_rounds": 1}' --opponent frozen:
               a two-player game against the frozen start, whole-game prompts of several hundred tokens

Beside each peak ("peer" column): the peak of a process that only loads the policy (the model with its LoRA
adapter), and the ratio peak / that: what a run adds to its model. ``--old-budget`` runs each workload again
with ``--micro-token-budget 8192`` (the fixed budget before micro-batches were sized by memory,
``TrainerConfig.micro_batch_mb``) and prints that peak too. Goal: every peak under 3 GB, so that a laptop
with 8 GB trains beside its other work. The tic-tac-toe recipe's documented peak is 2.35 GB (bf16).
The CPU flags and dtype are printed; compare within one run.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: the repository root on the path, for ``benchmarks.common``
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

WORKLOADS: dict[str, list[str]] = {
    "chain_sum": ["train", "env", "--env", "reasoning_gym:chain_sum", "--env-kwargs",
                  '{"config": {"min_terms": 2, "max_terms": 3, "min_digits": 1, "max_digits": 2}}',
                  "--eval-episodes", "0", "--eval-every", "0"],
    "tool": ["train", "qa", "--data", "arith", "--tools", "--max-completion-tokens", "32", "--eval-limit", "0"],
    "kuhn": ["train", "env", "--env", "textarena:KuhnPoker-v0", "--env-kwargs", '{"max_rounds": 1}',
             "--opponent", "frozen", "--eval-episodes", "0", "--eval-every", "0"],
}
"""``python -m ludic`` arguments of each workload (steps, dtype, run dir and seed are added)."""

LOAD_ONLY = ("from ludic.recipes.blocks import LoraBlock\nfrom ludic.training.lora import load_policy\n"
             "load_policy(None, lora=LoraBlock().lora_settings(), dtype={dtype!r})\n")


def measure(argv: list[str], env: dict[str, str]) -> dict[str, float]:
    """Run ``argv`` to its end: its peak RSS (GB), wall and CPU seconds; a failure raises with its output's tail."""
    t0 = time.perf_counter()
    with tempfile.TemporaryFile() as out:
        proc = subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
        if os.waitstatus_to_exitcode(status):
            out.seek(0)
            raise RuntimeError(f"{' '.join(argv[:6])} ... exited with {os.waitstatus_to_exitcode(status)}:\n"
                               + out.read().decode(errors="replace")[-3000:])
    return {"peak_gb": usage.ru_maxrss * 1024 / 1e9, "wall_s": time.perf_counter() - t0,
            "cpu_s": usage.ru_utime + usage.ru_stime}


def run_workload(name: str, steps: int, dtype: str, root: Path, extra: tuple[str, ...] = (),
                 quick: bool = False) -> dict[str, Any]:
    """One workload in a fresh process: its peak, times, and what its steps trained (metrics.jsonl)."""
    run_dir = root / f"{name}{'-old' if extra else ''}"
    size = ["--prompts-per-step", "1", "--group-size", "2"] if quick else []
    argv = [sys.executable, "-m", "ludic", *WORKLOADS[name], "--train-steps", str(steps), "--dtype", dtype,
            "--seed", "0", "--run-dir", str(run_dir), "--no-final-save", "--logger", "none", *size, *extra]
    res = measure(argv, {**os.environ, "OMP_NUM_THREADS": "1"})
    lines = (run_dir / "metrics.jsonl").read_text().splitlines() if (run_dir / "metrics.jsonl").exists() else []
    steps_m = [m for m in map(json.loads, lines) if "train_tokens" in m]
    res["train_tokens"] = sum(m["train_tokens"] for m in steps_m) / max(len(steps_m), 1)
    res["steps"] = len(steps_m)
    return res


def run(dtype: str, quick: bool = False, steps: int = 2, only: list[str] | None = None,
        old_budget: bool = False) -> dict[str, Any]:
    """Part (h) of ``python -m benchmarks``: each workload's peak RSS beside the loaded policy's, rows for the table."""
    from benchmarks.common import row

    names = only or (["chain_sum"] if quick else list(WORKLOADS))
    steps = 1 if quick else steps
    root = Path(tempfile.mkdtemp(prefix="ludic-bench-memory-"))
    out: dict[str, Any] = {"steps": steps, "dtype": dtype, "workloads": {}}
    try:
        load = measure([sys.executable, "-c", LOAD_ONLY.format(dtype=dtype)], {**os.environ, "OMP_NUM_THREADS": "1"})
        out["policy_loaded_gb"] = load["peak_gb"]
        print(f"[memory] policy loaded (LoRA r16, {dtype}): peak {load['peak_gb']:.2f} GB", flush=True)
        rows = []
        for name in names:
            res = run_workload(name, steps, dtype, root, quick=quick)
            if old_budget:
                res["old_budget"] = run_workload(name, steps, dtype, root, ("--micro-token-budget", "8192"), quick)
            out["workloads"][name] = res
            old = f", with --micro-token-budget 8192 {res['old_budget']['peak_gb']:.2f} GB" if old_budget else ""
            print(f"[memory] {name}: peak {res['peak_gb']:.2f} GB{old} ({res['steps']} steps, "
                  f"{res['train_tokens']:.0f} trained tokens a step, {res['wall_s']:.0f} s wall, {res['cpu_s']:.0f} s CPU)",
                  flush=True)
            rows.append(row("h", f"peak RSS, {name} ({steps} steps) / policy loaded", res["peak_gb"], load["peak_gb"],
                            res["peak_gb"] / load["peak_gb"], unit="GB", goal="< 3 GB", met=res["peak_gb"] < 3.0))
        out["rows"] = rows
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--only", default="", help=f"comma list among {','.join(WORKLOADS)}")
    ap.add_argument("--old-budget", action="store_true", help="also run each with --micro-token-budget 8192")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    from benchmarks.common import format_table, header, machine_info
    from ludic.inference.models import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    print(header(machine_info(dtype)), flush=True)
    only = [n.strip() for n in args.only.split(",") if n.strip()] or None
    if only and set(only) - set(WORKLOADS):
        raise SystemExit(f"--only: unknown workload(s) {sorted(set(only) - set(WORKLOADS))}")
    res = run(dtype, quick=args.quick, steps=args.steps, only=only, old_budget=args.old_budget)
    print(format_table(res["rows"]))


if __name__ == "__main__":
    main()
