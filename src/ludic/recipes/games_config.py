"""The original games trainer's JSON configs (train_config.json, env_config.json,
trace_config.json) mapped onto ``ludic train games`` flags: fields with a meaning here become
flags, fields without one (docker mode, 4-bit, a remote vLLM URL) are accepted with a one-line
warning each, and an unknown field is an error that names it."""

from __future__ import annotations

from typing import Any

_TRAIN_FIELDS: dict[str, str | None] = {
    "model_name": "--model", "model": "--model", "learning_rate": "--lr", "ppo_epochs": "--ppo-epochs",
    "init_kl_coef": "--kl-coef", "target_kl": None, "cliprange": "--clip", "cliprange_value": "--value-clip",
    "vf_coef": "--vf-coef", "num_train_steps": "--train-steps", "save_freq": "--checkpoint-every",
    "eval_freq": "--eval-every", "max_new_tokens": "--max-completion-tokens", "temperature": "--temperature",
    "max_seq_length": "--max-seq-len", "output_dir": "--run-dir", "min_valid_samples_per_step": "--episodes-per-update",
    "lora_r": "--lora-rank",
    # fields without a meaning here: accepted with a warning
    "use_4bit": None, "bnb_4bit_compute_dtype": None, "bnb_4bit_quant_type": None, "bnb_4bit_use_double_quant": None,
    "gradient_accumulation_steps": None, "log_freq": None, "top_p": None, "max_collection_episodes": None,
    "wandb_project": None, "lora_dropout": None, "lora_bias": None, "lora_target_modules": None,
    "batch_size": None, "mini_batch_size": None, "resume_from": None, "use_wandb": None, "lora_alpha": None,
}
_WHY = {
    "use_4bit": "no 4-bit quantisation on CPU (bitsandbytes); the model runs in --dtype",
    "gradient_accumulation_steps": "micro-batches are cut by --micro-token-budget",
    "top_p": "sampling is full-distribution so the PPO ratio is exact",
    "lora_target_modules": "LoRA covers every projection",
    "batch_size": "mapped with mini_batch_size to --num-minibatches",
}
_ENV_FIELDS = {"env_type", "env_mode", "allowed_game_indices", "opponent", "gamma", "use_vllm", "vllm_base_url",
               "timeout", "api_key"}


def original_config_argv(train: dict[str, Any] | None = None, env: dict[str, Any] | None = None,
                         warn: Any = print) -> list[str]:
    """Flags of ``ludic train games`` equivalent to the original trainer's train_config.json and
    env_config.json / trace_config.json. Fields with no meaning here (docker mode, 4-bit, a remote
    vLLM URL, ...) are accepted with a one-line warning each; an unknown field is a ValueError
    naming it."""
    argv: list[str] = []
    train, env = dict(train or {}), dict(env or {})
    for key, value in train.items():
        if key.startswith("bnb_"):
            key_map = None
        elif key not in _TRAIN_FIELDS:
            raise ValueError(f"train config: unknown field {key!r} (known: {', '.join(sorted(_TRAIN_FIELDS))})")
        else:
            key_map = _TRAIN_FIELDS[key]
        if key_map is None:
            if key not in ("batch_size", "mini_batch_size", "lora_alpha", "use_wandb", "resume_from", "target_kl"):
                warn(f"[ludic] train config: {key!r} has no meaning here ({_WHY.get(key, 'ignored')})")
            continue
        argv += [key_map, str(value)]
    if "target_kl" in train:  # TRL's controller targets the KL summed over a response; ours is per token
        argv += ["--kl-target", str(float(train["target_kl"]) / max(1, int(train.get("max_new_tokens", 8))))]
    if "batch_size" in train and "mini_batch_size" in train:
        argv += ["--num-minibatches", str(max(1, int(train["batch_size"]) // max(1, int(train["mini_batch_size"]))))]
    if "lora_alpha" in train:
        argv += ["--lora-alpha-mult", str(float(train["lora_alpha"]) / float(train.get("lora_r", 16)))]
    if train.get("use_wandb"):
        argv += ["--logger", "rich,wandb"]
    if train.get("resume_from"):
        warn("[ludic] train config: 'resume_from' -> the run resumes from the latest checkpoint in its run_dir")
    for key, value in env.items():
        if key not in _ENV_FIELDS:
            raise ValueError(f"env config: unknown field {key!r} (known: {', '.join(sorted(_ENV_FIELDS))})")
        if key == "allowed_game_indices":
            argv += ["--games", ",".join(f"index:{int(i)}" for i in value)]
        elif key == "opponent" and value:
            argv += ["--opponent", str(value)]
        elif key == "gamma":
            argv += ["--gamma", str(value)]
        elif key == "env_type":
            if value == "trace":
                argv += ["--games", "trace"]
            elif value != "openspiel":
                raise ValueError(f"env config: env_type must be openspiel or trace, got {value!r}")
        else:
            warn(f"[ludic] env config: {key!r} has no meaning here (games run in process on pyspiel, "
                 "sampling on the trained policy)")
    return argv


