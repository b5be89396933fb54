"""Weight routes: LoRA adapters, full weights (by path or upload) and the NCCL route, all
behind the policy version and the update gate."""

# No ``from __future__ import annotations``: FastAPI reads the route signatures' ``Request``
# annotations at runtime, and Request is imported inside the installer (fastapi loads lazily).

import hashlib
import logging
import shutil
import time
from pathlib import Path
from typing import Any

from ludic.inference.vllm_server.auth import AllowedDirs, PathNotAllowed
from ludic.inference.vllm_server.state import NCCLSession, PolicyState, folder_source

logger = logging.getLogger("ludic.vllm_server")


def fail(status: int, msg: str) -> Any:
    from fastapi.responses import JSONResponse

    return JSONResponse({"error": msg}, status_code=status)


async def body_of(request: Any) -> dict[str, Any]:
    try:
        data = await request.json()
    except ValueError:
        raise ValueError("request body must be a JSON object") from None
    if not isinstance(data, dict):
        raise ValueError("request body must be a JSON object")
    return data


def engine(request: Any) -> Any:
    return request.app.state.engine_client


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


def max_upload_bytes(args: Any) -> int:
    return int(args.ludic_max_upload_gib * (1 << 30))


def install_weight_routes(app: Any, args: Any, state: PolicyState, allowed: AllowedDirs, upload_root: Path) -> Any:
    """Add the weight routes to ``app``; returns ``remove_adapter(name)`` (the middleware
    calls it when a retired adapter's last request ends).

    Paths that clients send are checked against ``allowed`` (403 outside it); uploads are
    written under ``upload_root``."""
    from fastapi import Request

    drain_timeout = float(args.ludic_drain_timeout)
    model_dir = Path(args.model)
    reference: set[str] | None = None
    if model_dir.is_dir():
        try:
            reference = _safetensors_names(model_dir)
        except ValueError:
            reference = None

    max_upload = max_upload_bytes(args)

    def too_big(size: int, at_least: str = "") -> str:
        return (f"upload of {at_least}{size} bytes is over this server's limit of {max_upload} bytes "
                "(--ludic-max-upload-gib); raise the limit, or push by path from a folder under "
                "--allowed-weight-dirs")

    def admit(data: dict[str, Any], source: str) -> Any:
        """The push's version, or the answer to give instead: 400 (bad version), 409 (not newer),
        200 ``already_applied`` (a repeat of the last push: same version, same source)."""
        try:
            version = state.admit(data.get("version"), bool(data.get("force")), source)
        except TypeError as e:
            return fail(400, str(e))
        except ValueError as e:
            return fail(409, str(e))
        if version is None:
            return {"version": state.last_version, "adapter": state.adapter, "already_applied": True}
        return version

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

    @app.post("/ludic/load_adapter")
    async def ludic_load_adapter(request: Request):
        if getattr(args, "enable_lora", False) is not True:
            return fail(400, "this server was started without --enable-lora")
        try:
            data = await body_of(request)
            name, path = str(data["name"]), allowed.check(str(data["path"]))
        except (ValueError, KeyError) as e:
            return fail(400, f"load_adapter needs JSON {{name, path, version?}}: {e}")
        except PathNotAllowed as e:
            return fail(403, str(e))
        if not (path / "adapter_config.json").exists():
            return fail(400, f"{path} is not a peft adapter folder (no adapter_config.json) on the server")
        from vllm.entrypoints.serve.engine.protocol import ErrorResponse
        from vllm.entrypoints.serve.lora.protocol import LoadLoRAAdapterRequest

        source = folder_source(f"adapter:{name}", path)
        async with state.lock.hold("load_adapter"):
            version = admit(data, source)
            if not isinstance(version, int):
                return version
            served_name = f"{name}-v{version}"
            t0 = time.perf_counter()
            models = app.state.openai_serving_models
            res = await models.load_lora_adapter(
                LoadLoRAAdapterRequest(lora_name=served_name, lora_path=str(path), load_inplace=True)
            )
            if isinstance(res, ErrorResponse):
                return fail(res.error.code, res.error.message)
            load_s = time.perf_counter() - t0
            previous = state.adapter
            state.adapters[served_name] = version
            state.adapter = served_name
            state.applied(version, source)
            if previous is not None and previous != served_name:
                state.retired.add(previous)
                await remove_adapter(previous)
        logger.info("policy -> adapter %s (version %d, %.3fs)", served_name, version, load_s)
        return {"version": version, "adapter": served_name, "load_s": load_s}

    @app.post("/ludic/unload_adapter")
    async def ludic_unload_adapter(request: Request):
        async with state.lock.hold("unload_adapter"):
            previous, state.adapter = state.adapter, None
            state.version = state.base_version
            if previous is not None:
                state.retired.add(previous)
                await remove_adapter(previous)
        return {"version": state.version, "adapter": None}

    async def full_weights_swapped(version: int, source: str | None, reopen: bool = True) -> None:
        """New full weights are the whole policy: drop the adapter that sat on the old ones."""
        state.applied(version, source)
        state.base_version = version
        previous, state.adapter = state.adapter, None
        if reopen:
            await state.gate.end_update()
        if previous is not None:
            state.retired.add(previous)
            await remove_adapter(previous)

    async def reload_from(request: Request, folder: Path, data: dict[str, Any], source: str):
        try:
            _check_weights_folder(folder, reference)
        except ValueError as e:
            return fail(400, str(e))
        holder = state.lock.holder
        logger.info("full weights from %s asked for (version %s)%s", folder, data.get("version"),
                    f"; waiting for the update lock held by {holder.owner}" if holder else "")
        async with state.lock.hold("full_weights"):
            version = admit(data, source)
            if not isinstance(version, int):
                return version
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
            await full_weights_swapped(version, source)
            t2 = time.perf_counter()
        logger.info("policy -> full weights from %s (version %d, %.3fs)", folder, version, t2 - t0)
        return {"version": version, "drain_s": t1 - t0, "reload_s": t2 - t1,
                "drained": drained, "route": "reload_weights(path)"}

    @app.post("/ludic/update_weights")
    async def ludic_update_weights(request: Request):
        try:
            data = await body_of(request)
            folder = allowed.check(str(data["path"]))
        except (ValueError, KeyError) as e:
            return fail(400, f"update_weights needs JSON {{path, version?}}: {e}")
        except PathNotAllowed as e:
            return fail(403, str(e))
        return await reload_from(request, folder, data, folder_source("weights", folder))

    @app.post("/ludic/upload_weights")
    async def ludic_upload_weights(request: Request):
        q = request.query_params
        data: dict[str, Any] = {"force": q.get("force") in ("1", "true")}
        if "version" in q:
            try:
                data["version"] = int(q["version"])
            except ValueError:
                return fail(400, "version must be an integer")
        declared = request.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > max_upload:
            return fail(413, too_big(int(declared)))
        folder = upload_root / f"upload-{time.time_ns()}"
        folder.mkdir(parents=True)
        try:
            t0 = time.perf_counter()
            received, digest = 0, hashlib.sha256()
            with open(folder / "model.safetensors", "wb") as f:
                async for chunk in request.stream():
                    received += len(chunk)
                    if received > max_upload:  # the partial file goes with the folder (finally)
                        return fail(413, too_big(received, "at least "))
                    f.write(chunk)
                    digest.update(chunk)
            recv_s = time.perf_counter() - t0
            res = await reload_from(request, folder, data, f"upload:{digest.hexdigest()}")
            if isinstance(res, dict):
                res["receive_s"] = recv_s
            return res
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    # ---- NCCL (GPU) route: vLLM's weight-transfer engine behind Ludic's version, gate and lock.
    nccl = NCCLSession(state, float(args.ludic_update_timeout))

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
        try:
            lease, drained = await nccl.start(drain_timeout, engine(request).start_weight_update)
        except Exception as e:
            return fail(500, f"start_weight_update failed: {e}")
        return {"status": "ok", "drained": drained, "lease": lease.id}

    @app.post("/ludic/nccl/update")
    async def ludic_nccl_update(request: Request):
        from vllm.distributed.weight_transfer.base import WeightTransferUpdateRequest

        data = await body_of(request)
        if nccl.current(data.get("lease")) is None:
            return fail(409, nccl.refusal())
        await engine(request).update_weights(
            request=WeightTransferUpdateRequest(update_info=data["update_info"])
        )
        return {"status": "ok"}

    @app.post("/ludic/nccl/finish")
    async def ludic_nccl_finish(request: Request):
        try:
            data = await body_of(request)
            version = state.next_version(data.get("version"), True)
        except (TypeError, ValueError) as e:
            return fail(400, str(e))
        lease = nccl.take(data.get("lease"))
        if lease is None:  # nothing of ours to finish: leave the lock and gate to their holder
            return fail(409, nccl.refusal())
        try:
            await engine(request).finish_weight_update(str(version))
            await engine(request).reset_prefix_cache()
            await full_weights_swapped(version, None, reopen=False)
        except Exception as e:
            logger.exception("finish_weight_update failed")
            return fail(500, f"finish_weight_update failed (weights may be half updated): {e}")
        finally:
            await nccl.end(lease)
        return {"version": version}

    @app.post("/ludic/close_communicator")
    async def ludic_close_communicator(request: Request):
        await engine(request).shutdown_weight_transfer_engine()
        return {"status": "ok"}

    return remove_adapter
