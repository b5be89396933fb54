"""VLLMChatClient: token-in / token-out over HTTP to a vLLM (or Ludic vLLM) server.

Token-in: ``request.prompt_ids`` (or the local tokenizer's rendering of the messages) is
sent as a token-id prompt to ``/v1/completions``; the server's echoed
``prompt_token_ids`` are checked against what was sent. Without a local tokenizer the
messages go to ``/v1/chat/completions`` and the server's rendered prompt ids come back.

Token-out: completion ids exactly as sampled (the EOS token is included when the model
stopped on it, as vLLM reports it in ``token_ids``), the log-probability of each sampled
token, and the policy version per token.

Log-probs are those of the distribution each token was sampled from. The Ludic server runs
vLLM with ``--logprobs-mode processed_logprobs``, which in vLLM 0.32 is the log-softmax of the
logits after the request's logits processors and penalties, the temperature (``logits / T``)
and top-k / top-p: tokens outside the top-k or the nucleus get -inf and the rest are
renormalised over what is kept. With ``top_p=1`` and no top-k that is exactly
``log_softmax(logits / T)``, what the trainer computes at the sampling temperature (as TRL
and verl do); with ``top_p < 1`` it is larger than the trainer's full-vocabulary value by
``-log(mass of the nucleus)``. Greedy requests (temperature 0) get ``log_softmax(logits)``.
A plain vLLM server defaults to ``raw_logprobs`` (temperature 1, before any processing):
start it with ``--logprobs-mode processed_logprobs`` (the client warns when a Ludic server
reports another mode).

Policy version: on a Ludic server (``python -m ludic.inference.vllm_server``) the client
asks for the model alias ``ludic-policy``; the server resolves it at admission to the
current policy (newest LoRA adapter, or the base weights) and returns the version of
those weights in the ``x-ludic-policy-version`` header. Every token of the completion is
tagged with it: a request is sampled by one version (adapter requests are pinned to their
adapter; full-weight swaps drain in-flight requests first). If a swap had to cut a drain
short, ``info["policy_mixed"]`` is True and the tokens carry the older version. On a plain
vLLM server there is no versioning and tokens carry version 0. An explicit ``model`` (e.g.
an adapter served with ``--lora-modules ttt_rl=...``) is used as given.

Failures never raise to the caller: connection errors, timeouts, 429 and 5xx are retried
with exponential backoff (covering a server restart); after ``max_retries`` the request
becomes ``ChatResponse.failed`` (a failed rollout step, not a crashed run).
"""

from __future__ import annotations

import asyncio
import logging
import os
import random
import time
from typing import Any

import httpx

from ludic.tokenization import render_ids
from ludic.inference.client import ChatRequest, ChatResponse
from ludic.inference.wire import MIXED_HEADER, POLICY_ALIAS, VERSION_HEADER, auth_headers, client_token
from ludic.types import FinishReason, TokenTrace

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
logger = logging.getLogger("ludic.vllm_client")


class PolicyVersionError(RuntimeError):
    """The server's policy version could not be read (unreachable, or not a Ludic server)."""


class _GaveUp(Exception):
    """A request failed after all retries (or with a non-retryable status)."""


def _load_tokenizer(tokenizer: Any) -> Any:
    if tokenizer is None or not isinstance(tokenizer, (str, os.PathLike)):
        return tokenizer
    from ludic.inference.models import load_tokenizer

    return load_tokenizer(str(tokenizer))


class VLLMChatClient:
    """ChatClient for a vLLM OpenAI-compatible server.

    Args:
        base_url: e.g. ``http://127.0.0.1:8000`` (else built from ``host``/``port``).
        model: model or adapter name to request; None follows the server's current
            policy (Ludic server) or its only model (plain vLLM server).
        tokenizer: tokenizer object, name or path (loaded with ``load_tokenizer``), or None
            (no local tokenizer: agents send messages, the server renders them).
        token: bearer token (default ``$LUDIC_SERVER_TOKEN``).
        max_concurrency: requests in flight at once from this client.
        timeout_s: per-attempt read timeout (a completion must finish within it).
        connect_timeout_s: per-attempt connect timeout.
        max_retries: retries after the first attempt on connection errors / 5xx / 429.
        backoff_s: first retry delay; doubles per retry (with jitter) up to ``max_backoff_s``.
    """

    def __init__(
        self,
        base_url: str | None = None,
        *,
        host: str = "127.0.0.1",
        port: int = 8000,
        model: str | None = None,
        tokenizer: Any = None,
        token: str | None = None,
        max_concurrency: int = 32,
        timeout_s: float = 120.0,
        connect_timeout_s: float = 5.0,
        max_retries: int = 10,
        backoff_s: float = 0.5,
        max_backoff_s: float = 8.0,
    ) -> None:
        self.base_url = (base_url or f"http://{host}:{port}").rstrip("/")
        self.model = model
        self._tokenizer = _load_tokenizer(tokenizer)
        self.token = client_token(token)
        self.max_concurrency = max_concurrency
        self.timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._ludic: bool | None = None  # is the server a Ludic server? (None: unknown yet)
        self._default_model: str | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._http: httpx.AsyncClient | None = None
        self._sem: asyncio.Semaphore | None = None

    # ------------------------------------------------------------------ plumbing

    @property
    def tokenizer(self) -> Any | None:
        return self._tokenizer

    def _session(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        """One httpx client and semaphore per event loop (they cannot cross loops)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._http is None or self._sem is None:
            headers = auth_headers(self.token)
            limits = httpx.Limits(max_connections=self.max_concurrency + 4)
            self._http = httpx.AsyncClient(
                base_url=self.base_url, timeout=self.timeout, headers=headers, limits=limits
            )
            self._sem = asyncio.Semaphore(self.max_concurrency)
            self._loop = loop
        return self._http, self._sem

    async def aclose(self) -> None:
        if self._http is not None and self._loop is asyncio.get_running_loop():
            await self._http.aclose()
        self._http = None

    def _delay(self, attempt: int) -> float:
        d = min(self.max_backoff_s, self.backoff_s * (2**attempt))
        return d * (0.75 + 0.5 * random.random())

    async def _call(self, method: str, path: str, *, retries: int | None = None,
                    **kw: Any) -> tuple[httpx.Response, int]:
        """Send with retries; returns (2xx response, attempts) or raises _GaveUp."""
        http, _ = self._session()
        retries = self.max_retries if retries is None else retries
        last = "no attempt"
        for attempt in range(retries + 1):
            if attempt:
                await asyncio.sleep(self._delay(attempt - 1))
            try:
                resp = await http.request(method, path, **kw)
            except httpx.TransportError as e:  # connect/read errors and timeouts
                last = f"{type(e).__name__}: {e}"
                continue
            if resp.status_code < 300:
                return resp, attempt + 1
            last = f"HTTP {resp.status_code}: {resp.text[:500]}"
            if resp.status_code not in RETRY_STATUS:
                raise _GaveUp(last)
        raise _GaveUp(f"{last} (after {retries + 1} attempts to {self.base_url}{path})")

    async def _request_model(self) -> str | None:
        """Model name to request: explicit, the policy alias, or the server's model."""
        if self.model is not None:
            return self.model
        if self._ludic is None:
            try:
                resp, _ = await self._call("GET", "/ludic/policy")
                self._ludic = True
                mode = resp.json().get("logprobs_mode")
                if mode != "processed_logprobs":
                    logger.warning("%s returns %s log-probs, not those of the sampling distribution "
                                   "(start it with --logprobs-mode processed_logprobs)", self.base_url, mode)
            except _GaveUp as e:
                if "HTTP 404" not in str(e):
                    raise
                self._ludic = False
                resp, _ = await self._call("GET", "/v1/models")
                self._default_model = resp.json()["data"][0]["id"]
        return POLICY_ALIAS if self._ludic else self._default_model

    # ------------------------------------------------------------------ public API

    async def complete(self, request: ChatRequest) -> ChatResponse:
        prompt_ids = request.prompt_ids
        if prompt_ids is None and self._tokenizer is not None:
            prompt_ids = tuple(render_ids(self._tokenizer, request.messages))
        _, sem = self._session()
        async with sem:
            t0 = time.perf_counter()
            try:
                return await self._complete(request, prompt_ids, t0)
            except _GaveUp as e:
                return self._failed(str(e), prompt_ids, t0)
            except Exception as e:  # malformed reply etc.: still a failed step, never a crash
                return self._failed(f"{type(e).__name__}: {e}", prompt_ids, t0)

    def _failed(self, error: str, prompt_ids: tuple[int, ...] | None, t0: float) -> ChatResponse:
        resp = ChatResponse.failed(error, tuple(prompt_ids or ()))
        resp.info.update(server=self.base_url, latency_s=time.perf_counter() - t0)
        return resp

    async def _complete(self, request: ChatRequest, prompt_ids: tuple[int, ...] | None,
                        t0: float) -> ChatResponse:
        s = request.sampling
        body: dict[str, Any] = {
            "model": request.model or await self._request_model(),
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
            "top_p": s.top_p,
            "n": 1,
            "return_token_ids": True,
            "include_stop_str_in_output": True,
            "skip_special_tokens": True,
        }
        if s.stop:
            body["stop"] = list(s.stop)
        if s.seed is not None:
            body["seed"] = int(s.seed)
        if body["model"] is None:
            body.pop("model")
        if prompt_ids is not None:
            body.update(prompt=list(prompt_ids), logprobs=0)
            path = "/v1/completions"
        else:
            body.update(messages=list(request.messages), logprobs=True, top_logprobs=0)
            path = "/v1/chat/completions"
        resp, attempts = await self._call("POST", path, json=body)
        data = resp.json()
        choice = data["choices"][0]
        completion_ids = tuple(int(t) for t in choice["token_ids"])
        returned_prompt = tuple(int(t) for t in (choice.get("prompt_token_ids") or data.get("prompt_token_ids") or ()))
        if prompt_ids is not None and returned_prompt != tuple(prompt_ids):
            return self._failed(
                f"server conditioned on different prompt ids ({len(returned_prompt)} vs "
                f"{len(prompt_ids)} sent)", prompt_ids, t0
            )
        lp = choice.get("logprobs") or {}
        if "token_logprobs" in lp:  # /v1/completions
            logprobs = tuple(float(x) for x in lp["token_logprobs"])
        else:  # /v1/chat/completions
            logprobs = tuple(float(c["logprob"]) for c in (lp.get("content") or []))
        if len(logprobs) != len(completion_ids):
            return self._failed(
                f"{len(completion_ids)} completion ids but {len(logprobs)} logprobs", prompt_ids, t0
            )
        reason = choice.get("finish_reason")
        if reason == "length":
            finish = FinishReason.LENGTH
        elif reason == "stop":
            finish = FinishReason.STOP
        else:
            return self._failed(f"finish_reason={reason!r}", prompt_ids, t0)
        version = int(resp.headers.get(VERSION_HEADER, 0))
        trace = TokenTrace(
            prompt_ids=returned_prompt,
            completion_ids=completion_ids,
            logprobs=logprobs,
            policy_versions=(version,) * len(completion_ids),
            finish_reason=finish,
        )
        info = {
            "server": self.base_url,
            "model": data.get("model"),
            "policy_version": version,
            "policy_mixed": resp.headers.get(MIXED_HEADER) == "1",
            "attempts": attempts,
            "latency_s": time.perf_counter() - t0,
        }
        return ChatResponse(text=choice.get("text") or choice.get("message", {}).get("content") or "",
                            trace=trace, info=info)

    async def get_policy(self, retries: int = 0) -> dict[str, Any]:
        """The server's ``/ludic/policy`` record; raises PolicyVersionError if unavailable."""
        try:
            resp, _ = await self._call("GET", "/ludic/policy", retries=retries)
        except _GaveUp as e:
            raise PolicyVersionError(
                f"cannot read the policy version from {self.base_url}/ludic/policy: {e}"
            ) from None
        return resp.json()

    async def get_policy_version(self, retries: int = 0) -> int:
        """Current policy version of the server (raises PolicyVersionError, never returns a default)."""
        return int((await self.get_policy(retries))["version"])

    async def wait_ready(self, timeout_s: float = 180.0) -> None:
        """Poll ``/health`` until the server answers (raises TimeoutError)."""
        http, _ = self._session()
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if (await http.get("/health", timeout=2.0)).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.base_url} not healthy after {timeout_s}s")
            await asyncio.sleep(0.5)
