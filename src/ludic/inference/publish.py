"""Weight publishers: push the trainer's policy to inference engines, versioned.

The trainer calls ``publisher.publish(model, version)`` after an optimizer step
(``version`` = the step). A publisher decides whether this step is due
(``every_n_steps``: published when ``version % every_n_steps == 0``; its first publish is
always due), acts only on rank 0 under torch.distributed, and returns timing stats for the
logger.

Engines keep their version across trainer runs (a reused server): they accept only a
version newer than their last one. ``publisher.server_version()`` reads it (the highest
among several servers; None for an engine without state of its own), so a starting trainer
publishes its weights above it, or resets it with ``publish(model, version, force=True)``.

The vLLM publishers are in ``ludic.inference.vllm_publish``; this module holds the interface, the
helpers they share and the in-process publisher.

* ``VLLMAdapterPublisher`` (default for LoRA): ``model.save_pretrained`` of the peft
  adapter into ``out_dir/v<version>``, then ``POST /ludic/load_adapter`` on every server.
  ``out_dir`` must be readable by the servers (same machine or shared disk).
* ``VLLMFullWeightsPublisher``: merged weights (LoRA deltas added out of place, so the
  trainer's base weights never drift) with the base model's parameter names, sent by
  ``"path"`` (safetensors folder on a shared disk, ``/ludic/update_weights``),
  ``"upload"`` (the safetensors bytes in the request body, ``/ludic/upload_weights``) or
  ``"nccl"`` (GPU: vLLM's NCCL weight-transfer engine through ``/ludic/init_communicator``
  and ``/ludic/nccl/*``). ``"auto"`` = path for loopback servers, upload otherwise.
* ``InProcessPublisher(engine)``: for ``VLLMEngineClient`` (adapter by ``LoRARequest`` or
  full reload) and ``TransformersEngine`` (shares the trainer's model: bump the version, or
  copy weights when it holds a separate model).

Connection errors, read timeouts, 429 and 5xx are retried with the same version (a server
answers a repeat of the push it last applied with ``already_applied``, so a retry after a lost
answer is safe). A server that stays unreachable is recorded in the returned stats
(``errors``) and skipped (it gets the next version); one that refuses the push (4xx, e.g. a
non-increasing version from another source) or keeps failing it (5xx) raises ``PublishError``,
which names the server, route, status and answer. FSDP: gather the full state dict on
every rank first and pass it as ``model`` (a mapping of name -> tensor) on rank 0.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from ludic.distributed import is_rank0
from ludic.inference.models import is_peft, unwrap


class PublishError(RuntimeError):
    """A server refused a weight push (4xx), or kept failing it (5xx / 429 after the retries)."""

    def __init__(self, url: str, route: str, status: int, answer: str) -> None:
        self.url, self.route, self.status, self.answer = url, route, status, answer
        super().__init__(f"weight push to {url}{route} failed: HTTP {status}: {answer}")


@runtime_checkable
class WeightPublisher(Protocol):
    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        """Push ``model`` as policy ``version``. Engines accept only versions newer than their
        last one; ``force=True`` makes them take any version (to reset an engine's version)."""
        ...

    def server_version(self) -> int | None:
        """The engines' last version (the highest among several servers): what a (re)starting
        trainer must publish above, or force. None: the engine has no state of its own."""
        ...


class rank0_only:  # noqa: N801 - reads as a decorator-like wrapper
    """Wrap a publisher so only rank 0 publishes (other ranks return ``{"skipped": ...}``)."""

    def __init__(self, inner: WeightPublisher) -> None:
        self.inner = inner

    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        if not is_rank0():
            return {"skipped": "not rank 0", "version": version}
        return self.inner.publish(model, version, force=force)

    def server_version(self) -> int | None:
        return self.inner.server_version()


def _skipped(version: int, every_n_steps: int, first: bool) -> dict[str, Any] | None:
    """Why this publish does nothing, if it does nothing: not rank 0, or not due (a publisher's
    first publish is always due, so the engines start from the trainer's weights)."""
    if not is_rank0():
        return {"skipped": "not rank 0", "version": version}
    if not first and version % every_n_steps != 0:
        return {"skipped": "not due", "version": version}
    return None


# --------------------------------------------------------------------------- helpers


def _clean_name(name: str) -> str:
    while name.startswith("base_model.model."):
        name = name[len("base_model.model."):]
    return name.replace(".base_layer.", ".")


@torch.no_grad()
def merged_state_dict(model: Any, dtype: torch.dtype | None = torch.bfloat16) -> dict[str, torch.Tensor]:
    """Full weights with base-model names; for a peft LoRA model the deltas are added
    out of place (``W + get_delta_weight``), so the trainer's weights are untouched.
    Tied ``lm_head.weight`` is dropped (vLLM ties it from the embeddings)."""
    if isinstance(model, Mapping):
        sd = {_clean_name(k): v for k, v in model.items() if "lora_" not in k}
    else:
        model = unwrap(model)
        deltas: dict[str, torch.Tensor] = {}
        if is_peft(model):
            from peft.tuners.lora import LoraLayer

            for mname, module in model.named_modules():
                if isinstance(module, LoraLayer) and not getattr(module, "merged", False):
                    for adapter in module.active_adapters:
                        if adapter in getattr(module, "lora_A", {}):
                            key = _clean_name(f"{mname}.base_layer.weight")
                            d = module.get_delta_weight(adapter).float()
                            deltas[key] = deltas[key] + d if key in deltas else d
        sd = {}
        for k, v in model.state_dict().items():
            if "lora_" in k:
                continue
            name = _clean_name(k)
            sd[name] = (v.float() + deltas[name]) if name in deltas else v
        cfg = getattr(unwrap(model.get_base_model() if is_peft(model) else model), "config", None)
        if getattr(cfg, "tie_word_embeddings", False):
            sd.pop("lm_head.weight", None)
    out = {}
    for k, v in sd.items():  # no defensive copy: callers serialise before the next optimizer step
        v = v.detach()
        if dtype is not None and v.is_floating_point():
            v = v.to(dtype)
        out[k] = v.contiguous().cpu()
    return out


def prune_versions(root: Path, keep_last: int) -> None:
    """Delete all but the ``keep_last`` newest ``v*`` folders under ``root`` (a publisher's versions)."""
    dirs = sorted((d for d in root.glob("v*") if d.is_dir()), key=lambda d: d.stat().st_mtime)
    for d in dirs[: max(0, len(dirs) - keep_last)]:
        shutil.rmtree(d, ignore_errors=True)


# --------------------------------------------------------------------------- in-process


class InProcessPublisher:
    """Publish to an in-process engine (``VLLMEngineClient`` or ``TransformersEngine``).

    * ``VLLMEngineClient``: ``mode="adapter"`` saves the peft adapter and loads it as a new
      ``LoRARequest``; ``mode="full"`` saves merged safetensors and reloads them.
    * ``TransformersEngine`` holding the trainer's own model: the weights are already
      live, so only ``policy_version`` is bumped; holding another model: its weights are
      copied in (``load_state_dict``) and the version bumped.

    ``server_version()`` is the ``VLLMEngineClient``'s policy version (which ``publish`` must
    exceed unless ``force=True``), and None for a ``TransformersEngine``, which has no state of
    its own (any version is taken).
    """

    def __init__(self, engine: Any, *, mode: str = "adapter", out_dir: str | os.PathLike | None = None,
                 every_n_steps: int = 1, keep_last: int = 3) -> None:
        if mode not in ("adapter", "full"):
            raise ValueError(f"mode must be 'adapter' or 'full', got {mode!r}")
        self.engine = engine
        self.mode = mode
        self._out_dir = Path(out_dir).resolve() if out_dir else None
        self.every_n_steps = every_n_steps
        self.keep_last = keep_last
        self._published = False

    def _is_vllm(self) -> bool:
        return hasattr(self.engine, "load_adapter") and hasattr(self.engine, "update_weights")

    def server_version(self) -> int | None:
        return int(self.engine.policy_version) if self._is_vllm() else None

    @property
    def out_dir(self) -> Path:
        """Where adapter / weight folders go (a temp folder, made on first use, unless given)."""
        if self._out_dir is None:
            self._out_dir = Path(tempfile.mkdtemp(prefix="ludic-inproc-")).resolve()
        return self._out_dir

    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        if (skipped := _skipped(version, self.every_n_steps, not self._published)) is not None:
            return skipped
        out = self._push(model, version, force)
        self._published = True
        return out

    def _push(self, model: Any, version: int, force: bool) -> dict[str, Any]:
        t0 = time.perf_counter()
        eng = self.engine
        model = unwrap(model) if not isinstance(model, Mapping) else model
        if self._is_vllm():  # VLLMEngineClient
            folder = self.out_dir / f"v{version:07d}"
            shutil.rmtree(folder, ignore_errors=True)
            if self.mode == "adapter":
                if not is_peft(model):
                    raise TypeError("mode='adapter' needs a peft model")
                model.save_pretrained(folder)
                t1 = time.perf_counter()
                eng.load_adapter(folder, version=version, force=force)
            else:
                from safetensors.torch import save_file

                folder.mkdir(parents=True)
                save_file(merged_state_dict(model), str(folder / "model.safetensors"), metadata={"format": "pt"})
                t1 = time.perf_counter()
                eng.update_weights(folder, version=version, force=force)
            prune_versions(self.out_dir, self.keep_last)
            t2 = time.perf_counter()
            return {"version": version, "kind": self.mode, "save_s": t1 - t0, "push_s": t2 - t1,
                    "total_s": t2 - t0}
        # TransformersEngine-like: a model attribute and a policy_version counter
        target = getattr(eng, "model", None)
        shared = target is model or (is_peft(model) and target is model.get_base_model())
        if target is not None and not shared:
            target.load_state_dict(model.state_dict() if not isinstance(model, Mapping) else model)
            if hasattr(eng, "weights_changed"):  # frozen weights changed too: the decode view copies all
                eng.weights_changed()
        eng.policy_version = version
        return {"version": version, "kind": "shared" if shared else "copy",
                "total_s": time.perf_counter() - t0}
