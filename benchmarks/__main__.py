"""Run the benchmarks one after another and print one table of ratios measured side by side.

    python -m benchmarks [--only a,b,c,d,e,f,g,h] [--quick] [--dtype auto] [--threads N]
                         [--out benchmarks/results.json]
    python -m benchmarks --gpu                # one CUDA GPU: part (a) only, in its GPU configuration

Parts (each compares Ludic with a peer in this run, on this machine):

    a  GRPO step time: Ludic against TRL's GRPOTrainer, same workload   (bench_grpo_vs_trl)
    b  rollout overhead: Ludic's rollout stack against the bare engine  (bench_rollout)
    c  trainer tokens/s against a plain HF forward/backward, and share
       of the measured matmul peak                                      (bench_trainer)
    f  peak memory per trained token of the two sides of (c)            (bench_trainer, fresh processes)
    d  adapter and full-weight push latency                             (bench_push, bench_vllm)
    e  multi-turn: one merged item per episode against one per turn     (bench_multiturn)
    g  overlapped actor/learner (--overlap) against the sync loop       (bench_pipeline)
    h  peak RSS of training per env kind (one turn, tool calls, a two-
       player game), beside the loaded policy's                         (bench_memory, fresh processes)

Parts never run at the same time. A part that fails is reported (and the exit status is 1);
the others still run. ``--quick`` shrinks every part (1 step, a few tokens, no vLLM) for a smoke
check; its numbers are not results. Every part's numbers go to ``--out`` (JSON) and the table
ends the output, under a header naming the CPU, its flags, the core count, torch and the dtype
(and the GPU, where there is one). ``--gpu`` runs part (a) on the GPU: a model of about 1B
parameters, Ludic on an in-process vLLM engine against TRL with colocated vLLM
(``bench_grpo_vs_trl.GPU``); the other parts measure the CPU path and are not run with it.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable

from benchmarks.common import format_table, header, machine_info, row

ORDER = "abcfdegh"
PARTS = {
    "a": "GRPO step: Ludic vs TRL GRPOTrainer",
    "b": "rollout overhead over the bare engine",
    "c": "trainer tokens/s vs plain HF, share of matmul peak",
    "f": "peak RSS per trained token (sides of c)",
    "d": "adapter / full-weight push latency",
    "e": "multi-turn merged vs per-turn items",
    "g": "overlapped actor/learner vs sync loop",
    "h": "peak RSS of training per env kind",
}


def parse_only(text: str | None) -> list[str]:
    """``"c,a"`` -> ``["a", "c"]`` (run order); unknown letters raise."""
    if not text:
        return list(ORDER)
    wanted = {p.strip().lower() for p in text.split(",") if p.strip()}
    bad = wanted - set(PARTS)
    if bad:
        raise SystemExit(f"--only: unknown part(s) {sorted(bad)}; choose from {','.join(ORDER)}")
    return [p for p in ORDER if p in wanted]


def part_runners(args: argparse.Namespace, dtype: str) -> dict[str, Callable[[], dict[str, Any]]]:
    """One zero-argument callable per part. (c) and (f) share one pair of trainer processes."""
    trainer: dict[str, Any] = {}

    def trainer_rows(key: str) -> dict[str, Any]:
        if not trainer:
            from benchmarks import bench_trainer

            trainer.update(bench_trainer.run(dtype, quick=args.quick))
        return {**{k: v for k, v in trainer.items() if not k.startswith("rows")}, "rows": trainer[key]}

    def a() -> dict[str, Any]:
        from benchmarks import bench_grpo_vs_trl

        return bench_grpo_vs_trl.run(None, dtype, quick=args.quick, **(bench_grpo_vs_trl.GPU if args.gpu else {}))

    def b() -> dict[str, Any]:
        from benchmarks import bench_rollout

        return bench_rollout.run(dtype, quick=args.quick)

    def d() -> dict[str, Any]:
        from benchmarks import bench_push

        return bench_push.run(dtype, quick=args.quick)

    def e() -> dict[str, Any]:
        from benchmarks import bench_multiturn

        return bench_multiturn.run(None, dtype, quick=args.quick)

    def g() -> dict[str, Any]:
        from benchmarks import bench_pipeline

        return bench_pipeline.run(dtype, quick=args.quick)

    def h() -> dict[str, Any]:
        from benchmarks import bench_memory

        return bench_memory.run(dtype, quick=args.quick)

    return {"a": a, "b": b, "c": lambda: trainer_rows("rows_c"), "f": lambda: trainer_rows("rows_f"), "d": d, "e": e,
            "g": g, "h": h}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", default=None, help=f"comma list of parts among {','.join(ORDER)} (default: all)")
    ap.add_argument("--quick", action="store_true", help="a smoke check: every part shrunk, vLLM skipped")
    ap.add_argument("--dtype", default="auto", help="auto (bf16 with native CPU bf16 or a GPU, else fp32), "
                                                    "bfloat16, float32")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads here and in the parts' subprocesses (default: torch's own choice)")
    ap.add_argument("--out", default="benchmarks/results.json", help="where every part's numbers go (JSON)")
    ap.add_argument("--gpu", action="store_true", help="part (a) on one CUDA GPU (its GPU configuration)")
    args = ap.parse_args(argv)
    parts = parse_only(args.only)
    if args.gpu:
        import torch

        if not torch.cuda.is_available():
            raise SystemExit("--gpu: no CUDA GPU here (torch.cuda.is_available() is False)")
        if parts != ["a"] and args.only:
            raise SystemExit("--gpu runs part (a) only")
        parts = ["a"]
    if args.threads:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the subprocesses of (c) and (f)
        import torch

        torch.set_num_threads(args.threads)
    from ludic.inference.models import resolve_dtype

    dtype = resolve_dtype(args.dtype)
    info = machine_info(dtype)
    print(header(info), flush=True)
    runners = part_runners(args, dtype)
    results: dict[str, Any] = {}
    rows: list[dict[str, Any]] = []
    failed = []
    for p in parts:
        print(f"\n=== ({p}) {PARTS[p]}{' [quick]' if args.quick else ''} ===", flush=True)
        t0 = time.perf_counter()
        try:
            res = runners[p]()
        except Exception as e:  # report and go on with the other parts
            traceback.print_exc()
            failed.append(p)
            res = {"error": f"{type(e).__name__}: {e}"}
            rows.append(row(p, f"FAILED: {type(e).__name__}: {str(e).splitlines()[0][:80] if str(e) else ''}",
                            None, None, None))
        else:
            rows.extend(res.get("rows", []))
        res["seconds"] = time.perf_counter() - t0
        results[p] = res
        print(f"=== ({p}) done in {res['seconds']:.0f} s ===", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"machine": info, "argv": sys.argv[1:] if argv is None else argv, "quick": args.quick,
           "time": time.strftime("%Y-%m-%d %H:%M:%S"), "parts": results, "rows": rows}
    out.write_text(json.dumps(doc, indent=1, default=str))
    print(f"\n{header(info)}{'  [QUICK: smoke check, not results]' if args.quick else ''}")
    print(format_table(rows))
    print(f"(all numbers: {out})")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
