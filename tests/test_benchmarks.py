"""The benchmarks' pure helpers (the FLOPs count of bench_trainer, parameter counting, the ratio
table, the CPU header, the runner's part selection, the paired overhead), and one smoke run of the
whole runner in ``--quick`` mode (slow: about 2 minutes), so a benchmark that breaks fails here and
not in the next session's measurement."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import require

from benchmarks.__main__ import parse_only
from benchmarks.bench_rollout import alternating_pairs, paired_overhead
from benchmarks.bench_trainer import param_counts, train_flops
from benchmarks.common import at_least, at_most, cpu_info, fmt, format_table, header, row


def test_train_flops_lora_by_hand():
    # N=1000, N_lora=10, H=4, V=50, T=20 sequence tokens, S=5 scored tokens
    f = train_flops(nonembed=1000, lora=10, hidden=4, vocab=50, seq_tokens=20, scored_tokens=5, full=False)
    head = 2 * 4 * 50 * 5  # 2000
    assert f["forward"] == 2 * 1010 * 20 + head == 42400
    assert f["backward_activations"] == 42400
    assert f["backward_weights"] == 2 * 10 * 20 == 400  # only the LoRA weights get gradients
    assert f["total"] == 85200


def test_train_flops_full_by_hand():
    f = train_flops(nonembed=1000, lora=0, hidden=4, vocab=50, seq_tokens=20, scored_tokens=5, full=True)
    assert f["forward"] == 42000
    assert f["backward_activations"] == 42000
    assert f["backward_weights"] == 2 * 1000 * 20 + 2000 == 42000  # every weight and the LM head
    assert f["total"] == 126000 == 3 * f["forward"]


@pytest.mark.parametrize("tied", [True, False])
def test_param_counts_tiny_llama(tied):
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=100, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=tied)
    model = LlamaForCausalLM(cfg)
    # per layer: q 16x16, k 16x8, v 16x8, o 16x16, gate/up/down 16x32 each, two norms of 16
    per_layer = 256 + 128 + 128 + 256 + 3 * 512 + 2 * 16
    nonembed = 2 * per_layer + 16  # + the final norm; embeddings and the LM head excluded
    assert param_counts(model) == {"nonembed": nonembed, "lora": 0, "hidden": 16, "vocab": 100, "tied": tied}
    pm = get_peft_model(model, LoraConfig(r=2, target_modules=["q_proj", "v_proj"]))
    # q: A 2x16 + B 16x2; v: A 2x16 + B 8x2 -> 64 + 48 per layer
    assert param_counts(pm) == {"nonembed": nonembed, "lora": 2 * (64 + 48), "hidden": 16, "vocab": 100, "tied": tied}


def test_format_table():
    rows = [
        row("a", "GRPO step s", 2.0, 12.0, 6.0, unit="s", goal=">=5x", met=at_least(6.0, 5.0)),
        row("b", "overhead", 1.05, 1.0, 1.05, unit="s", ratio_kind="%", goal="<=10%", met=at_most(0.05, 0.10)),
        row("c", "share", 20.0, 10.0, None, unit="%"),
        row("e", "slow", 3.0, 2.0, 0.5, goal=">=1.5x", met=False),
    ]
    lines = format_table(rows).splitlines()
    assert len(lines) == 2 + len(rows)
    assert lines[0].split() == ["part", "what", "ludic", "peer", "ratio", "goal", "met?"]
    assert set(lines[1].replace(" ", "")) == {"-"}
    assert lines[2].split()[-3:] == ["6.00x", ">=5x", "yes"]
    assert "2.00 s" in lines[2] and "12.0 s" in lines[2]
    assert "+5.0%" in lines[3] and lines[3].endswith("yes")
    assert lines[4].split()[-3:] == ["-", "-", "-"]  # no ratio, no goal, nothing to meet
    assert lines[5].endswith("NO")
    col = lines[0].index("what")  # columns are aligned
    assert [line[col:].split()[0] for line in lines[2:]] == ["GRPO", "overhead", "share", "slow"]
    ratio_end = lines[0].index("ratio") + len("ratio")
    assert [line[:ratio_end].split()[-1] for line in lines[2:]] == ["6.00x", "+5.0%", "-", "0.50x"]


def test_fmt_and_goals():
    assert fmt(None) == "-" and fmt(float("nan")) == "-"
    assert fmt(123.4, "s") == "123 s"
    assert fmt(12.34) == "12.3"
    assert fmt(1.234, "ms") == "1.23 ms"
    assert fmt(0.01234) == "0.0123"
    assert at_least(1.5, 1.5) is True and at_least(1.49, 1.5) is False and at_least(math.nan, 1) is None
    assert at_most(0.1, 0.1) is True and at_most(0.11, 0.1) is False and at_most(None, 0.1) is None


def test_cpu_info_and_header():
    text = ("processor\t: 0\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n"
            "processor\t: 1\nmodel name\t: Test CPU 9000\nflags\t\t: fpu sse avx2 avx512f avx512_bf16 amx_tile\n")
    info = cpu_info(text)
    assert info["cpu"] == "Test CPU 9000"
    assert info["flags"] == ["avx2", "avx512f", "avx512_bf16", "amx_tile"]
    line = header({**info, "cores": 2, "torch": "2.13.0", "torch_threads": 2, "dtype": "bfloat16"})
    assert line == ("cpu: Test CPU 9000 | flags: avx2 avx512f avx512_bf16 amx_tile | cores: 2 | torch 2.13.0 "
                    "(2 threads) | dtype bfloat16")
    assert cpu_info("flags : sse2\n")["flags"] == []


def test_parse_only():
    assert parse_only(None) == ["a", "b", "c", "f", "d", "e", "g", "h"]
    assert parse_only("f, c,a") == ["a", "c", "f"]
    with pytest.raises(SystemExit, match="unknown part"):
        parse_only("a,x")


def test_paired_overhead_is_the_median_of_back_to_back_ratios():
    # the host's speed moved during the run: the ratio of the medians would say -7%, the pairs say 0
    ludic = [{"seconds": s} for s in (1.0, 3.0, 1.3)]
    bare = [{"seconds": s} for s in (1.0, 2.0, 1.4)]
    assert paired_overhead(ludic, bare) == pytest.approx(0.0)
    assert paired_overhead([{"seconds": 3.0}], [{"seconds": 2.0}]) == pytest.approx(0.5)


def test_alternating_pairs_swap_the_order_every_repeat():
    # a run right after another workload (the HF generate of the last repeat) is slower on this host:
    # always running Ludic first put that cost on Ludic's side only
    calls = []

    def side(name):
        def f():
            calls.append(name)
            return {"seconds": float(len(calls))}
        return f

    ludic, bare = alternating_pairs(4, side("ludic"), side("bare"))
    assert calls == ["ludic", "bare", "bare", "ludic", "ludic", "bare", "bare", "ludic"]
    assert [r["seconds"] for r in ludic] == [1.0, 4.0, 5.0, 8.0]
    assert [r["seconds"] for r in bare] == [2.0, 3.0, 6.0, 7.0]


@pytest.mark.slow
def test_runner_quick_smoke(tmp_path):
    """``python -m benchmarks --quick``: every part runs (vLLM skipped), writes its rows, and the
    checks the real run relies on hold (same token ids for the bare engine, matching token totals
    against TRL, the FLOPs formula printed)."""
    out = tmp_path / "quick.json"
    root = Path(__file__).resolve().parent.parent
    proc = subprocess.run([sys.executable, "-m", "benchmarks", "--quick", "--out", str(out)], cwd=root,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["quick"] is True and set(res["parts"]) == {"a", "b", "c", "f", "d", "e", "g", "h"}
    parts = {r["part"] for r in res["rows"]}
    assert parts == {"a", "b", "c", "f", "d", "e", "g", "h"}
    for r in res["rows"]:
        assert isinstance(r["ludic"], (int, float)) and math.isfinite(r["ludic"]) and r["ludic"] > 0, r
    assert res["parts"]["a"]["tokens_within_10pct"] is True
    assert res["parts"]["b"]["transformers"]["same_tokens"] is True
    assert "2(N+N_lora)T" in res["parts"]["c"]["formula"]
    assert "QUICK" in proc.stdout


def test_random_model_of_a_named_shape(tmp_path):
    """``random:<shape>`` (part (a)'s GPU model, where no hub can be reached): a seeded Llama of the
    shape with the packaged tokenizer and chat template, made once and reused; unknown shapes are
    refused with the known ones named."""
    import torch

    from benchmarks.bench_grpo_vs_trl import SHAPES, random_model
    from ludic.inference.models import load_model, load_tokenizer, packaged_model_dir
    from ludic.tokenization import render_ids

    path = random_model("tiny", tmp_path)
    assert path == tmp_path / "random-tiny" and random_model("tiny", tmp_path) == path
    model, tok = load_model(str(path), dtype="float32"), load_tokenizer(str(path))
    want = load_tokenizer(str(packaged_model_dir()))
    assert model.config.model_type == "llama" and model.config.vocab_size == len(want)
    assert {k: getattr(model.config, k) for k in SHAPES["tiny"]} == SHAPES["tiny"]
    msgs = [{"role": "user", "content": "hi"}]
    assert render_ids(tok, msgs) == render_ids(want, msgs)
    with torch.no_grad():
        assert torch.isfinite(model(torch.tensor([[1, 2, 3]])).logits).all()
    with pytest.raises(SystemExit, match="llama-1b"):
        random_model("no-such-shape", tmp_path)


def test_trl_with_vllm_is_refused_without_a_gpu():
    from benchmarks.bench_grpo_vs_trl import bench_trl

    with pytest.raises(SystemExit, match="needs a GPU"):
        bench_trl("unused", 1, "float32", use_vllm=True)


@pytest.mark.slow
@pytest.mark.integration
def test_ludic_grpo_step_on_the_in_process_vllm_engine():
    """Part (a)'s Ludic side as ``--gpu`` runs it, on vLLM's CPU build: the trainer samples from a
    ``VLLMEngineClient`` and pushes its LoRA adapter into it after every step."""
    require("vllm")
    from benchmarks.bench_grpo_vs_trl import bench_ludic
    from ludic.inference.models import packaged_model_dir, resolve_dtype

    out = bench_ludic(str(packaged_model_dir()), 1, resolve_dtype("auto"), engine_kind="vllm",
                      prompts_per_step=1, group_size=2, max_tokens=4)
    assert "VLLMEngineClient" in out["config"]["engine"]
    assert len(out["times"]) == 1 and out["generated"] == out["trained"] and 0 < out["generated"][0] <= 8
