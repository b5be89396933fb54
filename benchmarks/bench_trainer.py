"""Trainer throughput and memory: Ludic's training step against a plain Hugging Face step, same tokens.

Workload: ``--items`` items (default 16) that share one ``--prompt-len``-token prompt (120: the
tic-tac-toe system prompt and a board, cut to length) and each carry ``--completion-len``
(32) trained completion tokens; SmolLM2-135M-Instruct with LoRA r16 / alpha 32 on every
linear layer (``--full``: full fine-tuning), AdamW lr 1e-5, gradient clipping at 1.0.

    ludic  ``Trainer.train_step`` on an ``OfflineBatchSource`` with ``make_sft`` (the library's
           real path: split_by_token_budget -> collate -> score_actions, which shares the prompt
           prefix and applies the LM head on the scored positions only -> compute_loss ->
           backward -> clip -> fused AdamW)
    hf     ``model(input_ids, attention_mask).logits`` on the right-padded batch -> log_softmax
           over the full sequence -> gather the next tokens -> mean over the completion tokens
           -> backward -> clip -> AdamW (no prefix sharing)

Each side runs in a fresh process, so that its peak resident memory is its own (the peak is
reset after the model is loaded, and the growth over the loaded model is reported per trained
token). Throughput is also given as a share of the machine's measured matmul peak in the run's
dtype, from the model FLOPs of one step (``train_flops``):

    N  = non-embedding parameters of the base model, N_lora = LoRA parameters,
    T  = sequence tokens (prompt + completion of every item, no padding, no prefix sharing),
    S  = scored (completion) tokens, H = hidden size, V = vocabulary
    forward                    2 (N + N_lora) T + 2 H V S
    backward, activations      2 (N + N_lora) T + 2 H V S
    backward, weight gradients 2 N_lora T              (LoRA; full fine-tuning: 2 N T + 2 H V S)
    attention-score FLOPs (T^2 terms) are left out, as in the usual 6 N T count

Both sides are charged the same model FLOPs for the same items (computation saved by prefix
sharing or by skipping the LM head on prompt positions counts as throughput).

    python -m benchmarks.bench_trainer [--steps 3] [--dtype auto] [--full] [--quick]
    python -m benchmarks.bench_trainer --side ludic --json     # one side, in this process
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import at_least, matmul_peak_gflops, med, reset_peak_rss, row, rss_mb  # noqa: E402

LORA = {"r": 16, "alpha": 32, "targets": "all-linear"}
BOARD = "Board:\n A . . .\n B . X .\n C . . O\nYou are X. Your move."


# ----------------------------------------------------------------------------- FLOPs (pure)


def train_flops(*, nonembed: int, lora: int, hidden: int, vocab: int, seq_tokens: int, scored_tokens: int,
                full: bool) -> dict[str, int]:
    """Model FLOPs of one training step (forward + backward) on ``seq_tokens`` tokens of which
    ``scored_tokens`` are scored by the LM head; see the module docstring for the formula."""
    decoder = nonembed + lora
    head = 2 * hidden * vocab * scored_tokens
    forward = 2 * decoder * seq_tokens + head
    backward_act = 2 * decoder * seq_tokens + head
    backward_w = 2 * nonembed * seq_tokens + head if full else 2 * lora * seq_tokens
    return {"forward": forward, "backward_activations": backward_act, "backward_weights": backward_w,
            "total": forward + backward_act + backward_w}


FORMULA = ("FLOPs/step = fwd 2(N+N_lora)T + 2HVS  +  bwd-act 2(N+N_lora)T + 2HVS  +  bwd-weights "
           "{w}   (N non-embedding params, T sequence tokens, S scored tokens, H hidden, V vocab)")


def formula(full: bool) -> str:
    return FORMULA.format(w="2NT + 2HVS (full)" if full else "2 N_lora T (LoRA)")


def param_counts(model: Any) -> dict[str, int]:
    """Non-embedding parameters of the base model, LoRA parameters, hidden size and vocabulary of an
    HF causal LM (peft-wrapped or not). A tied LM head is the input embedding and counts once."""
    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    emb = base.get_input_embeddings().weight
    head = base.get_output_embeddings().weight
    total = lora = 0
    for name, p in model.named_parameters():
        if "lora_" in name:
            lora += p.numel()
        else:
            total += p.numel()
    tied = head.data_ptr() == emb.data_ptr()
    nonembed = total - emb.numel() - (0 if tied else head.numel())
    return {"nonembed": nonembed, "lora": lora, "hidden": int(emb.shape[1]), "vocab": int(head.shape[0]),
            "tied": tied}


# ----------------------------------------------------------------------------- workload


def make_items(tok: Any, n_items: int = 16, prompt_len: int = 120, completion_len: int = 32) -> list[Any]:
    """``n_items`` SFT items sharing one ``prompt_len``-token chat prompt, each with its own
    ``completion_len`` completion tokens (distinct texts cut to length)."""
    from ludic.tictactoe.prompts import SYSTEM_PROMPT
    from ludic.tokenization import encode, render_ids
    from ludic.types import SAWItem

    prompt = render_ids(tok, [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": BOARD}])
    while len(prompt) < prompt_len:
        prompt += encode(tok, " " + SYSTEM_PROMPT)
    prompt = prompt[:prompt_len]
    items = []
    for i in range(n_items):
        ids = encode(tok, f"<think>Line {i}: the centre is taken, so I block row {'ABC'[i % 3]} and "
                          f"keep the corner {i % 9 + 1} open for a fork.</think><move>{'ABC'[i % 3]}{i % 3 + 1}</move>")
        while len(ids) < completion_len:
            ids += ids
        items.append(SAWItem(tuple(prompt), tuple(ids[:completion_len]), 1.0))
    return items


def load(model_dir: str, dtype: str, full: bool) -> tuple[Any, Any]:
    """The model (LoRA-wrapped unless ``full``) and tokenizer, the same way on both sides:
    ``from_pretrained`` (sdpa attention) and peft's ``get_peft_model``."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    tok = AutoTokenizer.from_pretrained(model_dir)
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    if not full:
        model = get_peft_model(model, LoraConfig(r=LORA["r"], lora_alpha=LORA["alpha"],
                                                 target_modules=LORA["targets"], task_type="CAUSAL_LM"))
    return model, tok


def ludic_step_fn(model: Any, tok: Any, items: list[Any]) -> Any:
    """One call = ``Trainer.train_step`` on the whole item list (offline SFT batch)."""
    from ludic.data.offline import OfflineBatchSource
    from ludic.training.algorithms import make_sft
    from ludic.training.trainer import Trainer, TrainerConfig

    trainer = Trainer(model, make_sft(), OfflineBatchSource(items, len(items), shuffle=False),
                      TrainerConfig(lr=1e-5, max_grad_norm=1.0), pad_token_id=tok.pad_token_id)

    def step() -> dict[str, Any]:
        m = asyncio.run(trainer.train_step())
        return {"trained_tokens": int(m["action_tokens"]), "loss": float(m["loss"])}

    return step


def hf_step_fn(model: Any, tok: Any, items: list[Any]) -> Any:
    """One call = a plain padded forward/backward over the full logits, then clip and AdamW."""
    import torch

    B, T = len(items), max(len(it.prompt_ids) + len(it.completion_ids) for it in items)
    ids = torch.full((B, T), tok.pad_token_id, dtype=torch.long)
    attn = torch.zeros((B, T), dtype=torch.long)
    scored = torch.zeros((B, T), dtype=torch.float32)  # 1 where the token is a completion token
    for b, it in enumerate(items):
        seq = list(it.prompt_ids) + list(it.completion_ids)
        ids[b, : len(seq)] = torch.tensor(seq)
        attn[b, : len(seq)] = 1
        scored[b, len(it.prompt_ids): len(seq)] = 1
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-5)

    def step() -> dict[str, Any]:
        model.train()
        logits = model(input_ids=ids, attention_mask=attn).logits
        logp = torch.log_softmax(logits.float(), dim=-1)
        lp = logp[:, :-1].gather(-1, ids[:, 1:, None])[..., 0]
        mask = scored[:, 1:]
        loss = -(lp * mask).sum() / mask.sum()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return {"trained_tokens": int(mask.sum()), "loss": float(loss.detach())}

    return step


def run_side(side: str, model_dir: str, dtype: str, *, items: int = 16, prompt_len: int = 120,
             completion_len: int = 32, steps: int = 3, full: bool = False) -> dict[str, Any]:
    """Load, build the step of ``side`` ("ludic" or "hf"), reset the peak RSS, run 1 warm-up step
    and ``steps`` timed ones. Run it in a fresh process for a meaningful memory peak."""
    import torch

    model, tok = load(model_dir, dtype, full)
    work = make_items(tok, items, prompt_len, completion_len)
    make = {"ludic": ludic_step_fn, "hf": hf_step_fn}[side]
    step = make(model, tok, work)
    counts = param_counts(model)
    loaded = rss_mb()
    reset = reset_peak_rss()
    times, trained, losses = [], [], []
    for k in range(steps + 1):
        t0 = time.perf_counter()
        out = step()
        dt = time.perf_counter() - t0
        if k:  # the first step warms up
            times.append(dt)
        trained.append(out["trained_tokens"])
        losses.append(out["loss"])
    mem = rss_mb()
    seq_tokens = sum(it.num_tokens for it in work)
    flops = train_flops(seq_tokens=seq_tokens, scored_tokens=trained[0], full=full,
                        **{k: counts[k] for k in ("nonembed", "lora", "hidden", "vocab")})
    s = med(times)
    return {
        "side": side, "dtype": dtype, "full": full, "threads": torch.get_num_threads(),
        "items": items, "prompt_len": prompt_len, "completion_len": completion_len,
        "seq_tokens_per_step": seq_tokens, "trained_tokens_per_step": trained[0], "trained_tokens_all": trained,
        "step_s": s, "step_times": times, "losses": losses,
        "tokens_per_s": seq_tokens / s, "trained_tokens_per_s": trained[0] / s,
        "flops_per_step": flops, "model_gflops": flops["total"] / s / 1e9, "params": counts,
        "rss_loaded_mb": loaded.get("rss_mb"), "peak_reset": reset,
        "peak_rss_mb": mem.get("peak_mb", mem["maxrss_mb"]), "maxrss_mb": mem["maxrss_mb"],
        "train_peak_growth_mb": mem.get("peak_mb", mem["maxrss_mb"]) - (loaded.get("rss_mb") or 0.0),
    }


# ----------------------------------------------------------------------------- both sides


def run_subprocess(side: str, model_dir: str, dtype: str, **kw: Any) -> dict[str, Any]:
    """``run_side`` in a fresh ``python -m benchmarks.bench_trainer --side ... --json`` process."""
    root = Path(__file__).resolve().parent.parent
    cmd = [sys.executable, "-m", "benchmarks.bench_trainer", "--side", side, "--json", "--model", model_dir,
           "--dtype", dtype, "--items", str(kw["items"]), "--prompt-len", str(kw["prompt_len"]),
           "--completion-len", str(kw["completion_len"]), "--steps", str(kw["steps"])] + (["--full"] if kw["full"] else [])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("JSON: ")]
    if proc.returncode != 0 or not lines:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return json.loads(lines[-1][len("JSON: "):])


def describe(r: dict[str, Any]) -> str:
    return (f"{r['side']:5s}  {r['step_s']:6.2f} s/step  {r['tokens_per_s']:7.1f} tok/s "
            f"({r['trained_tokens_per_s']:6.1f} trained tok/s)  {r['model_gflops']:6.1f} model GFLOP/s  "
            f"peak RSS {r['peak_rss_mb']:.0f} MB (+{r['train_peak_growth_mb']:.0f} MB over the loaded model)  "
            f"loss {r['losses'][0]:.3f}")


def run(dtype: str = "auto", *, quick: bool = False, steps: int | None = None, items: int | None = None,
        prompt_len: int = 120, completion_len: int = 32, full: bool = False, model: str | None = None) -> dict[str, Any]:
    """Both sides (each in its own process) and the matmul peak: parts (c) and (f) of the runner."""
    from ludic.inference.models import resolve_dtype, resolve_model

    dtype = resolve_dtype(dtype)
    model_dir = resolve_model(model)
    kw = {"items": items or (4 if quick else 16), "prompt_len": prompt_len, "completion_len": completion_len,
          "steps": steps or (1 if quick else 3), "full": full}
    print(f"[trainer] {kw['items']} items x ({prompt_len} shared prompt + {completion_len} completion) tokens, "
          f"{'full fine-tuning' if full else 'LoRA r{r} alpha {alpha} {targets}'.format(**LORA)}, {dtype}, "
          f"AdamW 1e-5, clip 1.0, 1 warm-up + {kw['steps']} timed steps, each side in a fresh process", flush=True)
    peak = matmul_peak_gflops(dtype, seconds=1.0 if quick else 3.0)
    print(f"[trainer] matmul peak: {peak['gflops']:.1f} GFLOP/s ({peak['n']}x{peak['n']} {dtype}, "
          f"{peak['repeats']} repeats)", flush=True)
    sides = {}
    for side in ("ludic", "hf"):
        sides[side] = run_subprocess(side, model_dir, dtype, **kw)
        print(f"[trainer] {describe(sides[side])}", flush=True)
    lu, hf = sides["ludic"], sides["hf"]
    fl = lu["flops_per_step"]
    print(f"[trainer] {formula(full)}")
    p = lu["params"]
    print(f"[trainer]   N={p['nonembed']:,} N_lora={p['lora']:,} H={p['hidden']} V={p['vocab']} "
          f"T={lu['seq_tokens_per_step']} S={lu['trained_tokens_per_step']}: "
          f"{fl['total'] / 1e9:.1f} GFLOP/step (fwd {fl['forward'] / 1e9:.1f}, bwd-act "
          f"{fl['backward_activations'] / 1e9:.1f}, bwd-weights {fl['backward_weights'] / 1e9:.2f})")
    share = {k: sides[k]["model_gflops"] / peak["gflops"] for k in sides}
    print(f"[trainer] share of matmul peak: ludic {share['ludic']:.1%}, hf {share['hf']:.1%}")
    if lu["trained_tokens_per_step"] != hf["trained_tokens_per_step"]:
        print(f"[trainer] WARNING: trained tokens differ: ludic {lu['trained_tokens_per_step']}, "
              f"hf {hf['trained_tokens_per_step']}")
    per_tok = {k: sides[k]["train_peak_growth_mb"] * 1024 / sides[k]["trained_tokens_per_step"] for k in sides}
    speed = lu["tokens_per_s"] / hf["tokens_per_s"]
    rows_c = [
        row("c", "trainer tok/s (Ludic train_step / HF fwd+bwd)", lu["tokens_per_s"], hf["tokens_per_s"], speed,
            unit="tok/s", goal=">=1.5x", met=at_least(speed, 1.5)),
        row("c", f"share of {dtype} matmul peak ({peak['gflops']:.0f} GFLOP/s)", share["ludic"] * 100,
            share["hf"] * 100, share["ludic"] / share["hf"], unit="%", goal="report"),
    ]
    rows_f = [
        row("f", "train peak RSS growth per trained token (HF / Ludic)", per_tok["ludic"], per_tok["hf"],
            per_tok["hf"] / per_tok["ludic"] if per_tok["ludic"] > 0 else None, unit="KB/tok"),
        row("f", "process peak RSS (HF / Ludic)", lu["peak_rss_mb"], hf["peak_rss_mb"],
            hf["peak_rss_mb"] / lu["peak_rss_mb"], unit="MB"),
    ]
    return {"config": {**kw, "dtype": dtype, "model": model_dir, "lora": None if full else LORA},
            "matmul_peak": peak, "ludic": lu, "hf": hf, "share_of_peak": share, "formula": formula(full),
            "peak_rss_kb_per_trained_token": per_tok, "rows_c": rows_c, "rows_f": rows_f, "rows": rows_c + rows_f}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--side", choices=("ludic", "hf", "both"), default="both")
    ap.add_argument("--json", action="store_true", help="print the result as one 'JSON: {...}' line")
    ap.add_argument("--model", default=None, help="model folder (default: the packaged SmolLM2-135M-Instruct)")
    ap.add_argument("--dtype", default="auto")
    ap.add_argument("--items", type=int, default=None, help="items per step (default 16; 4 with --quick)")
    ap.add_argument("--prompt-len", type=int, default=120)
    ap.add_argument("--completion-len", type=int, default=32)
    ap.add_argument("--steps", type=int, default=None, help="timed steps after 1 warm-up (default 3; 1 with --quick)")
    ap.add_argument("--full", action="store_true", help="full fine-tuning instead of LoRA r16")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    if args.side == "both":
        out = run(args.dtype, quick=args.quick, steps=args.steps, items=args.items, prompt_len=args.prompt_len,
                  completion_len=args.completion_len, full=args.full, model=args.model)
        from benchmarks.common import format_table

        print(format_table(out["rows"]))
    else:
        from ludic.inference.models import resolve_dtype, resolve_model

        out = run_side(args.side, resolve_model(args.model), resolve_dtype(args.dtype),
                       items=args.items or (4 if args.quick else 16), prompt_len=args.prompt_len,
                       completion_len=args.completion_len, steps=args.steps or (1 if args.quick else 3),
                       full=args.full)
        if not args.json:
            print(describe(out))
    if args.json:
        print("JSON: " + json.dumps(out, default=str), flush=True)


if __name__ == "__main__":
    main()
