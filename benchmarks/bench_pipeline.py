"""Pipeline RL against synchronous RL, same workload, one run.

Workload: tic-tac-toe GRPO + LoRA r8 on SmolLM2-135M-Instruct (``--model``: the packaged base, or
better a cold-started one such as the recipe's ``runs/<recipe>/sft/final``), games against the
epsilon-mixed minimax opponent with the recipe's prompts (latest board only, compact, bare-cell
answers of a few tokens), 16 episodes (2 groups of 8) per optimizer step:

    sync       ludic train tictactoe: generate a batch, then train on it (2 threads)
    pipeline   ludic learner + ludic actor as two processes over a local redis-server (1 thread
               each, the same 2 cores): the actor generates the next batch while the learner
               trains, up to --max-lag versions behind, with token-level truncated IS
    overlap    ludic train tictactoe --overlap: the same in one process (an actor thread with its
               own model copy, one batch ahead, max_lag 1; 1 thread each through OMP_NUM_THREADS)

    python benchmarks/bench_pipeline.py [--steps 12] [--dtype float32] [--model runs/<recipe>/sft/final]
                                        [--modes sync,pipeline,overlap]

What bounds the ratio on a 2-core CPU: both modes share the same two cores, so the pipeline can
only win what the synchronous loop leaves idle. A synchronous step alternates generation (small
batched decode steps that use 2 threads poorly) and training; the pipeline runs both at once with a
thread each. Its step is then bounded by the slower side (training on 1 thread), not by their sum.
Measured on an AVX512 2-core VM, fp32, from the recipe's SFT checkpoint: sync 14.8 s per step
(generation ~5.5 s + training ~7.5 s), pipeline 9.8 s per step (training on 1 thread): 1.52x samples
per second, reward over the last half 0.371 vs 0.383 (same within noise), items one version behind
(mean lag 0.93), none stale at --max-lag 2. The anchors of larger systems (AReaL up to 2.77x,
PipelineRL ~2x) come from GPUs where generation and training use separate devices.

Prints, for each mode: wall time of the training steps (after the first), samples trained per
second, and the mean game reward of the last half of the steps; then the ratios
pipeline / sync. Compare only within one run (CPU flags and dtype are printed).
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


def flags() -> str:
    from ludic.recipes.common import machine

    m = machine()
    return f"cpus {m['cpus']}, isa {'/'.join(m['isa'])}, torch {m['torch']}"


def common(steps: int, dtype: str, run_dir: Path, model: str) -> list[str]:
    return ["--model", model, "--train-steps", str(steps), "--group-size", "8", "--rollouts-per-update", "16",
            "--opponent", "mixed", "--compact", "--no-show-moves", "--no-show-opponent-move", "--answer", "cell",
            "--system-prompt", "Tic-tac-toe.", "--max-completion-tokens", "4", "--ctx", "last", "--logger", "none",
            "--dtype", dtype,
            "--run-dir", str(run_dir), "--lora-rank", "8", "--lr", "1e-4", "--checkpoint-every", "0",
            "--no-final-save", "--eval-episodes", "0", "--no-resume"]


def summarise(run_dir: Path, steps: int, wall: float | None = None) -> dict[str, float]:
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r and "step_s" in r]
    timed = rows[1:]  # the first step warms up (and waits for the first batch)
    seconds = sum(r["step_s"] for r in timed) if wall is None else wall
    samples = sum(r.get("num_items", 16) for r in timed)
    late = rows[len(rows) // 2:]
    reward = sum(r.get("reward_mean", 0.0) for r in late) / max(len(late), 1)
    return {"steps": len(rows), "seconds": seconds, "samples_per_s": samples / seconds, "reward": reward}


def summarise_pipeline(run_dir: Path, steps: int) -> dict[str, float]:
    """``summarise`` plus the learner's stale share, mean lag and sampler-learner KL."""
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "step" in r]
    out = summarise(run_dir, steps)
    out["stale_share"] = sum(r.get("pipeline_stale_share", 0.0) for r in rows) / max(len(rows), 1)
    out["lag_mean"] = sum(r.get("pipeline_lag_mean", 0.0) for r in rows) / max(len(rows), 1)
    same = [r for r in rows if r.get("sampler_tokens", 0) > 0]  # tokens sampled by the learner's own weights
    out["sampler_kl"] = max((r["sampler_kl"] for r in same), default=float("nan"))
    out["same_version_steps"] = len(same)
    return out


def run_sync(steps: int, dtype: str, root: Path, model: str) -> dict[str, float]:
    run = root / "sync"
    env = {**os.environ, "OMP_NUM_THREADS": "2"}
    subprocess.run([sys.executable, "-m", "ludic", "train", "tictactoe", *common(steps, dtype, run, model)], env=env,
                   check=True, stdout=subprocess.DEVNULL)
    return summarise(run, steps)


def run_pipeline(steps: int, dtype: str, root: Path, max_lag: int, model: str) -> dict[str, float]:
    from ludic.pipeline.redis_server import RedisServer

    run = root / "pipeline"
    server = RedisServer(root / "redis").start()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    extra = ["--redis-url", server.url, "--max-unread", "32", "--max-lag", str(max_lag),
             "--behavior-is", "token_truncate"]
    actor = subprocess.Popen([sys.executable, "-m", "ludic", "actor", "tictactoe",
                              *common(steps, dtype, root / "actor", model), *extra, "--actor-id", "a0"],
                             env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        learner = subprocess.Popen([sys.executable, "-m", "ludic", "learner", "tictactoe",
                                    *common(steps, dtype, run, model), *extra], env=env, stdout=subprocess.DEVNULL)
        learner.wait()
        if learner.returncode:
            raise RuntimeError(f"learner exited with {learner.returncode}")
    finally:
        actor.kill()
        server.kill()
    return summarise_pipeline(run, steps)  # the learner's step_s includes its wait for data


def run_overlap(steps: int, dtype: str, root: Path, model: str) -> dict[str, float]:
    run = root / "overlap"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}  # one thread for the actor thread, one for the learner
    subprocess.run([sys.executable, "-m", "ludic", "train", "tictactoe", *common(steps, dtype, run, model),
                    "--overlap", "--behavior-is", "token_truncate"], env=env, check=True, stdout=subprocess.DEVNULL)
    return summarise_pipeline(run, steps)


def run(dtype: str, quick: bool = False, steps: int = 6, model: str = "HuggingFaceTB/SmolLM2-135M-Instruct") -> dict:
    """Part (g) of ``python -m benchmarks``: overlap against sync, one run each, rows for the table."""
    from benchmarks.common import row

    steps = 2 if quick else steps
    root = Path(tempfile.mkdtemp(prefix="ludic-bench-pipeline-"))
    try:
        sync = run_sync(steps, dtype, root, model)
        over = run_overlap(steps, dtype, root, model)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    ratio = over["samples_per_s"] / sync["samples_per_s"]
    what = (f"tictactoe samples/s, --overlap / sync ({steps} steps; lag {over['lag_mean']:.2f}, "
            f"stale {over['stale_share']:.0%})")
    return {"sync": sync, "overlap": over,
            "rows": [row("g", what, over["samples_per_s"], sync["samples_per_s"], ratio, unit="samples/s")]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--dtype", default="float32")
    ap.add_argument("--max-lag", type=int, default=2)
    ap.add_argument("--model", default="HuggingFaceTB/SmolLM2-135M-Instruct",
                    help="a cold-started model plays and learns (e.g. runs/<recipe>/sft/final); the base "
                         "model's replies are all illegal here, so its reward stays flat")
    ap.add_argument("--modes", default="sync,pipeline,overlap", help="comma-separated: sync, pipeline, overlap")
    a = ap.parse_args()
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if "sync" not in modes or not set(modes) <= {"sync", "pipeline", "overlap"}:
        ap.error(f"--modes must include sync (the reference) and only sync, pipeline, overlap: {a.modes!r}")
    root = Path(tempfile.mkdtemp(prefix="ludic-bench-pipeline-"))
    try:
        t0 = time.perf_counter()
        results = {"sync": run_sync(a.steps, a.dtype, root, a.model)}
        if "pipeline" in modes:
            results["pipeline"] = run_pipeline(a.steps, a.dtype, root, a.max_lag, a.model)
        if "overlap" in modes:
            results["overlap"] = run_overlap(a.steps, a.dtype, root, a.model)
        print(f"{flags()}; dtype {a.dtype}; {a.steps} steps of 16 episodes; total {time.perf_counter() - t0:.0f} s")
        for name, r in results.items():
            extra = (f", stale {r['stale_share']:.1%}, mean lag {r['lag_mean']:.2f}, sampler-learner KL max "
                     f"{r['sampler_kl']:.2e} (over {r['same_version_steps']} steps with same-version tokens)"
                     if name != "sync" else "")
            print(f"{name:>9}: {r['seconds']:.1f} s for steps 2-{r['steps']}, {r['samples_per_s']:.2f} samples/s, "
                  f"reward (last half) {r['reward']:+.3f}{extra}")
        sync = results["sync"]
        for name, r in results.items():
            if name != "sync":
                print(f"    ratio: {name} / sync samples per second = {r['samples_per_s'] / sync['samples_per_s']:.2f}x; "
                      f"reward {r['reward']:+.3f} vs {sync['reward']:+.3f}")
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
