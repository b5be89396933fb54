"""ludic.hub: preparing an uploadable folder from real checkpoints, and the (faked) upload."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from ludic.hub import DEFAULT_MODEL, hub_base_id, main, prepare_hub_folder, push_to_hub, resolve_checkpoint
from ludic.training.checkpoint import save_checkpoint
from ludic.training.lora import LoraSettings, load_policy

TRAINING_FILES = {"optimizer.pt", "scheduler.pt", "rng.json", "trainer_state.json", "training_args.bin",
                  "rng_state.pth"}
IDS = torch.tensor([[1, 532, 2177, 314, 3012, 28, 45, 9]])


@pytest.fixture(scope="module")
def lora_run(tiny_model_dir, tmp_path_factory):
    """A Ludic run directory with a real LoRA checkpoint (non-zero adapter), config.json and summary.json."""
    run = tmp_path_factory.mktemp("hub") / "run"
    model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.add_(torch.randn(p.shape, generator=g) * 0.3)
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0)
    state = {"policy_version": 3, "algorithm": "dpo", "trainer_config": {"lr": 1e-3, "max_grad_norm": 1.0}}
    step = save_checkpoint(run / "checkpoints", 3, model=model, optimizer=opt, scheduler=sched, tokenizer=tok,
                           state=state)
    (run / "config.json").write_text(json.dumps({"model": str(tiny_model_dir), "beta": 0.1, "loss_type": "sigmoid"}))
    (run / "summary.json").write_text(json.dumps({"loss": 0.42, "eval_random/win_rate": 0.75, "note": "x"}))
    with torch.no_grad():
        logits = model(input_ids=IDS).logits
    return {"run": run, "step": step, "logits": logits, "model": model}


def _front_matter(readme: str) -> dict:
    assert readme.startswith("---\n")
    return yaml.safe_load(readme.split("---\n")[1])


def test_resolve_checkpoint_forms(lora_run, tiny_model_dir):
    step = lora_run["step"]
    assert resolve_checkpoint(step) == (step / "model", step)
    assert resolve_checkpoint(lora_run["run"]) == (step / "model", step)  # no final/: latest checkpoint
    assert resolve_checkpoint(lora_run["run"] / "checkpoints") == (step / "model", step)
    assert resolve_checkpoint(tiny_model_dir) == (tiny_model_dir, None)
    with pytest.raises(FileNotFoundError):
        resolve_checkpoint(lora_run["run"] / "missing")


def test_merged_folder_reproduces_base_plus_adapter(lora_run, tiny_model_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    out = prepare_hub_folder(lora_run["step"], tmp_path / "merged", dtype="float32", repo_id="me/tiny-dpo")
    names = {f.name for f in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "tokenizer_config.json", "README.md"} <= names
    assert not names & (TRAINING_FILES | {"adapter_config.json", "adapter_model.safetensors"})
    merged = AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32)
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    with torch.no_grad():
        got, base_logits = merged(input_ids=IDS).logits, base(input_ids=IDS).logits
    torch.testing.assert_close(got, lora_run["logits"], rtol=1e-5, atol=1e-5)
    assert (got - base_logits).abs().max() > 1e-3, "the adapter changed nothing: the test would not discriminate"

    readme = (out / "README.md").read_text()
    meta = _front_matter(readme)
    assert meta["library_name"] == "ludic" and {"ludic", "dpo", "lora-merged"} <= set(meta["tags"])
    assert "base_model" not in meta  # a local folder is not a hub id; it is named in the text
    assert str(tiny_model_dir) in readme and "# tiny-dpo" in readme and '"me/tiny-dpo"' in readme
    assert "| `eval_random/win_rate` | 0.75 |" in readme  # eval numbers from summary.json
    assert "| `loss` | 0.42 |" in readme and "| `loss_type` | sigmoid |" in readme  # final metrics, run config
    assert "| `step` | 3 |" in readme and "| `max_grad_norm` | 1 |" in readme  # trainer_state.json


def test_merged_dtype_auto_keeps_the_base_dtype(lora_run, tmp_path):
    from safetensors import safe_open

    out = prepare_hub_folder(lora_run["step"], tmp_path / "auto")
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_tensor(next(iter(f.keys()))).dtype == torch.bfloat16  # the tiny base is stored in bf16


def test_adapter_folder_loads_with_peft(lora_run, tiny_model_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = prepare_hub_folder(lora_run["step"], tmp_path / "adapter", merge=False, base_model="smollm2",
                             eval_metrics={"eval_minimax/draw_rate": 0.5})
    names = {f.name for f in out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "tokenizer.json", "README.md"} <= names
    assert not names & (TRAINING_FILES | {"model.safetensors"})
    assert json.loads((out / "adapter_config.json").read_text())["base_model_name_or_path"] == DEFAULT_MODEL
    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir), dtype=torch.float32)
    model = PeftModel.from_pretrained(base, str(out))
    with torch.no_grad():
        torch.testing.assert_close(model(input_ids=IDS).logits, lora_run["logits"], rtol=1e-5, atol=1e-5)
    readme = (out / "README.md").read_text()
    meta = _front_matter(readme)
    assert meta["base_model"] == DEFAULT_MODEL and {"lora", "peft"} <= set(meta["tags"])
    assert "PeftModel.from_pretrained" in readme
    assert "| `eval_minimax/draw_rate` | 0.5 |" in readme and "| `eval_random/win_rate` | 0.75 |" in readme


def test_plain_hf_folder_drops_training_files(tiny_model_dir, tmp_path):
    src = tmp_path / "checkpoint-942"
    shutil.copytree(tiny_model_dir, src)
    for name in TRAINING_FILES:
        (src / name).write_text("{}")
    eval_json = tmp_path / "ev.json"
    eval_json.write_text(json.dumps({"win_rate": 0.9}))
    out = prepare_hub_folder(src, tmp_path / "out", eval_metrics=eval_json)
    names = {f.name for f in out.iterdir()}
    assert {"model.safetensors", "config.json", "tokenizer.json", "README.md"} <= names
    assert not names & TRAINING_FILES
    assert (out / "model.safetensors").read_bytes() == (tiny_model_dir / "model.safetensors").read_bytes()
    readme = (out / "README.md").read_text()
    assert "| `win_rate` | 0.9 |" in readme and "No training record" in readme
    with pytest.raises(FileExistsError):
        prepare_hub_folder(src, out)


def test_hub_base_id():
    assert hub_base_id("default") == DEFAULT_MODEL and hub_base_id("Qwen/Qwen2.5-0.5B") == "Qwen/Qwen2.5-0.5B"
    assert hub_base_id(None) is None


class FakeApi:
    calls: list = []

    def __init__(self, token=None):
        FakeApi.calls.append(("init", token))

    def create_repo(self, repo_id, **kw):
        FakeApi.calls.append(("create_repo", repo_id, kw))

    def create_branch(self, repo_id, **kw):
        FakeApi.calls.append(("create_branch", repo_id, kw))

    def upload_folder(self, **kw):
        FakeApi.calls.append(("upload_folder", kw))
        return type("CommitInfo", (), {"commit_url": f"https://hf.co/{kw['repo_id']}/commit/1"})()


@pytest.fixture
def fake_api(monkeypatch):
    import huggingface_hub

    FakeApi.calls = []
    monkeypatch.setattr(huggingface_hub, "HfApi", FakeApi)
    return FakeApi


def test_push_to_hub_calls(fake_api, tmp_path):
    folder = tmp_path / "f"
    folder.mkdir()
    (folder / "README.md").write_text("---\n---\n")
    info = push_to_hub(folder, "me/m", private=True, commit_message="hi", revision="v1", token="tok")
    assert info.commit_url.endswith("me/m/commit/1")
    assert fake_api.calls == [
        ("init", "tok"),
        ("create_repo", "me/m", {"private": True, "exist_ok": True, "repo_type": "model"}),
        ("create_branch", "me/m", {"branch": "v1", "exist_ok": True, "repo_type": "model"}),
        ("upload_folder", {"repo_id": "me/m", "folder_path": str(folder), "commit_message": "hi",
                           "revision": "v1", "repo_type": "model"}),
    ]
    fake_api.calls = []
    push_to_hub(folder, "me/m")
    assert [c[0] for c in fake_api.calls] == ["init", "create_repo", "upload_folder"]
    with pytest.raises(FileNotFoundError, match="README"):
        push_to_hub(tmp_path, "me/m")


def test_script_dry_run_and_upload(lora_run, fake_api, tmp_path, capsys):
    script = Path(__file__).resolve().parents[1] / "scripts" / "push_to_hub.py"
    assert "from ludic.hub import main" in script.read_text()
    folder = main([str(lora_run["run"]), "me/tiny", "--no-merge", "--dry-run", "--out-dir", str(tmp_path / "a")])
    assert (folder / "adapter_model.safetensors").exists() and "dry run" in capsys.readouterr().out
    assert fake_api.calls == []
    folder = main([str(lora_run["step"]), "me/tiny", "--private", "--out-dir", str(tmp_path / "b"),
                   "--commit-message", "DPO run"])
    assert (folder / "model.safetensors").exists()
    upload = fake_api.calls[-1]
    assert upload[0] == "upload_folder" and upload[1]["folder_path"] == str(folder)
    assert upload[1]["commit_message"] == "DPO run" and fake_api.calls[1][2]["private"] is True
    assert "uploaded to https://hf.co/me/tiny" in capsys.readouterr().out
