"""The server's trust boundary: bearer-token auth, the folders clients may make it read
weights from, and the ASGI middleware (auth, policy alias, version headers, update gate)."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from ludic.inference.vllm_server.state import PolicyState
from ludic.inference.wire import MIXED_HEADER, MODEL_HEADER, TOKEN_ENV, VERSION_HEADER

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
OPEN_PATHS = ("/health",)


logger = logging.getLogger("ludic.vllm_server")

TOKEN_FLAG_REMOVED = (
    "ludic.inference.vllm_server: --ludic-token was removed (a token on the command line is visible "
    f"to every user of the machine through ps and /proc). Set ${TOKEN_ENV} in the server's environment "
    "or pass --ludic-token-file PATH (a file holding the token)."
)


def server_token(token_file: str | None, environ: Mapping[str, str] = os.environ) -> str | None:
    """The bearer token: from ``token_file`` or ``$LUDIC_SERVER_TOKEN`` (never from argv).

    vLLM's ``--api-key`` is not a Ludic token: it guards only vLLM's own routes.
    """
    from_env = environ.get(TOKEN_ENV) or None
    if token_file is None:
        return from_env
    try:
        path = Path(token_file)
        from_file = path.read_text().strip()
    except OSError as e:
        raise SystemExit(f"ludic.inference.vllm_server: cannot read --ludic-token-file {token_file}: {e}") from None
    if not from_file:
        raise SystemExit(f"ludic.inference.vllm_server: --ludic-token-file {token_file} is empty")
    if from_env and from_env != from_file:
        raise SystemExit(f"ludic.inference.vllm_server: ${TOKEN_ENV} and --ludic-token-file {token_file} differ; "
                         "give the server one token")
    if path.stat().st_mode & 0o077:
        logger.warning("--ludic-token-file %s is readable by other users (chmod 600 it)", token_file)
    return from_file


def check_security(host: str | None, token: str | None) -> None:
    """Refuse to serve on a non-loopback address without a token."""
    if host not in LOCAL_HOSTS and not token:
        raise SystemExit(
            f"ludic.inference.vllm_server: refusing to bind --host {host!r} without a token. "
            f"Set {TOKEN_ENV} or pass --ludic-token-file PATH (clients then send "
            "'Authorization: Bearer <token>'; vLLM's --api-key guards only vLLM's own routes), "
            "or bind 127.0.0.1."
        )


class PathNotAllowed(PermissionError):
    """A client named a folder outside the server's allowed weight roots (HTTP 403)."""


class AllowedDirs:
    """Roots under which clients may make the server read adapters and weights.

    A path is checked after resolving symlinks and ``..`` (``os.path.realpath``), and the
    resolved path is what the server then loads, so ``root/../elsewhere`` and a link under a
    root pointing elsewhere are both refused.
    """

    def __init__(self, roots: Iterable[str | os.PathLike]) -> None:
        self.roots = tuple(dict.fromkeys(Path(os.path.realpath(r)) for r in roots))

    def check(self, path: str | os.PathLike) -> Path:
        """The resolved path, or PathNotAllowed naming the path and the allowed roots."""
        resolved = Path(os.path.realpath(path))
        if any(resolved.is_relative_to(root) for root in self.roots):
            return resolved
        shown = str(path) if str(path) == str(resolved) else f"{path} (resolved: {resolved})"
        raise PathNotAllowed(
            f"{shown} is outside the folders this server loads weights from: "
            f"{', '.join(map(str, self.roots))}. Start the server with --allowed-weight-dirs <folder> "
            "to allow another one."
        )

    def __iter__(self):
        return iter(self.roots)


def guard_lora_loads(models: Any, allowed: AllowedDirs) -> None:
    """Check every runtime LoRA load of vLLM's serving models (``/v1/load_lora_adapter``, the
    SageMaker ``/adapters`` route, Ludic's ``/ludic/load_adapter``) against ``allowed``.

    Installed after vLLM's start-up, so ``--lora-modules`` given by the operator load as before.
    """
    from vllm.entrypoints.serve.engine.protocol import ErrorInfo, ErrorResponse

    load = models.load_lora_adapter

    async def checked_load_lora_adapter(request: Any, *args: Any, **kw: Any) -> Any:
        try:
            request.lora_path = str(allowed.check(request.lora_path))
        except PathNotAllowed as e:
            return ErrorResponse(error=ErrorInfo(message=str(e), type="Forbidden", code=403))
        return await load(request, *args, **kw)

    models.load_lora_adapter = checked_load_lora_adapter


def bearer_ok(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    for k, v in headers:
        if k.lower() == b"authorization":
            scheme, _, value = v.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and secrets.compare_digest(value.strip(), token)
    return False


async def json_reply(send: Any, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


class LudicMiddleware:
    """Pure ASGI middleware: bearer auth, policy alias, version headers, update gate."""

    def __init__(self, app: Any, state: PolicyState, token: str | None,
                 on_idle: Any = None) -> None:
        self.app = app
        self.state = state
        self.token = token
        self.on_idle = on_idle  # callback(model) when a retired adapter has no requests left

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope["path"].removeprefix(scope.get("root_path", ""))
        if (self.token and scope.get("method") != "OPTIONS" and path not in OPEN_PATHS
                and not bearer_ok(scope["headers"], self.token)):
            return await json_reply(send, 401, {"error": "Unauthorized: send 'Authorization: Bearer <token>'"})
        if scope.get("method") != "POST" or path not in GENERATION_PATHS:
            return await self.app(scope, receive, send)

        # Read the (small) JSON body, resolve the policy alias, and re-feed it.
        chunks, more = [], True
        while more:
            msg = await receive()
            if msg["type"] == "http.disconnect":
                return
            chunks.append(msg.get("body", b""))
            more = msg.get("more_body", False)
        body = b"".join(chunks)
        state = self.state
        epoch = await state.gate.enter()
        model = None
        try:
            try:
                payload = json.loads(body)
            except ValueError:
                payload = None
            if isinstance(payload, dict):
                model, version = state.resolve(payload.get("model"))
                if payload.get("model") != model:
                    payload["model"] = model
                    body = json.dumps(payload).encode()
                state.inflight[model] = state.inflight.get(model, 0) + 1
            else:
                version = state.version
            scope = dict(scope)
            scope["headers"] = [(k, v) for k, v in scope["headers"] if k.lower() != b"content-length"]
            scope["headers"].append((b"content-length", str(len(body)).encode()))
            fed = False

            async def receive_again() -> dict:
                nonlocal fed
                if not fed:
                    fed = True
                    return {"type": "http.request", "body": body, "more_body": False}
                return await receive()

            async def send_tagged(msg: dict) -> None:
                if msg["type"] == "http.response.start":
                    headers = list(msg.get("headers", []))
                    headers.append((VERSION_HEADER.encode(), str(version).encode()))
                    headers.append((MODEL_HEADER.encode(), str(model).encode()))
                    if state.gate.epoch != epoch:
                        headers.append((MIXED_HEADER.encode(), b"1"))
                    msg = {**msg, "headers": headers}
                await send(msg)

            await self.app(scope, receive_again, send_tagged)
        finally:
            if model is not None:
                left = state.inflight.get(model, 1) - 1
                state.inflight[model] = left
                if left <= 0:
                    state.inflight.pop(model, None)
                    if model in state.retired and self.on_idle is not None:
                        asyncio.ensure_future(self.on_idle(model))
            await state.gate.exit()
