"""Publish a trained model on the Hugging Face Hub: prepare a complete folder, then upload it.

    folder = prepare_hub_folder("runs/dpo-x/checkpoints/step_000300", "out/hub",
                                base_model="HuggingFaceTB/SmolLM2-135M-Instruct")
    push_to_hub(folder, "me/smollm2-ttt-dpo")

``prepare_hub_folder`` accepts a Ludic checkpoint (``step_XXXXXX/`` holding
``model/`` and ``trainer_state.json``), a run directory (its ``final/``, else
its latest checkpoint), or a plain Hugging Face model / LoRA adapter folder.
The folder it writes holds:

    a LoRA adapter, merge=True    the base with the adapter merged (safetensors)
    a LoRA adapter, merge=False   the adapter, its base recorded in adapter_config.json and the card
    a full model                  its weights and config
    always                        the tokenizer (the checkpoint's, else the base's) and README.md:
                                  a model card with YAML front matter (base_model, library_name: ludic,
                                  tags), the run's config.json / trainer_state.json, and eval numbers
                                  (summary.json / eval JSON next to the checkpoint, or passed in)

Optimizer, scheduler and RNG states, trainer_state.json and other training
files are never copied. ``python scripts/push_to_hub.py CHECKPOINT REPO_ID``
runs both steps (``--dry-run`` only prepares).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import re
import shutil
import tempfile
from pathlib import Path
from typing import Any

from ludic.inference.models import DEFAULT_MODEL, PACKAGED_ALIASES, resolve_model

EXCLUDED = (
    "*.pt", "*.pth", "optimizer*", "scheduler*", "rng*", "trainer_state.json", "training_args.bin",
    "latest.json", "README.md", "LUDIC_SOURCE.txt", ".*",
)
"""File-name patterns never copied into the hub folder (training state; README.md is rewritten)."""
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "vocab.json")
EVAL_FILES = ("eval.json", "eval_metrics.json", "eval_summary.json")
DEFAULT_COMMIT_MESSAGE = "Upload model trained with Ludic"


# ---------------------------------------------------------------- locating the pieces


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def resolve_checkpoint(path: str | Path) -> tuple[Path, Path | None]:
    """(folder with the weights, Ludic step directory with its trainer state or None) for a checkpoint path."""
    from ludic.training.checkpoint import latest_checkpoint

    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path}: no such checkpoint directory")
    if (path / "trainer_state.json").exists() and (path / "model").is_dir():
        return path / "model", path
    if (path / "final").is_dir():  # a run directory; its latest checkpoint has the trainer state
        ckpts = path / "checkpoints"
        return path / "final", latest_checkpoint(ckpts) if ckpts.is_dir() else None
    for root in (path / "checkpoints", path):
        step = latest_checkpoint(root) if root.is_dir() else None
        if step is not None:
            return step / "model", step
    if (path / "adapter_config.json").exists() or (path / "config.json").exists():
        return path, None
    raise FileNotFoundError(
        f"{path}: not a Ludic checkpoint (model/ + trainer_state.json), run directory, or model/adapter folder"
    )


def _run_dirs(checkpoint: Path, model_dir: Path) -> list[Path]:
    """Directories that may hold the run's config.json / summary.json (nearest first)."""
    out = []
    for d in (checkpoint, checkpoint.parent, checkpoint.parent.parent):
        d = d.resolve()
        if d != model_dir.resolve() and d not in out:
            out.append(d)
    return out


def _is_model_config(data: dict[str, Any]) -> bool:
    return "model_type" in data or "architectures" in data


def find_run_config(checkpoint: Path, model_dir: Path) -> dict[str, Any] | None:
    """The run's resolved config (``config.json`` written by a Ludic recipe), if it is nearby."""
    for d in _run_dirs(checkpoint, model_dir):
        data = _read_json(d / "config.json")
        if data is not None and not _is_model_config(data):
            return data
    return None


def _numbers(data: dict[str, Any]) -> dict[str, float]:
    return {k: v for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def find_metrics(checkpoint: Path, model_dir: Path) -> tuple[dict[str, float], dict[str, float]]:
    """(eval numbers, final training numbers) from summary.json / eval JSON files next to the checkpoint."""
    evals: dict[str, float] = {}
    train: dict[str, float] = {}
    for d in reversed(_run_dirs(checkpoint, model_dir)):  # nearest wins
        for name in EVAL_FILES:
            data = _read_json(d / name)
            if data is not None:
                evals.update(_numbers(data))
        data = _read_json(d / "summary.json")
        if data is not None:
            for k, v in _numbers(data).items():
                (evals if "eval" in k else train)[k] = v
    return evals, train


def hub_base_id(name: str | None) -> str | None:
    """The hub name to record for a base model (the packaged default's cache folder -> its hub id)."""
    if name is None:
        return None
    if name in PACKAGED_ALIASES or (Path(name) / "LUDIC_SOURCE.txt").exists():
        return DEFAULT_MODEL
    return name


def _looks_like_repo_id(name: str | None) -> bool:
    return bool(name) and not Path(name).exists() and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", name) is not None


# ---------------------------------------------------------------- preparing the folder


def _copy_files(src: Path, dst: Path) -> None:
    for f in sorted(src.iterdir()):
        if f.is_file() and not any(fnmatch.fnmatch(f.name, pat) for pat in EXCLUDED):
            shutil.copy2(f, dst / f.name)


def _has_tokenizer(folder: Path) -> bool:
    return any((folder / name).exists() for name in TOKENIZER_FILES)


def _stored_dtype(model_path: str) -> Any:
    import torch
    from transformers import AutoConfig

    cfg = AutoConfig.from_pretrained(model_path)
    dt = getattr(cfg, "dtype", None) or getattr(cfg, "torch_dtype", None)
    if isinstance(dt, str):
        dt = getattr(torch, dt, None)
    return dt if isinstance(dt, torch.dtype) and dt.is_floating_point else torch.float32


def _merge_adapter(adapter_dir: Path, base_path: str, out: Path, dtype: str) -> None:
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
    merged = PeftModel.from_pretrained(base, str(adapter_dir)).merge_and_unload()
    target = _stored_dtype(base_path) if dtype == "auto" else getattr(torch, dtype)
    merged.to(target).save_pretrained(out)


def prepare_hub_folder(
    checkpoint: str | Path,
    out_dir: str | Path,
    *,
    base_model: str | None = None,
    merge: bool = True,
    eval_metrics: dict[str, float] | str | Path | None = None,
    repo_id: str | None = None,
    dtype: str = "auto",
) -> Path:
    """Write a complete, uploadable model folder for ``checkpoint`` into ``out_dir`` (must be new or empty).

    Args:
        checkpoint: Ludic step directory, run directory, or HF model / LoRA adapter folder.
        base_model: base of a LoRA adapter (hub id, local folder, or the packaged default's name);
            defaults to the run config's ``model``, then the adapter's ``base_model_name_or_path``.
        merge: merge a LoRA adapter into the base (else publish the adapter alone).
        eval_metrics: eval numbers for the card (a dict or a JSON file), added to those found nearby.
        repo_id: used in the card's title and usage snippet.
        dtype: merged weights' dtype: "auto" (the base's stored dtype), "float32", "bfloat16" or "float16".
    """
    if dtype not in ("auto", "float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    checkpoint = Path(checkpoint)
    model_dir, step_dir = resolve_checkpoint(checkpoint)
    out = Path(out_dir)
    if out.exists() and any(out.iterdir()):
        raise FileExistsError(f"{out} exists and is not empty")
    out.mkdir(parents=True, exist_ok=True)

    state = _read_json(step_dir / "trainer_state.json") if step_dir else None
    run_config = find_run_config(checkpoint, model_dir)
    evals, train_metrics = find_metrics(checkpoint, model_dir)
    if isinstance(eval_metrics, (str, Path)):
        loaded = _read_json(Path(eval_metrics))
        if loaded is None:
            raise ValueError(f"{eval_metrics}: not a JSON object of eval metrics")
        eval_metrics = loaded
    evals.update(_numbers(eval_metrics or {}))

    adapter_cfg = _read_json(model_dir / "adapter_config.json")
    is_adapter = adapter_cfg is not None
    if not is_adapter and not (model_dir / "config.json").exists():
        raise FileNotFoundError(f"{model_dir}: neither a LoRA adapter nor a model (no adapter_config.json/config.json)")
    base = base_model or (run_config or {}).get("model") or (adapter_cfg or {}).get("base_model_name_or_path")
    if is_adapter and base is None:
        raise ValueError(f"{model_dir} is a LoRA adapter: pass base_model= (--base-model)")
    base_id = hub_base_id(base)

    if is_adapter and merge:
        _merge_adapter(model_dir, resolve_model(base), out, dtype)
        kind = "merged"
    elif is_adapter:
        _copy_files(model_dir, out)
        cfg = _read_json(out / "adapter_config.json") or {}
        cfg["base_model_name_or_path"] = base_id
        (out / "adapter_config.json").write_text(json.dumps(cfg, indent=2))
        kind = "adapter"
    else:
        _copy_files(model_dir, out)
        kind = "full"

    tok_src = str(model_dir) if _has_tokenizer(model_dir) else (resolve_model(base) if base else None)
    if tok_src is None:
        raise FileNotFoundError(f"{model_dir} has no tokenizer and no base model is known: pass base_model=")
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tok_src).save_pretrained(out)

    card = model_card(kind=kind, base_model=base_id, repo_id=repo_id, state=state, run_config=run_config,
                      evals=evals, train_metrics=train_metrics)
    (out / "README.md").write_text(card)
    return out


# ---------------------------------------------------------------- the model card


def _yaml_str(s: str) -> str:
    return json.dumps(s)  # a JSON string is a valid YAML scalar


def _cell(v: Any) -> str:
    if isinstance(v, float):
        text = f"{v:.6g}"
    elif isinstance(v, (dict, list)):
        text = json.dumps(v)
    else:
        text = str(v)
    return text.replace("|", "\\|").replace("\n", " ")


def _table(rows: dict[str, Any], head: tuple[str, str]) -> str:
    lines = [f"| {head[0]} | {head[1]} |", "| --- | --- |"]
    lines += [f"| `{k}` | {_cell(v)} |" for k, v in rows.items()]
    return "\n".join(lines)


def model_card(
    *,
    kind: str,
    base_model: str | None,
    repo_id: str | None = None,
    state: dict[str, Any] | None = None,
    run_config: dict[str, Any] | None = None,
    evals: dict[str, float] | None = None,
    train_metrics: dict[str, float] | None = None,
) -> str:
    """README.md text: YAML front matter, what the model is, how to load it, training config, eval numbers."""
    algorithm = (state or {}).get("algorithm")
    tags = ["ludic", "text-generation"] + ([str(algorithm)] if algorithm else []) + (
        ["lora", "peft"] if kind == "adapter" else ["lora-merged"] if kind == "merged" else [])
    front = ["---"]
    if _looks_like_repo_id(base_model):
        front.append(f"base_model: {_yaml_str(base_model)}")  # type: ignore[arg-type]
    front += ["library_name: ludic", "pipeline_tag: text-generation", "tags:"]
    front += [f"- {_yaml_str(t)}" for t in dict.fromkeys(tags)]
    front.append("---")

    name = f"`{repo_id}`" if repo_id else "This model"
    base_txt = f"`{base_model}`" if base_model else "its base model"
    what = {
        "merged": f"a LoRA adapter merged into {base_txt}",
        "adapter": f"a LoRA adapter for {base_txt} (load the base, then the adapter)",
        "full": f"a full fine-tune of {base_txt}" if base_model else "a full fine-tune",
    }[kind]
    body = [f"# {repo_id.split('/')[-1] if repo_id else 'Ludic model'}", "",
            f"{name} is {what}, trained with Ludic"
            + (f" ({algorithm})" if algorithm else "") + "."]
    rid = repo_id or "<repo_id>"
    if kind == "adapter":
        usage = ("from peft import PeftModel\nfrom transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                 f"base = AutoModelForCausalLM.from_pretrained({json.dumps(base_model or '<base_model>')})\n"
                 f"model = PeftModel.from_pretrained(base, {json.dumps(rid)})\n"
                 f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(rid)})")
    else:
        usage = ("from transformers import AutoModelForCausalLM, AutoTokenizer\n\n"
                 f"model = AutoModelForCausalLM.from_pretrained({json.dumps(rid)})\n"
                 f"tokenizer = AutoTokenizer.from_pretrained({json.dumps(rid)})")
    body += ["", "## Usage", "", "```python", usage, "```"]

    body += ["", "## Evaluation", ""]
    body.append(_table(evals, ("metric", "value")) if evals else "No evaluation numbers were recorded.")

    body += ["", "## Training", ""]
    if state:
        facts = {k: state[k] for k in ("algorithm", "step", "policy_version", "peft") if k in state}
        body += [_table(facts, ("", "")), ""]
    if run_config:
        body += ["Run configuration:", "", _table(run_config, ("option", "value")), ""]
    if state and isinstance(state.get("trainer_config"), dict):
        body += ["Optimizer settings:", "", _table(state["trainer_config"], ("option", "value")), ""]
    if train_metrics:
        body += ["Final training metrics:", "", _table(train_metrics, ("metric", "value")), ""]
    if not (state or run_config or train_metrics):
        body += ["No training record was found next to the checkpoint.", ""]
    return "\n".join(front) + "\n\n" + "\n".join(body).rstrip() + "\n"


# ---------------------------------------------------------------- upload


def push_to_hub(
    folder: str | Path,
    repo_id: str,
    *,
    private: bool = False,
    commit_message: str = DEFAULT_COMMIT_MESSAGE,
    revision: str | None = None,
    token: str | None = None,
) -> Any:
    """Create ``repo_id`` if needed (and the ``revision`` branch) and upload ``folder``; returns the CommitInfo."""
    from huggingface_hub import HfApi

    folder = Path(folder)
    if not (folder / "README.md").exists():
        raise FileNotFoundError(f"{folder} has no README.md: prepare it with prepare_hub_folder first")
    api = HfApi(token=token)
    api.create_repo(repo_id, private=private, exist_ok=True, repo_type="model")
    if revision is not None:
        api.create_branch(repo_id, branch=revision, exist_ok=True, repo_type="model")
    return api.upload_folder(repo_id=repo_id, folder_path=str(folder), commit_message=commit_message,
                             revision=revision, repo_type="model")


def main(argv: list[str] | None = None) -> Path:
    p = argparse.ArgumentParser(prog="push_to_hub.py",
                                description="Prepare a Ludic checkpoint and upload it to the Hugging Face Hub.")
    p.add_argument("checkpoint", help="step_XXXXXX/ checkpoint, run directory, or HF model / LoRA adapter folder")
    p.add_argument("repo_id", help="target repository, e.g. me/smollm2-ttt-dpo")
    p.add_argument("--base-model", default=None, help="base model of a LoRA adapter (default: the run's --model)")
    p.add_argument("--private", action="store_true", help="create the repository as private")
    p.add_argument("--no-merge", dest="merge", action="store_false",
                   help="upload the LoRA adapter, not merged weights")
    p.add_argument("--dtype", default="auto",
                   help="merged weights' dtype: auto (the base's), float32, bfloat16, float16")
    p.add_argument("--eval-json", default=None, help="JSON file of eval numbers for the model card")
    p.add_argument("--revision", default=None, help="branch to upload to (created if missing)")
    p.add_argument("--commit-message", default=DEFAULT_COMMIT_MESSAGE)
    p.add_argument("--out-dir", default=None, help="where to prepare the folder (default: a new temporary directory)")
    p.add_argument("--dry-run", action="store_true", help="only prepare the folder and print it")
    args = p.parse_args(argv)
    out = Path(args.out_dir) if args.out_dir else Path(tempfile.mkdtemp(prefix="ludic-hub-"))
    folder = prepare_hub_folder(args.checkpoint, out, base_model=args.base_model, merge=args.merge,
                                eval_metrics=args.eval_json, repo_id=args.repo_id, dtype=args.dtype)
    print(f"prepared {folder}:")
    for f in sorted(folder.iterdir()):
        print(f"  {f.name:<32} {f.stat().st_size:>12,d} bytes")
    if args.dry_run:
        print("dry run: nothing uploaded")
        return folder
    info = push_to_hub(folder, args.repo_id, private=args.private, commit_message=args.commit_message,
                       revision=args.revision)
    print(f"uploaded to {getattr(info, 'commit_url', None) or args.repo_id}")
    return folder
