"""vLLM server vs in-process vLLM vs in-process transformers, one run, same workload.

    python benchmarks/bench_vllm.py [--n 64] [--max-tokens 64] [--skip server,engine,hf]

Workload: ``--n`` chat prompts (token-in, chat template applied locally), one completion
each of at most ``--max-tokens`` tokens at temperature 1 (seeded), all submitted at once
through the ChatClient interface, on SmolLM2-135M-Instruct (the packaged model).
Reported: completions/s and completion tokens/s per route, their ratios to the
transformers route, and weight-push latency (LoRA adapter and full weights) for the
server and the in-process vLLM engine. Routes run one after another (never at the same
time), each after a short warm-up; start-up time is reported separately.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TOPICS = ["the sea", "mountains", "a cat", "coffee", "the moon", "trains", "autumn", "chess",
          "rain", "a library", "bicycles", "bread", "the desert", "music", "snow", "a garden"]


def prompt_texts(n: int) -> list[str]:
    """``n`` short user requests (4 kinds x 16 topics, cycled)."""
    kinds = ["Write a short poem about {}.", "Tell me three facts about {}.",
             "Describe {} in two sentences.", "Why do people like {}?"]
    return [kinds[i % 4].format(TOPICS[i % 16]) for i in range(n)]


def prompts(tokenizer: Any, n: int) -> list[tuple[int, ...]]:
    from ludic.tokenization import render_ids

    return [tuple(render_ids(tokenizer, [{"role": "user", "content": t}])) for t in prompt_texts(n)]


async def run_workload(client: Any, ids: list[tuple[int, ...]], max_tokens: int) -> dict[str, float]:
    from ludic.inference.client import ChatRequest, SamplingParams
    from ludic.types import FinishReason

    reqs = [ChatRequest([], SamplingParams(temperature=1.0, max_tokens=max_tokens, seed=i), prompt_ids=p)
            for i, p in enumerate(ids)]
    t0 = time.perf_counter()
    outs = await asyncio.gather(*(client.complete(r) for r in reqs))
    dt = time.perf_counter() - t0
    failed = sum(o.finish_reason == FinishReason.ERROR for o in outs)
    toks = sum(len(o.trace.completion_ids) for o in outs)
    return {"seconds": dt, "completions_per_s": len(outs) / dt, "tokens_per_s": toks / dt,
            "tokens": toks, "failed": failed}


async def warm(client: Any, ids: list[tuple[int, ...]]) -> None:
    await run_workload(client, ids[:4], 8)


def peft_model(model_dir: Path, dtype: str = "bfloat16") -> Any:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype))
    cfg = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj",
                                                          "gate_proj", "up_proj", "down_proj"])
    pm = get_peft_model(model, cfg)
    with torch.no_grad():
        for name, p in pm.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.01)
    return pm


def auto_dtype() -> str:
    """bf16 where the CPU has native bf16 matmuls (AVX512-BF16 / AMX) or on GPUs; else fp32.

    Without them bf16 matmuls are emulated: on an AVX2-only EPYC, 1.2 GFLOP/s in bf16 vs 41
    in fp32 per core, and vLLM CPU generates ~5x faster in fp32.
    """
    import torch

    if torch.cuda.is_available():
        return "bfloat16"
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return "float32"
    return "bfloat16" if ("avx512_bf16" in flags or "amx_bf16" in flags) else "float32"


def med(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


# ---------------------------------------------------------------------------- routes


def bench_server(model_dir: Path, ids: list[tuple[int, ...]], max_tokens: int, out: dict[str, Any],
                 dtype: str) -> None:
    import torch

    from ludic.inference.vllm_publish import VLLMAdapterPublisher, VLLMFullWeightsPublisher
    from ludic.inference.vllm_client import VLLMChatClient

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(Path(tempfile.gettempdir()) / "ludic-bench-vllm-server.log", "wb")
    push_root = Path(tempfile.mkdtemp(prefix="ludic-bench-push-"))  # the server loads only from allowed roots
    cmd = [sys.executable, "-m", "ludic.inference.vllm_server", "--model", str(model_dir),
           "--allowed-weight-dirs", str(push_root),
           "--port", str(port), "--enforce-eager", "--dtype", dtype, "--max-model-len", "2048",
           "--enable-lora", "--max-lora-rank", "16", "--uvicorn-log-level", "warning",
           "--disable-log-stats"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        client = VLLMChatClient(url, tokenizer=str(model_dir), max_concurrency=len(ids), timeout_s=600)
        asyncio.run(client.wait_ready(600))
        out["server_startup_s"] = time.perf_counter() - t0
        asyncio.run(warm(client, ids))
        out["server"] = asyncio.run(run_workload(client, ids, max_tokens))
        print(f"server route: {out['server']}", flush=True)

        pm = peft_model(model_dir, dtype)
        with tempfile.TemporaryDirectory(dir=push_root) as d:
            pub = VLLMAdapterPublisher([url], Path(d) / "adapters")
            runs = [pub.publish(pm, v) for v in (1, 2, 3)]
            assert not any(r["errors"] for r in runs), [r["errors"] for r in runs]
            out["server_adapter_push"] = {
                "total_s": med([r["total_s"] for r in runs]), "save_s": med([r["save_s"] for r in runs]),
                "load_switch_s": med([r["push_s"] for r in runs])}
            for transport, versions in (("path", (4, 5)), ("upload", (6, 7))):
                fpub = VLLMFullWeightsPublisher([url], Path(d) / "full", transport=transport,
                                                dtype=getattr(torch, dtype))
                runs = [fpub.publish(pm, v) for v in versions]
                assert not any(r["errors"] for r in runs), [r["errors"] for r in runs]
                srv = [r["servers"][url] for r in runs]
                out[f"server_full_push_{transport}"] = {
                    "total_s": med([r["total_s"] for r in runs]),
                    "merge_s": med([r["extract_s"] for r in runs]),
                    "serialize_s": med([r["serialize_s"] for r in runs]),
                    "http_s": med([s["http_s"] for s in srv]),
                    "server_receive_s": med([s.get("receive_s", 0.0) for s in srv]),
                    "server_reload_s": med([s["reload_s"] for s in srv]),
                    "mb": runs[0]["bytes"] / 1e6}
        # generation still works on the pushed policy
        after = asyncio.run(run_workload(client, ids[:8], 16))
        assert after["failed"] == 0, after
    finally:
        os.killpg(os.getpgid(proc.pid), signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        try:
            os.killpg(os.getpgid(proc.pid), signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass


def bench_engine(model_dir: Path, ids: list[tuple[int, ...]], max_tokens: int, out: dict[str, Any],
                 dtype: str) -> None:
    from ludic.inference.vllm_engine import VLLMEngineClient

    t0 = time.perf_counter()
    eng = VLLMEngineClient(str(model_dir), dtype=dtype, disable_log_stats=True)
    out["engine_startup_s"] = time.perf_counter() - t0
    try:
        asyncio.run(warm(eng, ids))
        out["engine"] = asyncio.run(run_workload(eng, ids, max_tokens))
        print(f"in-process vLLM route: {out['engine']}", flush=True)
        out.update(engine_push(eng, model_dir, dtype))
        after = asyncio.run(run_workload(eng, ids[:8], 16))
        assert after["failed"] == 0, after
    finally:
        eng.close()


def engine_push(eng: Any, model_dir: Path, dtype: str, adapter_versions: tuple[int, ...] = (1, 2, 3),
                full_versions: tuple[int, ...] = (4, 5)) -> dict[str, Any]:
    """Weight-push latency into a running ``VLLMEngineClient`` through ``InProcessPublisher``: a LoRA
    r16 adapter (save + load as a new LoRARequest) and full weights (merge + write + reload),
    medians over the given versions (each must be newer than the engine's)."""
    from ludic.inference.publish import InProcessPublisher

    out: dict[str, Any] = {}
    pm = peft_model(model_dir, dtype)
    with tempfile.TemporaryDirectory() as d:
        pub = InProcessPublisher(eng, mode="adapter", out_dir=Path(d) / "a")
        runs = [pub.publish(pm, v) for v in adapter_versions]
        out["engine_adapter_push"] = {"total_s": med([r["total_s"] for r in runs]),
                                      "save_s": med([r["save_s"] for r in runs]),
                                      "load_switch_s": med([r["push_s"] for r in runs])}
        fpub = InProcessPublisher(eng, mode="full", out_dir=Path(d) / "f")
        runs = [fpub.publish(pm, v) for v in full_versions]
        out["engine_full_push"] = {"total_s": med([r["total_s"] for r in runs]),
                                   "merge+write_s": med([r["save_s"] for r in runs]),
                                   "reload_s": med([r["push_s"] for r in runs])}
    return out


def bench_hf(model_dir: Path, ids: list[tuple[int, ...]], max_tokens: int, out: dict[str, Any],
             dtype: str) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from ludic.inference.models import load_tokenizer
    from ludic.inference.transformers_engine import TransformersEngine

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=getattr(torch, dtype), attn_implementation="sdpa")
    eng = TransformersEngine(model, load_tokenizer(str(model_dir)), max_batch_size=len(ids))
    asyncio.run(warm(eng, ids))
    out["hf"] = asyncio.run(run_workload(eng, ids, max_tokens))
    print(f"in-process transformers route: {out['hf']}", flush=True)


def report(out: dict[str, Any], n: int, max_tokens: int, dtype: str) -> None:
    print(f"\n=== {n} prompts x <= {max_tokens} tokens, temperature 1, SmolLM2-135M-Instruct {dtype}, "
          f"{os.cpu_count()} CPU cores ===")
    names = {"server": "vLLM server (HTTP, VLLMChatClient)", "engine": "vLLM in-process (VLLMEngineClient)",
             "hf": "transformers in-process (TransformersEngine)"}
    base = out.get("hf")
    print(f"{'route':44s} {'compl/s':>8s} {'tok/s':>8s} {'tokens':>7s} {'s':>6s}  vs transformers")
    for key, label in names.items():
        if key not in out:
            continue
        r = out[key]
        ratio = f"{r['tokens_per_s'] / base['tokens_per_s']:.2f}x tok/s, " \
                f"{r['completions_per_s'] / base['completions_per_s']:.2f}x compl/s" if base else "-"
        print(f"{label:44s} {r['completions_per_s']:8.2f} {r['tokens_per_s']:8.1f} {r['tokens']:7d} "
              f"{r['seconds']:6.1f}  {ratio}")
    if "server" in out and "engine" in out:
        print(f"in-process vLLM / server: {out['engine']['tokens_per_s'] / out['server']['tokens_per_s']:.2f}x tok/s")
    for k in ("server_startup_s", "engine_startup_s"):
        if k in out:
            print(f"{k}: {out[k]:.1f}")
    for k in ("server_adapter_push", "server_full_push_path", "server_full_push_upload",
              "engine_adapter_push", "engine_full_push"):
        if k in out:
            print(f"{k}: " + ", ".join(f"{a}={b:.3f}" for a, b in out[k].items()))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=64)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--dtype", default="auto", help="auto (bf16 with native CPU bf16, else fp32), bfloat16, float32")
    ap.add_argument("--skip", default="", help="comma list of routes to skip: server,engine,hf")
    args = ap.parse_args()
    from ludic.inference.models import load_tokenizer, packaged_model_dir

    model_dir = packaged_model_dir()
    ids = prompts(load_tokenizer(str(model_dir)), args.n)
    skip = set(filter(None, args.skip.split(",")))
    dtype = auto_dtype() if args.dtype == "auto" else args.dtype
    out: dict[str, Any] = {}
    if "server" not in skip:
        bench_server(model_dir, ids, args.max_tokens, out, dtype)
    if "engine" not in skip:
        bench_engine(model_dir, ids, args.max_tokens, out, dtype)
    if "hf" not in skip:
        bench_hf(model_dir, ids, args.max_tokens, out, dtype)
    report(out, args.n, args.max_tokens, dtype)


if __name__ == "__main__":
    main()
