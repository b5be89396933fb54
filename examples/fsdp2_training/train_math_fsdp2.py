"""FSDP2 math training: one inference process (a Ludic vLLM server) and N training processes (torchrun,
the policy sharded with ``fully_shard``), GRPO-style grouped advantages on graded math answers.

The seed's template is 4 GPUs: 1 for vLLM, 3 for training, NCCL weight pushes. The same script runs on
CPU as 1 + 2 processes (gloo, the vLLM CPU build, weights pushed by path):

    python examples/fsdp2_training/train_math_fsdp2.py                          # CPU: 1 server + 2 trainers
    python examples/fsdp2_training/train_math_fsdp2.py --gpus 4 --model Qwen/Qwen2.5-7B-Instruct \\
        --data openai/gsm8k --grader math --answer auto --max-completion-tokens 512 --prompts-per-step 6

Every rank samples its share of each step's prompts from the one server; the trainer reduces over all
ranks so the update equals single-process training on the global batch; after each step all ranks join
the gather and rank 0 pushes the merged weights. Flags not listed below go to ``ludic train qa``.
Held-out accuracy before and after is in RUN_DIR/qa_results.json and RUN_DIR/report.html.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

# CPU defaults: the generated arithmetic word problems (offline), short answers, a few steps.
DEFAULTS = [
    "--data", "arith", "--grader", "numeric", "--answer", "number", "--max-completion-tokens", "12",
    "--group-size", "4", "--prompts-per-step", "4", "--train-steps", "4", "--eval-limit", "20",
    "--algorithm", "grpo", "--lr", "1e-4",
]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpus", type=int, default=0, help="0: CPU (gloo). N>=2: GPU 0 serves, GPUs 1..N-1 train (NCCL)")
    ap.add_argument("--train-procs", type=int, default=2, help="training processes on CPU (with --gpus: N-1)")
    ap.add_argument("--model", default=None, help="model folder or hub id (default: the packaged SmolLM2-135M)")
    ap.add_argument("--run-dir", default=None)
    ap.add_argument("--dtype", default="auto")
    args, rest = ap.parse_known_args(argv)

    from ludic.inference.models import DEFAULT_MODEL
    from ludic.inference.vllm_launcher import VLLMServerProcess, free_port

    model = args.model or DEFAULT_MODEL
    run_dir = Path(args.run_dir or f"runs/fsdp2-math-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    procs = args.gpus - 1 if args.gpus else args.train_procs
    if procs < 1:
        raise SystemExit("need at least one training process (--gpus 2 or more, or --train-procs 1 or more)")

    env = dict(os.environ)
    server = VLLMServerProcess(model, dtype=args.dtype, log_path=run_dir / "vllm_server.log", allowed_dirs=[run_dir])
    if args.gpus:
        server.env["CUDA_VISIBLE_DEVICES"] = "0"
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(i) for i in range(1, args.gpus))
    else:
        env.setdefault("OMP_NUM_THREADS", "1")  # the trainers share the cores with the server
    print(f"[fsdp2] inference: 1 vLLM server ({'GPU 0' if args.gpus else 'CPU'}); training: {procs} FSDP2 "
          f"processes ({'NCCL' if args.gpus else 'gloo'}); run dir {run_dir}", flush=True)
    server.start()
    try:
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}",
               f"--master_port={free_port()}", "-m", "ludic", "train", "qa", *DEFAULTS,
               "--model", model, "--dtype", args.dtype, "--inference", "vllm", "--port", str(server.port),
               "--run-dir", str(run_dir), *rest]
        print("[fsdp2] " + " ".join(cmd[2:]), flush=True)
        return subprocess.run(cmd, env=env).returncode
    finally:
        server.stop()


if __name__ == "__main__":
    sys.exit(main())
