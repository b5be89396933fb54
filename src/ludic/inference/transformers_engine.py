"""In-process batched sampler on a transformers model: the embedded default on CPU.

``TransformersEngine`` implements ``ChatClient``. Requests from concurrently
running episodes are queued and served together: a background task takes
everything pending, runs one batched generation (prefill + KV-cached decode)
on the event loop's own thread (``threaded=True``: a worker thread), and
resolves each request's future at the decode step its row finishes, letting
the loop run between such steps: an episode whose reply is done goes on (and
an evaluation's progress counts it) while the batch's longer rows still
generate (its next turn joins the next batch). The loop is busy otherwise
while a batch generates; the episodes are waiting for it anyway. A worker
thread gets its own OpenMP team, and on 2 cores two teams slowed each other:
rollouts took 40% longer than the bare engine and the trainer's step 3.2 s
instead of 2.0 s. On this 2-core CPU one
sequence generates at ~15 tok/s while a batch of 32 reaches ~150 tok/s, so
batching across episodes is what makes CPU rollouts practical.

The engine holds a reference to the trainer's model (no copy): after an
optimizer step, bump ``policy_version`` and the next tokens come from the new
weights. Every sampled token is tagged with the version that produced it. A bf16
model trained with fp32 master weights (``training.precision``) is sampled in bf16:
the trainer rounds its masters into the model's parameters after every step. The
LoRA decode view (the fast path) holds bf16 copies of the fp32 adapters, refreshed
when the policy moved: a new ``policy_version``, or a trainer step on the model
(``models.weights_step``), never by tensor version counters (a fused AdamW step
changes a tensor in place without bumping its counter). Code that changes weights
otherwise (loading a checkpoint or a kept adapter) calls ``weights_changed()``.

Sampling is per request: temperature (0 = greedy), top-k, top-p, max tokens,
stop strings and a seed (inverse-CDF draws from a per-request generator, so a
seed reproduces its tokens given the same batch layout). Log-probs are those of
the distribution each token was drawn from: log_softmax(logits / T), over the
top-k / top-p set when those are on (vLLM's ``processed_logprobs``); greedy
rows report temperature-1 log-probs. The trainer scores at the same T.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Iterator

import torch

from ludic.tokenization import MIN_SHARED_PREFIX, common_prefix_len, render_ids
from ludic.inference.client import ChatRequest, ChatResponse, SamplingParams
from ludic import fastpath
from ludic.inference.decode import StaticDecoder, cast_adapter_view, repack
from ludic.architectures import decoder_body, decoder_layers, frozen_bottom_layers, llama_like
from ludic.inference.models import weights_step
from ludic.inference.prefix_cache import (BottomCache, PrefixCache, assemble, extract, last_index as _last,
                                          prefill_over_bottom)
from ludic.inference.sampling import generator, sample
from ludic.types import FinishReason, TokenTrace


@dataclass
class _Pending:
    request: ChatRequest
    prompt_ids: list[int]
    future: asyncio.Future


class TransformersEngine:
    """Batched in-process generation (ChatClient).

    Args:
        model: a causal LM (plain or peft-wrapped); shared, not copied.
        tokenizer: its tokenizer (chat template required for message prompts).
        max_batch_size: most sequences per generation batch.
        batch_wait_s: how long to wait for more requests before starting a batch.
        cast_adapters: sample from a decode view of a LoRA model (``decode.cast_adapter_view``): the
            LoRA linears that read one input (q, k, v; gate, up) become one matmul over their base
            weights, prepacked for oneDNN, one small matmul with their ``A`` and one ``addmm`` with
            their block-diagonal ``B`` (peft: three matmuls per linear, plus casts of every layer's
            input to the fp32 adapters and back), in the base weights' dtype. Before a batch the
            view copies in the trainable tensors (the adapters) when ``policy_version`` or the
            model's trainer steps (``models.weights_step``) moved since its last copy, and every
            tensor, repacking the base weights, after ``weights_changed()`` or ``swap_weights`` (a
            full-weight load). Every other tensor is shared with the model; the adapted linears'
            base weights are held once more, packed (about 200 MB for SmolLM2-135M in bf16 with LoRA
            on every linear), and that copy is shared by every engine over the same base tensors
            (``inference.packing.shared_weights``: a frozen opponent sharing the policy's base). Nothing
            to do when the model has no adapters. Part of the fast path (``ludic.fastpath``): off, the
            model decodes itself.
        threaded: generate on a worker thread instead of the event loop's thread (see above).
        static_decode: decode Llama-family models with ``decode.StaticDecoder`` (a preallocated fp32
            key/value cache written in place, one grouped attention matmul per layer) instead of the
            model's forward with transformers' dynamic cache; other architectures, and the fast path
            off (``ludic.fastpath``), always use the forward.
        prefix_cache_bytes: most bytes of earlier prompts' keys and values kept (``inference.prefix_cache``), so
            a dialog's next turn prefills only its new tokens; emptied when the weights move (0: off). Llama-family
            models without a sliding window only (``architectures.llama_like``); others prefill every turn.
        bottom_cache_bytes: most bytes of prompts' frozen bottoms kept (``prefix_cache.BottomCache``: the keys,
            values and output of the decoder layers below the lowest trained one), so a prompt met again after
            trainer steps prefills only the layers above (0: off). Valid across trainer steps, emptied by
            ``weights_changed``; Llama-family models with the fast path on only. With a LoRA on SmolLM2's top 15 of
            30 layers, the rewards-only tic-tac-toe recipe's batches prefill half the layers (``benchmarks/
            bench_bottom_cache.py``).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_batch_size: int = 64,
        batch_wait_s: float = 0.01,
        device: str | None = None,
        cast_adapters: bool = True,
        threaded: bool = False,
        static_decode: bool = True,
        prefix_cache_bytes: int = 2 << 30,
        bottom_cache_bytes: int = 1 << 30,
    ) -> None:
        self.model = model
        self.prefix_cache = PrefixCache(prefix_cache_bytes)
        self.bottom_cache = BottomCache(bottom_cache_bytes)
        self.static_decode = static_decode
        self._static: tuple[Any, StaticDecoder | None] | None = None  # (decode module, its decoder)
        self.cast_adapters = cast_adapters
        self.threaded = threaded
        self._decoder: tuple[Any, Any, list[torch.Tensor], list[torch.Tensor]] | None = None  # (of, view, src, dst)
        self._synced: tuple[int, int] | None = None  # (policy version, trainer steps) at the view's last copy
        self._tokenizer = tokenizer
        self.max_batch_size = max_batch_size
        self.batch_wait_s = batch_wait_s
        self.device = torch.device(device) if device else next(model.parameters()).device
        self.policy_version = 0
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self.stop_ids = _stop_token_ids(model, tokenizer)
        self._queue: list[_Pending] = []
        self._wakeup: asyncio.Event | None = None
        self._runner: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._gen_lock: asyncio.Lock | None = None  # held while a batch generates (swap_weights waits)
        self.stats = {"batches": 0, "sequences": 0, "tokens": 0, "seconds": 0.0}

    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    async def _call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the event loop's own thread (``threaded=False``) or on a worker thread."""
        if not self.threaded:
            return fn(*args)
        return await asyncio.to_thread(fn, *args)

    # -- ChatClient --------------------------------------------------------
    async def complete(self, request: ChatRequest) -> ChatResponse:
        loop = self._ensure_runner()
        prompt = list(request.prompt_ids) if request.prompt_ids is not None else render_ids(
            self._tokenizer, request.messages
        )
        fut: asyncio.Future = loop.create_future()
        self._queue.append(_Pending(request, prompt, fut))
        assert self._wakeup is not None
        self._wakeup.set()
        return await fut

    def _ensure_runner(self) -> asyncio.AbstractEventLoop:
        """Start the batching task (and its event and lock) on the running loop, once per loop."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._runner is None or self._runner.done():
            self._loop = loop
            self._wakeup = asyncio.Event()
            self._gen_lock = asyncio.Lock()
            self._runner = loop.create_task(self._run())
        return loop

    async def _run(self) -> None:
        assert self._wakeup is not None
        while True:
            await self._wakeup.wait()
            self._wakeup.clear()
            await asyncio.sleep(self.batch_wait_s)  # let concurrent episodes join
            if not self._queue:
                continue
            batch = self._queue[: self.max_batch_size]
            del self._queue[: len(batch)]
            if self._queue:  # the rest: the next batch, with the turns that arrive meanwhile
                self._wakeup.set()
            try:
                assert self._gen_lock is not None
                async with self._gen_lock:
                    await self._serve(batch)
            except Exception as e:  # surface as failed requests, keep serving
                for p in batch:
                    if not p.future.done():
                        p.future.set_result(ChatResponse.failed(f"{type(e).__name__}: {e}", tuple(p.prompt_ids)))

    async def _serve(self, batch: list[_Pending]) -> None:
        """Generate ``batch``, resolving each request's future at the step its row finishes (``generate_steps``)."""
        prompts, sampling = [p.prompt_ids for p in batch], [p.request.sampling for p in batch]
        if self.threaded:
            loop = asyncio.get_running_loop()

            def work() -> None:
                for done in self.generate_steps(prompts, sampling):
                    for i, r in done:
                        loop.call_soon_threadsafe(_resolve, batch[i].future, r)

            await asyncio.to_thread(work)
            return
        for done in self.generate_steps(prompts, sampling):
            for i, r in done:
                _resolve(batch[i].future, r)
            if done:
                await asyncio.sleep(0)  # the finished rows' episodes go on before the next decode step

    async def swap_weights(self, load: Any, version: int) -> None:
        """Run ``load()`` (which changes the model's weights) between two generation batches and
        tag the tokens generated after it with ``version``: an update in flight, as in PipelineRL.
        Requests already queued, or the next turns of running episodes, get the new weights."""
        self._ensure_runner()
        assert self._gen_lock is not None
        async with self._gen_lock:
            await self._call(load)
            self.weights_changed()
            self.policy_version = version

    def weights_changed(self) -> None:
        """Every weight of the model may have changed (a full-weight load, a checkpoint or a kept
        adapter loaded without a new ``policy_version``): the next batch copies all of them into the
        decode view, repacks its weights and rebuilds the static decoder (its packed LM head is a
        snapshot). A version bump alone refreshes only the trainable tensors."""
        self._synced = None
        self._static = None
        self.prefix_cache.clear()
        self.bottom_cache.clear()

    # -- batched generation -------------------------------------------------
    def generate(self, prompts: list[list[int]], sampling: list[SamplingParams]) -> list[ChatResponse]:
        """Generate one completion per prompt in a single batch (synchronous)."""
        out: list[Any] = [None] * len(prompts)
        for done in self.generate_steps(prompts, sampling):
            for i, r in done:
                out[i] = r
        return out

    def generate_steps(self, prompts: list[list[int]], sampling: list[SamplingParams]
                       ) -> Iterator[list[tuple[int, ChatResponse]]]:
        """``generate`` one decode step at a time: after each step, the ``(index, response)`` of the rows that
        finished at it (often none); every row finishes once."""
        if not prompts:
            return
        t0 = time.perf_counter()
        was_training = self.model.training
        self.model.eval()
        tokens = 0
        try:
            with torch.no_grad():  # entered per step: the loop runs other code between steps, with its own grad mode
                rows = self._generate(self._decode_model(), prompts, sampling)
            while True:
                with torch.no_grad():
                    done = next(rows, None)
                if done is None:
                    break
                tokens += sum(len(r.trace.completion_ids) for _, r in done)
                yield done
        finally:
            if was_training:
                self.model.train()
            if self._static is not None and self._static[1] is not None:
                self._static[1].release()  # sized by this batch: not held until the next one
        self.stats["batches"] += 1
        self.stats["sequences"] += len(prompts)
        self.stats["tokens"] += tokens
        self.stats["seconds"] += time.perf_counter() - t0

    def _decode_model(self) -> Any:
        """The module to decode with: the model, or its LoRA decode view (``cast_adapters`` and the
        fast path on), refreshed as the class docstring says."""
        if not self.cast_adapters or not fastpath.enabled(self.device):
            return self.model
        if self._decoder is None or self._decoder[0] is not self.model:
            self._decoder = (self.model, *(cast_adapter_view(self.model) or (self.model, [], [])))
            self._synced = None
        _, view, src, dst = self._decoder
        now = (self.policy_version, weights_step(self.model))
        if self._synced is None:  # everything, cast to the base dtype, and the base weights repacked
            if src:
                torch._foreach_copy_(dst, src)
            repack(view)
        elif self._synced != now:  # a new policy: the trained tensors (the adapters)
            stale = [i for i, t in enumerate(src) if t.requires_grad]
            if stale:
                torch._foreach_copy_([dst[i] for i in stale], [src[i] for i in stale])
        self._synced = now
        return view

    def _static_decoder(self, model: Any) -> StaticDecoder | None:
        """The ``StaticDecoder`` of the decode module ``model`` (built once per module), or None."""
        if not self.static_decode or not fastpath.enabled(self.device):
            return None
        if self._static is None or self._static[0] is not model:
            self._static = (model, StaticDecoder.build(model))
        return self._static[1]

    def _bottom_layers(self) -> int:
        """How many frozen bottom layers the prefill reads from ``bottom_cache`` (0: off): those of the model
        (``architectures.frozen_bottom_layers``) when a layer above them trains; a model that trains nothing
        prefills as it always did."""
        if not self.bottom_cache.max_bytes or not fastpath.enabled(self.device) or not llama_like(self.model):
            return 0
        layers = frozen_bottom_layers(self.model)
        layers = layers if layers < len(decoder_layers(self.model)) else 0
        self.bottom_cache.sync(layers, self.model)
        return layers

    def _layout(self, model: Any, unique: list[list[int]], L: int) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """A fresh prefill's inputs: the cache of the ``L`` tokens every prompt starts with, computed once
        and repeated per prompt (None when L is 0), each prompt's rest left-padded [U, T], the mask [U, L + T]."""
        U, dev = len(unique), self.device
        past = None
        if L:
            prefix = torch.tensor([unique[0][:L]], dtype=torch.long, device=dev)
            past = model(input_ids=prefix, use_cache=True, logits_to_keep=_last(L, dev)).past_key_values
            past.batch_repeat_interleave(U)
        tails = [p[L:] for p in unique]
        T = max(len(p) for p in tails)
        input_ids = torch.full((U, T), self.pad_id, dtype=torch.long, device=dev)
        attn = torch.zeros((U, L + T), dtype=torch.long, device=dev)
        attn[:, :L] = 1
        for i, p in enumerate(tails):
            input_ids[i, T - len(p):] = torch.tensor(p, dtype=torch.long)
            attn[i, L + T - len(p):] = 1
        return past, input_ids, attn

    def _generate(self, model: Any, prompts: list[list[int]], sampling: list[SamplingParams]
                  ) -> Iterator[list[tuple[int, ChatResponse]]]:
        """The batch's decode steps (``generate_steps``): after each, the rows that finished at it."""
        B, dev = len(prompts), self.device
        # Each distinct prompt is prefilled once (a GRPO group is one prompt sampled many times), and a
        # prefix shared by all of them (the system prompt) once for all; rows then gather their prompt's
        # cache, last logits and positions. Rows run sorted by prompt (the static decoder then reads a
        # prompt's keys once for all its rows) and are returned in the caller's order.
        distinct: dict[tuple[int, ...], int] = {}
        keys = [distinct.setdefault(tuple(p), len(distinct)) for p in prompts]
        order = sorted(range(B), key=keys.__getitem__)
        if order != list(range(B)):
            for done in self._generate(model, [prompts[i] for i in order], [sampling[i] for i in order]):
                yield [(order[j], r) for j, r in done]
            return
        row_of = torch.tensor(keys, device=dev)
        unique = [list(p) for p in distinct]
        U = len(unique)
        reuse = bool(self.prefix_cache.max_bytes) and llama_like(self.model)  # one full-length cache per layer
        self.prefix_cache.sync((self.policy_version, weights_step(self.model)))
        cached = [self.prefix_cache.longest(p) if reuse else (0, None) for p in unique]  # the dialogs' earlier turns
        resumed = any(n for n, _ in cached)
        if resumed:
            past, input_ids, attn, L = assemble(cached, [p[n:] for p, (n, _) in zip(unique, cached)], self.pad_id, dev)
        else:  # a prefix shared by every prompt (the system prompt) once, then left padding before each tail
            L = common_prefix_len(unique)
            L = L if L >= MIN_SHARED_PREFIX else 0
        bottom = 0 if resumed else self._bottom_layers()
        if bottom:  # each prompt's frozen bottom from the cache (computed once): only the trained layers run
            out, past, attn = prefill_over_bottom(model, bottom, self.bottom_cache.lookup(decoder_body(model), unique, dev),
                                                  unique, L)
        else:
            if not resumed:
                past, input_ids, attn = self._layout(model, unique, L)
            out = model(
                input_ids=input_ids, attention_mask=attn, position_ids=(attn.cumsum(-1) - 1).clamp(min=0)[:, L:],
                past_key_values=past, use_cache=True, logits_to_keep=_last(input_ids.shape[1], dev),
            )
            past = out.past_key_values
        positions = (attn.cumsum(-1) - 1).clamp(min=0)[:, L:]

        temps = torch.tensor([s.temperature for s in sampling], device=dev, dtype=torch.float32)
        top_ps = torch.tensor([s.top_p for s in sampling], device=dev, dtype=torch.float32)
        top_ks = torch.tensor([s.top_k for s in sampling], device=dev, dtype=torch.long)
        max_new = [s.max_tokens for s in sampling]
        gens = [generator(s.seed) for s in sampling]

        if reuse:
            for p, kv in zip(unique, extract(past, attn)):
                self.prefix_cache.put(p, kv)
        logits = out.logits[:, -1, :].float()[row_of]
        steps = max(max_new)
        static = self._static_decoder(model)
        if static is not None:
            static.start(past, attn, steps, rows=row_of)
            past = out = None  # the decoder holds its own copy of the prefilled cache
        elif U < B:
            past.batch_select_indices(row_of)
        attn, pos = attn[row_of], positions[row_of, -1]
        tokens: list[list[int]] = [[] for _ in range(B)]
        logps: list[list[float]] = [[] for _ in range(B)]
        versions: list[list[int]] = [[] for _ in range(B)]
        finish: list[FinishReason | None] = [None] * B
        texts: list[str | None] = [None] * B

        def response(i: int) -> ChatResponse:
            text = texts[i] if texts[i] is not None else self._tokenizer.decode(tokens[i], skip_special_tokens=True)
            trace = TokenTrace(
                prompt_ids=tuple(prompts[i]), completion_ids=tuple(tokens[i]), logprobs=tuple(logps[i]),
                policy_versions=tuple(versions[i]), finish_reason=finish[i] or FinishReason.LENGTH,
                temperature=sampling[i].temperature, top_p=sampling[i].top_p, top_k=sampling[i].top_k,
            )
            return ChatResponse(text=text, trace=trace, info={"batch_size": B})

        finished: list[int] = []
        for _ in range(steps):
            chosen, chosen_logp = sample(logits, temps, top_ps, top_ks, gens)
            ids, lps = chosen.tolist(), chosen_logp.tolist()
            version = self.policy_version
            finished = []
            for i in range(B):
                if finish[i] is not None:
                    continue
                tok = ids[i]
                tokens[i].append(tok)
                logps[i].append(lps[i])
                versions[i].append(version)
                if tok in self.stop_ids:
                    finish[i] = FinishReason.STOP
                elif sampling[i].stop and (cut := _stop_string_text(self._tokenizer, tokens[i], sampling[i].stop)):
                    finish[i], texts[i] = FinishReason.STOP, cut
                elif len(tokens[i]) >= max_new[i]:
                    finish[i] = FinishReason.LENGTH
                if finish[i] is not None:
                    finished.append(i)
            if all(f is not None for f in finish):
                break
            yield [(i, response(i)) for i in finished]
            nxt = torch.tensor(
                [tokens[i][-1] if finish[i] is None else self.pad_id for i in range(B)],
                dtype=torch.long, device=dev,
            )
            pos = pos + 1
            if static is not None:
                logits = static.step(nxt, pos)
                continue
            attn = torch.cat([attn, torch.ones((B, 1), dtype=attn.dtype, device=dev)], dim=1)
            out = model(
                input_ids=nxt[:, None], attention_mask=attn, position_ids=pos[:, None],
                past_key_values=past, use_cache=True,
            )
            past = out.past_key_values
            logits = out.logits[:, -1, :].float()

        yield [(i, response(i)) for i in range(B) if finish[i] is None or i in finished]  # the last step's (or none)


def _resolve(future: asyncio.Future, response: ChatResponse) -> None:
    """Hand a finished row's response to its request (unless the request was already answered or cancelled)."""
    if not future.done():
        future.set_result(response)


def _stop_token_ids(model: Any, tokenizer: Any) -> set[int]:
    ids: set[int] = set()
    for src in (getattr(getattr(model, "generation_config", None), "eos_token_id", None), tokenizer.eos_token_id):
        if isinstance(src, int):
            ids.add(src)
        elif isinstance(src, (list, tuple)):
            ids.update(int(x) for x in src)
    return ids


def _stop_string_text(tokenizer: Any, ids: list[int], stops: tuple[str, ...]) -> str | None:
    """Decoded text cut just after the first stop string, or None if none occurs."""
    text = tokenizer.decode(ids, skip_special_tokens=True)
    hits = [(text.find(s), s) for s in stops if s and s in text]
    if not hits:
        return None
    at, s = min(hits)
    return text[: at + len(s)]
