"""Weight-push latency: how long the trainer's new policy takes to reach the inference engine.

In-process, no vLLM needed (Ludic's ``InProcessPublisher`` into its ``TransformersEngine``):

    adapter (LoRA)   the engine shares the trainer's peft model, so a push only tags the next
                     tokens with the new policy version
    full weights     full fine-tuning with an engine that holds its own copy of the model: the
                     publisher copies the state dict in; the peer is the bare
                     ``engine_model.load_state_dict(model.state_dict())`` it wraps

With vLLM importable (not with --quick), the in-process ``VLLMEngineClient`` through the same
publisher (``bench_vllm.engine_push``): a LoRA r16 adapter (save + load as a new LoRARequest)
and full weights (merge + write safetensors + reload). The HTTP server's push routes are
measured by ``benchmarks/bench_vllm.py``.

With ``--nccl`` (two CUDA GPUs and vLLM's GPU build): full weights into a Ludic vLLM server over NCCL
(``VLLMFullWeightsPublisher(transport="nccl")``), the server on the second GPU and this process, NCCL
rank 0, on the first. NCCL refuses two ranks of one group on one device, so one GPU cannot run it.

    python -m benchmarks.bench_push [--repeats 5] [--dtype auto] [--quick] [--no-vllm] [--model M] [--nccl]

``--model``: a folder, or ``random:<shape>`` (``bench_grpo_vs_trl.SHAPES``); default the packaged model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import format_table, med, row  # noqa: E402


def transformers_push(model_dir: str, dtype: str, repeats: int) -> dict[str, Any]:
    """Medians (seconds) of the in-process pushes into TransformersEngine, and of the bare copy."""
    import torch

    from ludic.inference.models import load_model
    from ludic.inference.publish import InProcessPublisher
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.training.lora import LoraSettings, load_policy

    def timed(fn: Any) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    pm, tok = load_policy(model_dir, lora=LoraSettings(rank=16, alpha=32), dtype=dtype)
    pub = InProcessPublisher(TransformersEngine(pm, tok))
    adapter = [timed(lambda v=v: pub.publish(pm, v)) for v in range(1, repeats + 1)]
    del pm, pub

    model, copy = load_model(model_dir, dtype=dtype), load_model(model_dir, dtype=dtype)
    with torch.no_grad():  # a trained policy differs from the engine's copy
        for p in model.parameters():
            p.add_(1e-3)
    eng = TransformersEngine(copy, tok)
    fpub = InProcessPublisher(eng, mode="full")
    copy.load_state_dict(model.state_dict())  # warm-up: the first write into the loaded copy faults its pages in
    full, bare = [], []
    for v in range(1, repeats + 1):  # alternating, each side first every other time
        pair = [lambda v=v: full.append(timed(lambda: fpub.publish(model, v))),
                lambda: bare.append(timed(lambda: copy.load_state_dict(model.state_dict())))]
        for f in pair if v % 2 else pair[::-1]:
            f()
    ok = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(), copy.state_dict().values()))
    if not ok or eng.policy_version != repeats:
        raise RuntimeError(f"the full-weight push did not reach the engine (weights equal: {ok}, "
                           f"version {eng.policy_version})")
    mb = sum(p.numel() * p.element_size() for p in model.state_dict().values()) / 1e6
    return {"adapter_shared_s": med(adapter), "full_copy_s": med(full), "bare_load_state_dict_s": med(bare),
            "full_mb": mb, "repeats": repeats}


def vllm_push(model_dir: str, dtype: str) -> dict[str, Any]:
    """``bench_vllm.engine_push`` on a fresh in-process VLLMEngineClient (LoRA enabled)."""
    from benchmarks.bench_vllm import engine_push

    from ludic.inference.vllm_engine import VLLMEngineClient

    t0 = time.perf_counter()
    eng = VLLMEngineClient(model_dir, dtype=dtype, disable_log_stats=True)
    startup = time.perf_counter() - t0
    try:
        out = engine_push(eng, Path(model_dir), dtype)
    finally:
        eng.close()
    return {"startup_s": startup, **out}


def nccl_push(model_dir: str, dtype: str, repeats: int) -> dict[str, Any]:
    """Full weights over NCCL into a Ludic vLLM server started here on the second GPU (this process
    sends from the first): the server's start-up, then the median of ``repeats`` pushes (versions
    1..repeats, each after a change of the weights), checked against the server's policy version."""
    import httpx
    import torch

    from ludic.inference.models import load_model
    from ludic.inference.vllm_launcher import VLLMServerProcess
    from ludic.inference.vllm_publish import VLLMFullWeightsPublisher

    if torch.cuda.device_count() < 2:
        raise SystemExit(f"the NCCL push needs 2 CUDA GPUs (this machine has {torch.cuda.device_count()}): "
                         "NCCL refuses two ranks of one group on one device")
    server = VLLMServerProcess(model_dir, dtype=dtype, extra_args=["--gpu-memory-utilization", "0.5"])
    server.env["CUDA_VISIBLE_DEVICES"] = "1"
    t0 = time.perf_counter()
    server.start()
    startup = time.perf_counter() - t0
    try:
        model = load_model(model_dir, dtype=dtype, device="cuda:0")
        pub = VLLMFullWeightsPublisher([server.url], transport="nccl", dtype=getattr(torch, dtype))
        runs = []
        for v in range(1, repeats + 1):
            with torch.no_grad():  # a new policy each time
                for p in model.parameters():
                    p.add_(1e-3)
            r = pub.publish(model, v)
            if r["errors"]:
                raise RuntimeError(f"NCCL push {v} failed: {r['errors']}")
            runs.append(r)
        version = httpx.get(server.url + "/ludic/policy", timeout=30).json().get("version")
        if version != repeats:
            raise RuntimeError(f"the server reports policy version {version} after pushing 1..{repeats}")
    finally:
        server.stop()
    return {"startup_s": startup, "total_s": med([r["total_s"] for r in runs]),
            "merge_s": med([r["extract_s"] for r in runs]),
            "nccl_s": med([r["servers"][server.url]["nccl_s"] for r in runs]), "mb": runs[0]["bytes"] / 1e6,
            "repeats": repeats}


def run(dtype: str = "auto", *, quick: bool = False, repeats: int | None = None, use_vllm: bool = True,
        model: str | None = None, nccl: bool = False) -> dict[str, Any]:
    """Part (d) of the runner. ``model``: see ``bench_grpo_vs_trl.model_dir_for``; ``nccl``: also the
    NCCL push (``nccl_push``: two GPUs)."""
    from benchmarks.bench_grpo_vs_trl import model_dir_for
    from benchmarks.bench_rollout import vllm_available

    from ludic.inference.models import resolve_dtype

    dtype, model_dir = resolve_dtype(dtype), model_dir_for(model)
    repeats = repeats or (2 if quick else 5)
    tp = transformers_push(model_dir, dtype, repeats)
    print(f"[push] TransformersEngine in-process, {dtype}, median of {repeats}: adapter (shared model) "
          f"{tp['adapter_shared_s'] * 1e3:.3f} ms; full weights ({tp['full_mb']:.0f} MB) {tp['full_copy_s'] * 1e3:.1f} ms "
          f"vs bare load_state_dict {tp['bare_load_state_dict_s'] * 1e3:.1f} ms", flush=True)
    out: dict[str, Any] = {"transformers": tp, "dtype": dtype}
    rows = [
        row("d", "push LoRA to TransformersEngine (shared model: version tag)", tp["adapter_shared_s"] * 1e3, None,
            None, unit="ms"),
        row("d", "push full weights to TransformersEngine copy / bare load_state_dict", tp["full_copy_s"] * 1e3,
            tp["bare_load_state_dict_s"] * 1e3, tp["full_copy_s"] / tp["bare_load_state_dict_s"], unit="ms",
            ratio_kind="%"),
    ]
    why = "--quick" if quick else ("disabled" if not use_vllm else vllm_available())
    if why is None:
        vp = vllm_push(model_dir, dtype)
        out["vllm"] = vp
        a, f = vp["engine_adapter_push"], vp["engine_full_push"]
        print(f"[push] in-process vLLM (startup {vp['startup_s']:.0f} s): adapter "
              + ", ".join(f"{k}={v:.3f}" for k, v in a.items()) + "; full "
              + ", ".join(f"{k}={v:.3f}" for k, v in f.items()), flush=True)
        rows += [row("d", "push LoRA adapter to in-process vLLM (save + load)", a["total_s"] * 1e3, None, None,
                     unit="ms"),
                 row("d", "push full weights to in-process vLLM (merge + write + reload)", f["total_s"] * 1e3, None,
                     None, unit="ms")]
    else:
        out["vllm_skipped"] = why
        print(f"[push] vLLM push skipped: {why}", flush=True)
    if nccl and why is None:
        np_ = nccl_push(model_dir, dtype, repeats)
        out["nccl"] = np_
        print(f"[push] NCCL into a vLLM server (startup {np_['startup_s']:.0f} s), {np_['mb']:.0f} MB, median of "
              f"{repeats}: total {np_['total_s'] * 1e3:.1f} ms (merge {np_['merge_s'] * 1e3:.1f} ms, "
              f"NCCL {np_['nccl_s'] * 1e3:.1f} ms)", flush=True)
        rows.append(row("d", "push full weights to a vLLM server over NCCL", np_["total_s"] * 1e3, None, None,
                        unit="ms"))
    out["rows"] = rows
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--repeats", type=int, default=None, help="default 5; 2 with --quick")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--no-vllm", action="store_true")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--model", default=None, help="a model folder, or random:<shape>; default: the packaged model")
    ap.add_argument("--nccl", action="store_true", help="also push full weights over NCCL (two GPUs, vLLM)")
    args = ap.parse_args()
    out = run(args.dtype, quick=args.quick, repeats=args.repeats, use_vllm=not args.no_vllm, model=args.model,
              nccl=args.nccl)
    print(format_table(out["rows"]))


if __name__ == "__main__":
    main()
