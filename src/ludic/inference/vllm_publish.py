"""Publishing to vLLM servers over HTTP: a LoRA adapter by path (``VLLMAdapterPublisher``), or merged full weights by
path, upload or NCCL (``VLLMFullWeightsPublisher``, ``NCCLTransport``); retries, versions and errors as
``ludic.inference.publish`` describes them."""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import torch

from ludic.inference.models import is_peft, unwrap
from ludic.inference.publish import PublishError, _skipped, merged_state_dict, prune_versions
from ludic.inference.wire import auth_headers, client_token

logger = logging.getLogger(__name__)

RETRY_STATUS = {429, 500, 502, 503, 504}
"""Answers after which a push is retried (with the same version: a repeat of an applied push is
answered ``already_applied``, so retrying is safe)."""


def _is_loopback(url: str) -> bool:
    return (urlparse(url).hostname or "") in {"127.0.0.1", "localhost", "::1"}


class _HTTPPublisher:
    """Shared plumbing: due-check, rank-0 check, parallel POST to servers with retries."""

    def __init__(self, urls: list[str] | str, *, every_n_steps: int = 1, token: str | None = None,
                 timeout_s: float = 600.0, retries: int = 2, backoff_s: float = 1.0) -> None:
        self.urls = [u.rstrip("/") for u in ([urls] if isinstance(urls, str) else urls)]
        if not self.urls:
            raise ValueError("a publisher needs at least one server URL")
        if every_n_steps < 1:
            raise ValueError(f"every_n_steps must be >= 1, got {every_n_steps}")
        self.every_n_steps = every_n_steps
        self.token = client_token(token)
        self.timeout_s = timeout_s
        self.retries = retries
        self.backoff_s = backoff_s
        self.last_version: int | None = None

    def _skipped(self, version: int) -> dict[str, Any] | None:
        return _skipped(version, self.every_n_steps, self.last_version is None)

    def server_version(self) -> int:
        """Highest ``last_version`` among the servers (0 for fresh ones); raises PublishError
        or ConnectionError when one cannot say (a server not answering may hold a higher one)."""
        return max(int(self._request("GET", url, "/ludic/policy")["last_version"]) for url in self.urls)

    def _headers(self) -> dict[str, str]:
        return auth_headers(self.token)

    def _post(self, url: str, path: str, **kw: Any) -> dict[str, Any]:
        return self._request("POST", url, path, **kw)

    def _request(self, method: str, url: str, path: str, **kw: Any) -> dict[str, Any]:
        """Send with retries on connection errors, timeouts, 429 and 5xx; returns the answer
        (plus ``http_s`` and ``attempts``). A retry of a push the server already applied comes
        back as ``{"already_applied": true}``. Raises PublishError for a 4xx, or for a 429/5xx
        that outlasts the retries, and ConnectionError when the server could not be reached."""
        import httpx

        headers = {**self._headers(), **kw.pop("headers", {})}
        failure: PublishError | str = "no attempt"  # what the last attempt got
        for attempt in range(self.retries + 1):
            if attempt:
                wait = self.backoff_s * 2 ** (attempt - 1)
                logger.warning("%s %s%s: attempt %d of %d failed (%s); retrying in %.2fs", method, url,
                               path, attempt, self.retries + 1, failure, wait)
                time.sleep(wait)
            t0 = time.perf_counter()
            try:
                r = httpx.request(method, url + path, headers=headers, timeout=self.timeout_s, **kw)
            except httpx.TransportError as e:
                failure = f"{type(e).__name__}: {e}"
                continue
            if r.status_code < 300:
                out = r.json()
                out.update(http_s=time.perf_counter() - t0, attempts=attempt + 1)
                return out
            failure = PublishError(url, path, r.status_code, r.text[:1000])
            if r.status_code not in RETRY_STATUS:
                raise failure
        if isinstance(failure, PublishError):
            raise failure
        raise ConnectionError(f"{url}{path} unreachable after {self.retries + 1} attempts: {failure}")

    def _fan_out(self, path: str, make_kw: Any) -> tuple[dict[str, Any], dict[str, str]]:
        results: dict[str, Any] = {}
        errors: dict[str, str] = {}

        def one(url: str) -> None:
            try:
                results[url] = self._post(url, path, **make_kw(url))
            except ConnectionError as e:
                errors[url] = str(e)

        with ThreadPoolExecutor(max_workers=len(self.urls)) as ex:
            list(ex.map(one, self.urls))  # PublishError propagates
        return results, errors


class VLLMAdapterPublisher(_HTTPPublisher):
    """Publish a peft LoRA adapter to Ludic vLLM servers.

    Args:
        urls: server base URLs.
        out_dir: where versioned adapter folders are written (visible to the servers).
        every_n_steps: publish when ``version % every_n_steps == 0``.
        token: bearer token (default ``$LUDIC_SERVER_TOKEN``).
        name: adapter name; servers serve it as ``<name>-v<version>``.
        keep_last: adapter folders kept on disk (in-flight requests may still need the
            previous one).
    """

    def __init__(self, urls: list[str] | str, out_dir: str | os.PathLike, every_n_steps: int = 1,
                 token: str | None = None, *, name: str = "policy", keep_last: int = 3,
                 **kw: Any) -> None:
        super().__init__(urls, every_n_steps=every_n_steps, token=token, **kw)
        self.out_dir = Path(out_dir).resolve()
        self.name = name
        self.keep_last = max(2, keep_last)

    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        if (skipped := self._skipped(version)) is not None:
            return skipped
        model = unwrap(model)
        if not is_peft(model):
            raise TypeError("VLLMAdapterPublisher needs a peft model; use VLLMFullWeightsPublisher")
        t0 = time.perf_counter()
        folder = self.out_dir / f"v{version:07d}"
        tmp = folder.with_name(folder.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save_pretrained(tmp)
        shutil.rmtree(folder, ignore_errors=True)
        tmp.rename(folder)  # servers never see a half-written adapter
        t1 = time.perf_counter()
        body = {"name": self.name, "path": str(folder), "version": int(version), "force": force}
        results, errors = self._fan_out("/ludic/load_adapter", lambda url: {"json": body})
        t2 = time.perf_counter()
        prune_versions(self.out_dir, self.keep_last)
        self.last_version = version
        return {"version": version, "kind": "adapter", "save_s": t1 - t0, "push_s": t2 - t1,
                "total_s": t2 - t0, "servers": results, "errors": errors}


class VLLMFullWeightsPublisher(_HTTPPublisher):
    """Publish merged full weights to Ludic vLLM servers.

    Args:
        urls: server base URLs.
        out_dir: folder for versioned safetensors (``transport="path"``); a temp dir if None.
        transport: ``"auto"``, ``"path"``, ``"upload"`` or ``"nccl"`` (GPU).
        dtype: wire dtype of floating tensors (the server's ``--dtype``).
        nccl_master_address / nccl_port: NCCL rendezvous the servers' workers connect to.
    """

    def __init__(self, urls: list[str] | str, out_dir: str | os.PathLike | None = None,
                 every_n_steps: int = 1, token: str | None = None, *, transport: str = "auto",
                 dtype: torch.dtype = torch.bfloat16, keep_last: int = 2,
                 nccl_master_address: str = "127.0.0.1", nccl_port: int = 29555, **kw: Any) -> None:
        super().__init__(urls, every_n_steps=every_n_steps, token=token, **kw)
        if transport not in ("auto", "path", "upload", "nccl"):
            raise ValueError(f"transport must be auto, path, upload or nccl, got {transport!r}")
        self.transport = transport
        self.out_dir = Path(out_dir or tempfile.mkdtemp(prefix="ludic-full-")).resolve()
        self.dtype = dtype
        self.keep_last = max(1, keep_last)
        self.nccl_master_address = nccl_master_address
        self.nccl_port = nccl_port
        self._nccl: dict[str, NCCLTransport] = {}

    def _mode(self, url: str) -> str:
        if self.transport != "auto":
            return self.transport
        return "path" if _is_loopback(url) else "upload"

    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        if (skipped := self._skipped(version)) is not None:
            return skipped
        from safetensors.torch import save, save_file

        t0 = time.perf_counter()
        sd = merged_state_dict(model, self.dtype)
        t1 = time.perf_counter()
        modes = {u: self._mode(u) for u in self.urls}
        folder = self.out_dir / f"v{version:07d}"
        if "path" in modes.values():
            tmp = folder.with_name(folder.name + ".tmp")
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
            save_file(sd, str(tmp / "model.safetensors"), metadata={"format": "pt"})
            shutil.rmtree(folder, ignore_errors=True)
            tmp.rename(folder)
        blob = save(sd, metadata={"format": "pt"}) if "upload" in modes.values() else None
        t2 = time.perf_counter()
        results, errors = self._send(modes, folder, blob, sd, version, force)
        t3 = time.perf_counter()
        if "path" in modes.values():
            prune_versions(self.out_dir, self.keep_last)
        self.last_version = version
        return {"version": version, "kind": "full", "transport": sorted(set(modes.values())),
                "extract_s": t1 - t0, "serialize_s": t2 - t1, "push_s": t3 - t2,
                "total_s": t3 - t0, "bytes": sum(v.numel() * v.element_size() for v in sd.values()),
                "servers": results, "errors": errors}

    def publish_folder(self, folder: str | os.PathLike, version: int, *,
                       force: bool = False) -> dict[str, Any]:
        """Push full weights already saved as ``folder/model.safetensors`` (a checkpoint, an
        SFT result): path-mode servers load the folder itself, so it must lie under their
        ``--ludic-allowed-weight-dir``; upload-mode servers get the file's bytes. Nothing is
        merged or serialised here, so the push is only HTTP. Not for the NCCL transport."""
        if (skipped := self._skipped(version)) is not None:
            return skipped
        folder = Path(folder).resolve()
        file = folder / "model.safetensors"
        if not file.is_file():
            raise FileNotFoundError(f"publish_folder: {file} does not exist")
        modes = {u: self._mode(u) for u in self.urls}
        if "nccl" in modes.values():
            raise ValueError("publish_folder sends a saved folder; the NCCL transport streams a "
                             "state dict: use publish(model, version)")
        t0 = time.perf_counter()
        blob = file.read_bytes() if "upload" in modes.values() else None
        results, errors = self._send(modes, folder, blob, None, version, force)
        self.last_version = version
        return {"version": version, "kind": "full", "transport": sorted(set(modes.values())),
                "push_s": time.perf_counter() - t0, "bytes": file.stat().st_size,
                "servers": results, "errors": errors}

    def _send(self, modes: dict[str, str], folder: Path, blob: bytes | None,
              sd: dict[str, torch.Tensor] | None, version: int,
              force: bool) -> tuple[dict[str, Any], dict[str, str]]:
        """POST (or NCCL-send) one version to every server in parallel; (results, errors)."""

        def kw_for(url: str) -> dict[str, Any]:
            if modes[url] == "path":
                return {"json": {"path": str(folder), "version": int(version), "force": force}}
            return {"content": blob, "params": {"version": int(version), "force": int(force)},
                    "headers": {"content-type": "application/octet-stream"}}

        results: dict[str, Any] = {}
        errors: dict[str, str] = {}
        lock = threading.Lock()

        def one(url: str) -> None:
            try:
                if modes[url] == "nccl":
                    out = self._nccl_for(url).send(sd, version)
                else:
                    path = "/ludic/update_weights" if modes[url] == "path" else "/ludic/upload_weights"
                    out = self._post(url, path, **kw_for(url))
                with lock:
                    results[url] = out
            except ConnectionError as e:
                with lock:
                    errors[url] = str(e)

        with ThreadPoolExecutor(max_workers=len(self.urls)) as ex:
            list(ex.map(one, self.urls))
        return results, errors

    def _nccl_for(self, url: str) -> "NCCLTransport":
        if url not in self._nccl:
            port = self.nccl_port + len(self._nccl)
            self._nccl[url] = NCCLTransport(url, self._headers(), self.nccl_master_address, port)
        return self._nccl[url]


class _DictSource:
    """vLLM ``WeightSource`` over a prepared state dict (built lazily on vLLM's base class)."""

    @staticmethod
    def make(sd: dict[str, torch.Tensor], device: torch.device) -> Any:
        from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

        class Source(WeightSource):
            def metadata(self) -> list[Any]:
                return [ParamMeta(k, v.dtype, tuple(v.shape)) for k, v in sd.items()]

            def __iter__(self):  # type: ignore[no-untyped-def]
                for k, v in sd.items():
                    yield k, v.to(device, non_blocking=True)

        return Source()


class NCCLTransport:
    """GPU route: vLLM's NCCL weight-transfer engine, driven through Ludic's endpoints.

    The trainer process is NCCL rank 0; the server's workers join as ranks 1..W (the
    server must run with ``--weight-transfer-config '{"backend": "nccl"}'``, the Ludic
    server's default on GPUs). Not exercised on the CPU-only CI machines.
    """

    def __init__(self, url: str, headers: dict[str, str], master_address: str, master_port: int,
                 timeout_s: float = 600.0) -> None:
        self.url, self.headers, self.timeout_s = url, headers, timeout_s
        self.master_address, self.master_port = master_address, master_port
        self.engine: Any = None
        self._version: int | None = None
        self._lease: str | None = None

    # the VLLMWeightSyncClient protocol vLLM's trainer engine drives
    def _post(self, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        import httpx

        r = httpx.post(self.url + path, json=body or {}, headers=self.headers, timeout=self.timeout_s)
        if r.status_code >= 300:
            raise PublishError(self.url, path, r.status_code, r.text[:1000])
        return r.json()

    def init_weight_transfer_engine(self, init_info: dict[str, Any]) -> None:
        self._post("/ludic/init_communicator", {"init_info": init_info})

    def shutdown_weight_transfer_engine(self) -> None:
        self._post("/ludic/close_communicator")

    def start_weight_update(self) -> None:
        self._lease = self._post("/ludic/nccl/start").get("lease")  # this update's hold on the server

    def update_weights(self, update_info: Any) -> None:
        self._post("/ludic/nccl/update", {"update_info": update_info, "lease": self._lease})

    def finish_weight_update(self, weight_version: str | None = None) -> None:
        self._post("/ludic/nccl/finish", {"version": self._version, "lease": self._lease})

    def send(self, sd: dict[str, torch.Tensor], version: int) -> dict[str, Any]:
        import httpx
        from vllm.distributed.weight_transfer.nccl_engine import (
            NCCLTrainerInitInfo,
            NCCLTrainerWeightTransferEngine,
        )

        if not torch.cuda.is_available():
            raise RuntimeError("the NCCL transport needs a CUDA device on the trainer")
        t0 = time.perf_counter()
        self._version = version
        if self.engine is None:
            policy = httpx.get(self.url + "/ludic/policy", headers=self.headers, timeout=30).json()
            world = 1 + int(policy.get("world_size", 1))
            info = NCCLTrainerInitInfo(master_address=self.master_address,
                                       master_port=self.master_port, world_size=world, rank=0)
            source = _DictSource.make(sd, torch.device("cuda"))
            self.engine = NCCLTrainerWeightTransferEngine.trainer_init(info, client=self, source=source)
        self.engine.source = _DictSource.make(sd, torch.device("cuda"))
        self.engine.send_weights()  # start -> update (concurrent broadcast) -> finish
        return {"version": version, "nccl_s": time.perf_counter() - t0}
