"""The frozen-bottom caches per prompt against a full pass over every layer, one run, on the rewards-only
tic-tac-toe recipe's batches.

Workload: the recipe's RL model (the packaged SmolLM2-135M-Instruct, a rank-16 LoRA on its top 15 of 30 layers,
everything else frozen) and its prompts (the 335 positions, ``--teacher none``'s view: ~72 tokens each, replies
of ~3). A batch is 16 positions, 3 samples each at temperature 0.7 (the fourth of a group is an exploring move,
not sampled), trained as 64 items. Both sides see the same batches, alternating (so a drift in the machine's speed
hits both), after a first pass over all 335 positions has filled the caches (the recipe revisits them for half an
hour):

    sampling  TransformersEngine()                         the prompts' bottom 15 layers read from the cache
              TransformersEngine(bottom_cache_bytes=0)      every layer prefilled (before this cache)
    training  forward + backward of the trainer's scoring pass (``score_actions``, the packed layout) with
              FrozenBottomCache(per="prompt") against without

Prints the median seconds of each side, the ratio full / cached, with the CPU's flags and the dtype, and checks
that the cache changes nothing the model learns from: the greedy replies to every batch (the same in both), the
sampled replies' log-probs, and the trainer's log-probs and LoRA gradients (relative difference).

    python benchmarks/bench_bottom_cache.py [--batches 8] [--dtype auto]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make the repository root importable
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _items(tok, seeds=4):
    """The recipe's prompts with ``seeds`` random-cell replies each: (prompt ids per position, items per position)."""
    from ludic.tictactoe.recipe import RecipeConfig
    from ludic.tictactoe.synth import random_cell_records
    from ludic.data.offline import sft_item

    cfg = RecipeConfig()
    per_position = []
    for seed in range(seeds):
        records = random_cell_records(cfg.system_prompt, compact=cfg.compact, style=cfg.answer, show_moves=True,
                                      per_position=1, seed=seed)
        per_position.append([sft_item(r, tok) for r in records])
    return [list(group) for group in zip(*per_position)]


def main(argv: list[str] | None = None) -> dict:
    import torch

    from benchmarks.common import header, machine_info, med
    from ludic.inference.client import SamplingParams
    from ludic.inference.models import DEFAULT_MODEL, mark_trained, resolve_dtype
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.tictactoe.prompts import ANSWER_TOKENS
    from ludic.tictactoe.recipe import RecipeConfig
    from ludic.training.frozen_cache import FrozenBottomCache
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.microbatch import collate
    from ludic.training.scoring import score_actions

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batches", type=int, default=8, help="timed batches per side")
    p.add_argument("--dtype", default="auto")
    args = p.parse_args(argv)
    dtype = resolve_dtype(args.dtype)
    model, tok = load_policy(DEFAULT_MODEL, lora=LoraSettings(rank=16, alpha=32.0, top_layers=15), dtype=dtype)
    with torch.no_grad():  # an adapter that has learned something (B = 0 would make the top a no-op)
        gen = torch.Generator().manual_seed(0)
        for n, prm in model.named_parameters():
            if "lora_B" in n:
                prm.copy_(torch.randn(prm.shape, generator=gen) * 0.02)
    groups = _items(tok)
    prompts = [list(g[0].prompt_ids) for g in groups]
    print(f"[bottom] {header(machine_info(dtype))}; {len(prompts)} positions, prompts of "
          f"{sum(map(len, prompts)) / len(prompts):.0f} tokens, batches of 16 x 3 samples, 64 trained items", flush=True)
    engines = {"full": TransformersEngine(model, tok, bottom_cache_bytes=0), "cached": TransformersEngine(model, tok)}
    caches = {"full": None, "cached": FrozenBottomCache(model, 15, per="prompt")}
    decoder = model.get_base_model().get_decoder()
    t0 = time.perf_counter()
    engines["cached"].generate(prompts, [SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS[RecipeConfig().answer])] * len(prompts))
    for s in range(0, len(groups), 16):
        caches["cached"].inputs(decoder, collate([it for g in groups[s:s + 16] for it in g], tok.pad_token_id))
    print(f"[bottom] caches filled for {len(prompts)} prompts in {time.perf_counter() - t0:.1f} s "
          f"(engine {engines['cached'].bottom_cache.bytes / 2**20:.0f} MiB, trainer "
          f"{caches['cached'].stats()['mib']:.0f} MiB)", flush=True)
    rng = random.Random(0)
    times: dict[str, dict[str, list[float]]] = {s: {"sampling": [], "training": []} for s in engines}
    diffs = {"greedy_same": 0, "greedy_rows": 0, "sample_logp": 0.0, "train_logp": 0.0, "grad": 0.0}
    params = [prm for prm in model.parameters() if prm.requires_grad]
    for b in range(args.batches):
        batch = rng.sample(range(len(groups)), 16)
        rows = [prompts[i] for i in batch for _ in range(3)]
        greedy = [SamplingParams(temperature=0.0, max_tokens=ANSWER_TOKENS[RecipeConfig().answer])] * len(rows)
        sampled = [SamplingParams(temperature=0.7, max_tokens=ANSWER_TOKENS[RecipeConfig().answer], seed=1000 * b + r) for r in range(len(rows))]
        mb = collate([it for i in batch for it in groups[i]], tok.pad_token_id)
        adv = torch.tensor([rng.gauss(0, 1) for _ in range(mb.targets.shape[0])])
        got: dict[str, tuple] = {}
        for side in (("full", "cached") if b % 2 else ("cached", "full")):
            t = time.perf_counter()
            out = engines[side].generate(rows, sampled)
            times[side]["sampling"].append(time.perf_counter() - t)
            greedy_out = engines[side].generate(rows, greedy)
            model.zero_grad(set_to_none=True)
            t = time.perf_counter()
            logp, _ = score_actions(model, mb, bottom=caches[side])
            (-(logp * adv).sum()).backward()
            times[side]["training"].append(time.perf_counter() - t)
            got[side] = (out, greedy_out, logp.detach(), [prm.grad.detach().clone() for prm in params])
        (fo, fg, fl, fgr), (co, cg, cl, cgr) = got["full"], got["cached"]
        diffs["greedy_same"] += sum(x.trace.completion_ids == y.trace.completion_ids for x, y in zip(fg, cg))
        diffs["greedy_rows"] += len(rows)
        diffs["sample_logp"] = max([diffs["sample_logp"]] + [abs(x.trace.logprobs[0] - y.trace.logprobs[0])
                                   for x, y in zip(fg, cg) if x.trace.completion_ids[:1] == y.trace.completion_ids[:1]])
        diffs["train_logp"] = max(diffs["train_logp"], float((fl - cl).abs().max()))
        num = sum(float((a - c).float().norm() ** 2) for a, c in zip(fgr, cgr)) ** 0.5
        den = sum(float(a.float().norm() ** 2) for a in fgr) ** 0.5
        diffs["grad"] = max(diffs["grad"], num / max(den, 1e-12))
        mark_trained(model)  # a trainer step: the engines' adapters refresh, the bottoms stay
    result: dict = {"dtype": dtype, **diffs}
    for part in ("sampling", "training"):
        full, cached = med(times["full"][part]), med(times["cached"][part])
        result[part] = {"full_s": full, "cached_s": cached, "ratio": full / cached}
        print(f"[bottom] {part:8s}  full {full:.3f} s  cached {cached:.3f} s  ratio full / cached {full / cached:.2f}x "
              f"(median of {args.batches} batches)", flush=True)
    both_full = med(times["full"]["sampling"]) + med(times["full"]["training"])
    both_cached = med(times["cached"]["sampling"]) + med(times["cached"]["training"])
    result["ratio"] = both_full / both_cached
    print(f"[bottom] sampling + training: ratio {result['ratio']:.2f}x; greedy replies the same in "
          f"{diffs['greedy_same']} of {diffs['greedy_rows']} rows; largest first-token log-prob difference of a "
          f"greedy reply {diffs['sample_logp']:.3g}; trainer log-probs {diffs['train_logp']:.3g}, LoRA gradients "
          f"{diffs['grad']:.3g} (relative)", flush=True)
    return result


if __name__ == "__main__":
    main()
