"""Tests for ludic.training.dpo and the ``ludic dpo`` recipe.

Hand-computed fixture (beta = 0.5, two pairs):

    pair  policy c / r   ref c / r     c = chosen log-ratio, r = rejected log-ratio, d = c - r
    0     -1   / -3      -2  / -2      c =  1.0, r = -1.0, d =  2, beta d =  1.0
    1     -2   / -2      -1.5/ -2.5    c = -0.5, r =  0.5, d = -1, beta d = -0.5
    chosen_len = 2, rejected_len = 4 (both pairs)

    sigmoid  -log sigma(1) = log(1 + e^-1) = 0.3132617     -log sigma(-0.5) = log(1 + e^0.5) = 0.9740770
    cDPO eps=0.1: l + eps * beta d  (since -log sigma(-x) = -log sigma(x) + x)  -> 0.4132617, 0.9240770
    hinge    max(0, 1 - 1) = 0                              max(0, 1 + 0.5) = 1.5
    ipo      (1/2 - (-1)/4 - 1)^2 = 0.0625                  (-0.5/2 - 0.5/4 - 1)^2 = 1.890625
    rewards  chosen beta c = [0.5, -0.25], rejected beta r = [-0.5, 0.25]
    d l_0 / d policy_c (sigmoid) = -beta sigma(-beta d) = -0.5 * 0.2689414 = -0.1344707

TRL 1.16's ``DPOTrainer`` is the reference implementation for the equality tests.
"""

from __future__ import annotations

import asyncio
import copy
import json

import pytest
import torch

from ludic.config import parse_config
from ludic.data.jsonl import DatasetError
from ludic.data.text_logs import read_text_log
from ludic.training.config import TrainerConfig
from ludic.recipes.dpo import DPOTrainConfig, dpo, resolve_reference
from ludic.training.algorithms import make_sft
from ludic.training.microbatch import collate, split_by_token_budget
from ludic.training.scoring import score_actions
from ludic.training.dpo import (
    DPOLossConfig,
    PairBatchSource,
    dpo_items,
    dpo_loss,
    make_dpo_objective,
    pair_indices,
    read_dpo_records,
    sequence_logps,
)
from ludic.training.trainer import Trainer, TrainerConfig
from ludic.types import SAWItem

TOL = dict(rel=1e-6, abs=1e-7)
PC, PR, RC, RR = [-1.0, -2.0], [-3.0, -2.0], [-2.0, -1.5], [-2.0, -2.5]
D = torch.float64


def _fixture(**kw):
    t = lambda xs: torch.tensor(xs, dtype=D)  # noqa: E731
    pc = t(PC).requires_grad_()
    out = dpo_loss(pc, t(PR), t(RC), t(RR), beta=0.5, chosen_len=t([2, 2]), rejected_len=t([4, 4]), **kw)
    return pc, out


@pytest.mark.parametrize("loss_type,kw,expected", [
    ("sigmoid", {}, [0.3132617, 0.9740770]),
    ("sigmoid", {"label_smoothing": 0.1}, [0.4132617, 0.9240770]),
    ("hinge", {}, [0.0, 1.5]),
    ("ipo", {}, [0.0625, 1.890625]),
])
def test_dpo_loss_hand_computed(loss_type, kw, expected):
    _, (loss, chosen, rejected) = _fixture(loss_type=loss_type, **kw)
    assert loss.tolist() == pytest.approx(expected, rel=1e-6, abs=1e-7)
    assert chosen.tolist() == pytest.approx([0.5, -0.25], **TOL)
    assert rejected.tolist() == pytest.approx([-0.5, 0.25], **TOL)
    assert not chosen.requires_grad and not rejected.requires_grad


def test_dpo_loss_gradient():
    pc, (loss, _, _) = _fixture(loss_type="sigmoid")
    loss[0].backward()
    assert pc.grad.tolist() == pytest.approx([-0.1344707, 0.0], abs=1e-7)


def test_dpo_loss_and_config_validation():
    x = torch.zeros(2)
    with pytest.raises(ValueError, match="chosen_len"):
        dpo_loss(x, x, x, x, loss_type="ipo")
    with pytest.raises(ValueError, match="shape"):
        dpo_loss(x, torch.zeros(3), x, x)
    for bad in (dict(loss_type="kto"), dict(beta=0.0), dict(label_smoothing=0.5),
                dict(loss_type="hinge", label_smoothing=0.1)):
        with pytest.raises(ValueError):
            DPOLossConfig(**bad)
    assert DPOLossConfig(beta=0.3, loss_type="ipo").loss_type == "ipo"


# ---------------------------------------------------------------- data


def test_dpo_items_share_prompt_and_end_with_eos(tokenizer):
    rec = {"prompt": "Board?", "chosen": "<|move|><|1-1|><|end|>", "rejected": "<|move|><|0-0|><|end|>"}
    c, r = dpo_items(rec, tokenizer, chat=False, pair_id=7)
    assert c.prompt_ids == r.prompt_ids and c.weight == r.weight == 1.0
    assert c.meta == {"pair_id": 7, "role": "chosen"} and r.meta == {"pair_id": 7, "role": "rejected"}
    assert c.completion_ids[-1] == r.completion_ids[-1] == tokenizer.eos_token_id
    assert tokenizer.decode(c.completion_ids[:-1]) == rec["chosen"]
    # text already ending with EOS gets no second one; messages prompts use the chat template
    c2, _ = dpo_items({**rec, "chosen": rec["chosen"] + tokenizer.eos_token}, tokenizer, chat=False)
    assert c2.completion_ids == c.completion_ids
    msgs = [{"role": "user", "content": "Board?"}]
    cm, _ = dpo_items({**rec, "prompt": msgs}, tokenizer, chat=False)
    cs, _ = dpo_items(rec, tokenizer, chat=True)
    assert cm.prompt_ids == cs.prompt_ids != c.prompt_ids
    assert "<|im_start|>assistant" in tokenizer.decode(cm.prompt_ids)


def test_read_dpo_records_names_bad_lines(tmp_path):
    good = {"prompt": [{"role": "user", "content": "hi"}], "chosen": "a", "rejected": "b"}
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": "x", "chosen": "a"}) + "\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: needs 'rejected'"):
        read_dpo_records(path)
    path.write_text(json.dumps(good) + "\n" + json.dumps({"prompt": 3, "chosen": "a", "rejected": "b"}) + "\n")
    with pytest.raises(DatasetError, match=r"d\.jsonl:2: needs 'prompt'"):
        read_dpo_records(path)
    path.write_text(json.dumps(good) + "\n\n")
    assert read_dpo_records(path) == [good]


def _pair(pid, plen=3, clen=2, rlen=3):
    p = tuple(range(10, 10 + plen))
    return (SAWItem(p, tuple(range(100, 100 + clen)), 1.0, meta={"pair_id": pid, "role": "chosen"}),
            SAWItem(p, tuple(range(200, 200 + rlen)), 1.0, meta={"pair_id": pid, "role": "rejected"}))


def test_pair_batch_source_keeps_pairs_whole_and_resumes():
    pairs = [_pair(i) for i in range(5)]
    src = PairBatchSource(pairs, 2, seed=3)
    b = asyncio.run(src.next_batch())
    assert len(b.items) == 4 and b.meta["num_pairs"] == 2
    ci, ri = pair_indices(b.items)
    assert [b.items[i].meta["pair_id"] for i in ci] == [b.items[i].meta["pair_id"] for i in ri]
    state = src.state_dict()
    nxt = asyncio.run(src.next_batch())
    src2 = PairBatchSource(pairs, 2, seed=3)
    src2.load_state_dict(state)
    assert asyncio.run(src2.next_batch()).items == nxt.items
    # one rank's shard: whole pairs too
    shard = PairBatchSource(pairs, 5, seed=3, rank=1, world_size=2)
    assert len(asyncio.run(shard.next_batch()).items) == 4


def test_pair_indices_rejects_incomplete_pairs():
    c, r = _pair(0)
    with pytest.raises(ValueError, match="incomplete"):
        pair_indices([c, r, _pair(1)[0]])
    with pytest.raises(ValueError, match="two chosen"):
        pair_indices([c, c, r])
    with pytest.raises(ValueError, match="meta"):
        pair_indices([SAWItem((1,), (2,), 1.0)])


# ---------------------------------------------------------------- equality with TRL

RECORDS = [
    {"prompt": "The board is empty.", "chosen": " I take the centre.", "rejected": " Corner."},
    {"prompt": "X in the centre, O to move", "chosen": " O takes a corner", "rejected": " O takes an edge now"},
    {"prompt": "Hello", "chosen": " Hi there, friend", "rejected": " Go away"},
]


def _perturb(params, scale, seed=0):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in params:
            p.add_(torch.randn(p.shape, generator=g) * scale)


def _trl_trainer(tmp_path, model, tok, loss_type, *, records=RECORDS, beta=0.2, label_smoothing=0.0,
                 peft_config=None):
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    args = DPOConfig(
        output_dir=str(tmp_path / "trl"), report_to="none", loss_type=[loss_type], beta=beta,
        label_smoothing=label_smoothing, per_device_train_batch_size=len(records), use_cpu=True,
        bf16=False, fp16=False, save_strategy="no", dataloader_num_workers=0, seed=0,
    )
    return DPOTrainer(model=model, args=args, train_dataset=Dataset.from_list(records), processing_class=tok,
                      peft_config=peft_config)


def _items_from_trl_batch(batch):
    """TRL's collated [chosen..., rejected...] rows as Ludic pair items (same token ids)."""
    ids, attn, comp = batch["input_ids"], batch["attention_mask"], batch["completion_mask"]
    n_pairs = ids.shape[0] // 2
    items = []
    for row in range(2 * n_pairs):
        n = int(attn[row].sum())
        seq, mask = ids[row, :n].tolist(), comp[row, :n].tolist()
        start = mask.index(1)
        assert all(mask[start:]), "TRL completion is not a suffix"
        items.append(SAWItem(tuple(seq[:start]), tuple(seq[start:]), 1.0,
                             meta={"pair_id": row % n_pairs, "role": "chosen" if row < n_pairs else "rejected"}))
    return items


def _trl_policy_logps(model, batch):
    """Per-sequence log-probs exactly as TRL's ``_compute_loss`` computes them (fused LM head)."""
    labels = batch["input_ids"].masked_fill(batch["completion_mask"] == 0, -100)
    with torch.no_grad():
        out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=labels,
                    use_cache=False, fused_lm_head=True)
    return out.log_probs.sum(dim=1)


def _grads(model):
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


def _compare_with_trl(tr, tok, ludic_cfg, ref_model):
    """Ludic's objective on TRL's own batch: same log-probs, loss, gradients and reward stats."""
    model = tr.model
    model.train()
    batch = next(iter(tr.get_train_dataloader()))
    items = _items_from_trl_batch(batch)
    n = len(items) // 2

    trl_pol = _trl_policy_logps(model, batch)
    trl_ref = torch.cat(tr.compute_ref_log_probs(ref_model if ref_model is not None else model, batch))
    model.zero_grad(set_to_none=True)
    trl_loss = tr.compute_loss(model, batch)
    trl_loss.backward()
    trl_grads = _grads(model)
    trl_metrics = {k: v[-1] for k, v in tr._metrics["train"].items()}

    trainer = Trainer(model, make_sft(), None, TrainerConfig(), ref_model=ref_model, pad_token_id=tok.pad_token_id,
                      objective=make_dpo_objective(ludic_cfg), group_key="pair_id")
    mb = collate(items, tok.pad_token_id)
    with torch.no_grad():
        pol = sequence_logps(score_actions(model, mb)[0], mb.seg, len(items))
        ref = sequence_logps(trainer.ref_logp(mb), mb.seg, len(items))
    torch.testing.assert_close(pol, trl_pol, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ref, trl_ref, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(pol, ref, atol=1e-3), "policy equals reference: the test would not discriminate"

    model.zero_grad(set_to_none=True)
    loss, stats = trainer.objective(trainer, mb, {"segments": float(len(items))})
    loss.backward()
    assert abs(float(trl_loss.detach()) - 0.6931) > 1e-3
    assert float(loss.detach()) == pytest.approx(float(trl_loss.detach()), rel=1e-5, abs=1e-6)
    grads = _grads(model)
    assert grads.keys() == trl_grads.keys() and grads
    for k in grads:
        torch.testing.assert_close(grads[k], trl_grads[k], rtol=1e-4, atol=1e-6)
    assert float(stats["rewards/chosen"]) == pytest.approx(trl_metrics["rewards/chosen"], abs=1e-5)
    assert float(stats["rewards/rejected"]) == pytest.approx(trl_metrics["rewards/rejected"], abs=1e-5)
    assert float(stats["rewards/margin"]) == pytest.approx(trl_metrics["rewards/margins"], abs=1e-5)
    assert float(stats["rewards/accuracy"]) == pytest.approx(trl_metrics["rewards/accuracies"], abs=1e-6)
    assert float(pol[:n].mean()) == pytest.approx(trl_metrics["logps/chosen"], rel=1e-5)
    assert float(pol[n:].mean()) == pytest.approx(trl_metrics["logps/rejected"], rel=1e-5)


def _tiny(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)


@pytest.mark.parametrize("loss_type", ["sigmoid", "ipo", "hinge"])
def test_matches_trl_frozen_copy_reference(tiny_model_dir, tokenizer, tmp_path, loss_type):
    beta = {"sigmoid": 0.2, "ipo": 0.5, "hinge": 2.0}[loss_type]
    tr = _trl_trainer(tmp_path, _tiny(tiny_model_dir), tokenizer, loss_type, beta=beta)
    _perturb(tr.model.parameters(), 0.05)
    _compare_with_trl(tr, tokenizer, DPOLossConfig(beta=beta, loss_type=loss_type), tr.ref_model)


def test_matches_trl_lora_base_reference(tiny_model_dir, tokenizer, tmp_path):
    from peft import LoraConfig

    tr = _trl_trainer(tmp_path, _tiny(tiny_model_dir), tokenizer, "sigmoid", beta=0.5,
                      peft_config=LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", task_type="CAUSAL_LM"))
    assert tr.ref_model is None and hasattr(tr.model, "disable_adapter")
    _perturb([p for n, p in tr.model.named_parameters() if "lora_B" in n], 0.2)
    _compare_with_trl(tr, tokenizer, DPOLossConfig(beta=0.5), None)


def test_matches_trl_conversational_with_shared_system_prompt(tiny_model_dir, tokenizer, tmp_path):
    """Chat-template pairs: TRL's own template tokenisation, and a long prompt prefix shared by every item."""
    records = [{"prompt": [{"role": "user", "content": r["prompt"]}],
                "chosen": [{"role": "assistant", "content": r["chosen"].strip()}],
                "rejected": [{"role": "assistant", "content": r["rejected"].strip()}]} for r in RECORDS]
    tr = _trl_trainer(tmp_path, _tiny(tiny_model_dir), tokenizer, "sigmoid", records=records, beta=0.2)
    items = _items_from_trl_batch(next(iter(tr.get_train_dataloader())))
    shared = next(i for i, col in enumerate(zip(*(it.prompt_ids for it in items))) if len(set(col)) > 1)
    assert shared >= 16  # the template's system prompt
    _perturb(tr.model.parameters(), 0.05)
    _compare_with_trl(tr, tokenizer, DPOLossConfig(beta=0.2), tr.ref_model)


def test_label_smoothing_matches_trl_aot_on_one_pair(tiny_model_dir, tokenizer, tmp_path):
    """TRL 1.16's "sigmoid" ignores label_smoothing; its "aot" loss is cDPO after sorting, i.e. cDPO for one pair."""
    tr = _trl_trainer(tmp_path, _tiny(tiny_model_dir), tokenizer, "aot", records=RECORDS[1:2], beta=0.3,
                      label_smoothing=0.2)
    _perturb(tr.model.parameters(), 0.05)
    _compare_with_trl(tr, tokenizer, DPOLossConfig(beta=0.3, label_smoothing=0.2), tr.ref_model)


# ---------------------------------------------------------------- objective in the Trainer


def _pairs_of_lengths(tok):
    recs = [{"prompt": "p" * (k + 1), "chosen": "good " * (k + 1), "rejected": "bad " * (3 - k % 3)} for k in range(4)]
    return [it for i, r in enumerate(recs) for it in dpo_items(r, tok, chat=False, pair_id=i)]


def _full_trainer(tiny_model_dir, tok, cfg=None, lr=1e-5, perturb=0.05):
    model = _tiny(tiny_model_dir)
    ref = copy.deepcopy(model).eval().requires_grad_(False)
    _perturb(model.parameters(), perturb, seed=1)
    return Trainer(model, make_sft(), None, TrainerConfig(lr=lr), ref_model=ref, pad_token_id=tok.pad_token_id,
                   objective=make_dpo_objective(cfg), group_key="pair_id")


def test_micro_batches_sum_to_the_batch_loss(tiny_model_dir, tokenizer):
    trainer = _full_trainer(tiny_model_dir, tokenizer, DPOLossConfig(beta=0.3))
    items = _pairs_of_lengths(tokenizer)
    totals = {"segments": float(len(items))}
    model = trainer.model

    model.zero_grad(set_to_none=True)
    full, _ = trainer.objective(trainer, collate(items, tokenizer.pad_token_id), totals)
    full.backward()
    g_full = _grads(model)

    groups = split_by_token_budget(items, 2 * max(it.num_tokens for it in items[:4]), "pair_id")
    assert len(groups) > 1 and all(len(g) % 2 == 0 for g in groups)
    model.zero_grad(set_to_none=True)
    parts = []
    for g in groups:
        part, _ = trainer.objective(trainer, collate(g, tokenizer.pad_token_id), totals)
        part.backward()
        parts.append(float(part.detach()))
    assert sum(parts) == pytest.approx(float(full.detach()), rel=1e-5)
    for k, v in _grads(model).items():
        torch.testing.assert_close(v, g_full[k], rtol=1e-4, atol=1e-6)


def test_one_step_widens_the_margin(tiny_model_dir, tokenizer):
    trainer = _full_trainer(tiny_model_dir, tokenizer, lr=1e-3, perturb=0.0)  # policy == reference
    items = _pairs_of_lengths(tokenizer)
    before = trainer.optimize(items)
    after = trainer.optimize(items)  # stats are computed before each step
    assert before["rewards/margin"] == pytest.approx(0.0, abs=1e-6)
    assert before["loss"] == pytest.approx(0.6931472, abs=1e-5)
    assert after["rewards/margin"] > 0
    assert after["loss"] < before["loss"]
    assert after["rewards/accuracy"] == 1.0


# ---------------------------------------------------------------- recipe


def _write_data(path):
    recs = [
        {"prompt": "Board: empty.", "chosen": "<|move|><|1-1|><|end|>", "rejected": "<|move|><|0-1|><|end|>"},
        {"prompt": "Board: X centre.", "chosen": "<|move|><|0-0|><|end|>", "rejected": "<|move|><|0-1|><|end|>"},
        {"prompt": [{"role": "user", "content": "Your move."}], "chosen": "corner", "rejected": "edge"},
        {"prompt": "Board: full row.", "chosen": "<|move|><|2-2|><|end|>", "rejected": "<|move|><|2-1|><|end|>"},
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in recs))
    return path


def test_resolve_reference_and_flags():
    assert resolve_reference("auto", lora=True, adapter=None) == "base"
    assert resolve_reference("auto", lora=True, adapter="a") == "copy"
    assert resolve_reference("auto", lora=False, adapter=None) == "copy"
    with pytest.raises(ValueError, match="LoRA"):
        resolve_reference("base", lora=False, adapter=None)
    cfg = parse_config(DPOTrainConfig, ["--loss-type", "ipo", "--beta", "0.5", "--no-full-finetune",
                                        "--reference", "base", "--batch-size", "2", "--logs-dir", "L"])
    assert (cfg.loss_type, cfg.beta, cfg.full_finetune, cfg.reference, cfg.batch_size, cfg.logs_dir) == \
        ("ipo", 0.5, False, "base", 2, "L")


@pytest.mark.parametrize("full", [False, True], ids=["lora-base-reference", "full-copy-reference"])
def test_recipe_smoke(tiny_model_dir, tmp_path, full):
    data = _write_data(tmp_path / "dpo.jsonl")
    run_dir, logs = tmp_path / "run", tmp_path / "logs"
    cfg = DPOTrainConfig(model=str(tiny_model_dir), data=str(data), epochs=1, batch_size=2,
                         full_finetune=full, lora_rank=4, lora_alpha=8, run_dir=str(run_dir), logs_dir=str(logs),
                         logger="none", dtype="float32", trainer=TrainerConfig(lr=1e-3, max_seq_len=64))
    out = dpo(cfg)
    assert out["steps"] == 2 and out["num_pairs"] == 4 and out["reference"] == ("copy" if full else "base")
    assert json.loads((run_dir / "config.json").read_text())["loss_type"] == "sigmoid"
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]
    (log,) = logs.glob("dpo_training_logs_*.txt")
    info, steps = read_text_log(log)
    assert info["kind"] == "dpo" and [s for s, _ in steps] == [1, 2]
    assert {"loss", "rewards/margin", "rewards/accuracy", "grad_norm", "learning_rate", "epoch"} <= steps[0][1].keys()
    assert steps[0][1]["loss"] == pytest.approx(0.6931472, abs=1e-5)  # policy == reference at step 1
    ckpt = run_dir / "checkpoints" / "step_000002"
    weights = "model.safetensors" if full else "adapter_model.safetensors"
    assert (ckpt / "model" / weights).exists() and (ckpt / "trainer_state.json").exists()
    assert json.loads((ckpt / "trainer_state.json").read_text())["algorithm"] == "dpo"
    assert (run_dir / "final" / weights).exists() and (run_dir / "summary.json").exists()
    if not full:  # resuming a finished run does no more steps
        again = dpo(cfg)
        assert again["steps"] == 2 and len((run_dir / "metrics.jsonl").read_text().splitlines()) == 2
