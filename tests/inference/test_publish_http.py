"""The publishers' HTTP client side against a scripted local HTTP server (real sockets, scripted
answers): which failures are retried, and what a failure says. The server side of idempotent
pushes is tested against the real vLLM server in tests/integration/test_vllm.py."""

from __future__ import annotations

import json
import socket
import threading
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from ludic.inference.publish import PublishError
from ludic.inference.vllm_publish import VLLMFullWeightsPublisher

WEIGHTS = {"w": torch.zeros(4)}
ROUTE = "/ludic/upload_weights"


class _Seen(list):
    """A list the scripted server can hang the request bodies on."""


@contextmanager
def scripted_server(actions: list):
    """Answers the i-th request with ``actions[i]``: ``(status, json_body)``, or ``"drop"`` (read the
    request, then close the connection without an answer, like a server that dies mid-push).
    Yields (url, seen): the requests' "METHOD path" lines, their bodies in ``seen.bodies``."""
    seen: list[str] = _Seen()
    bodies: list[bytes] = []

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            self.do_POST()

        def do_POST(self) -> None:  # noqa: N802
            bodies.append(self.rfile.read(int(self.headers.get("content-length", 0))))
            seen.append(f"{self.command} {self.path}")
            action = actions[len(seen) - 1]
            if action == "drop":
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
                return
            status, payload = action
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    try:
        seen.bodies = bodies  # type: ignore[attr-defined]
        yield f"http://127.0.0.1:{srv.server_port}", seen
    finally:
        srv.shutdown()
        srv.server_close()


def publisher(urls: str | list[str], retries: int = 3) -> VLLMFullWeightsPublisher:
    return VLLMFullWeightsPublisher(urls, transport="upload", retries=retries, backoff_s=0.01, token="t")


def test_rate_limited_push_is_retried() -> None:
    with scripted_server([(429, {"error": "slow down"}), (200, {"version": 1})]) as (url, seen):
        stats = publisher(url).publish(WEIGHTS, 1)
    assert stats["servers"][url]["version"] == 1 and not stats["errors"]
    assert len(seen) == 2


def test_server_error_after_retries_is_a_publish_error() -> None:
    with scripted_server([(503, {"error": "engine unhealthy: dead"})] * 4) as (url, seen):
        with pytest.raises(PublishError) as e:
            publisher(url, retries=3).publish(WEIGHTS, 1)
    assert len(seen) == 4  # first attempt + 3 retries
    msg = str(e.value)
    assert url in msg and ROUTE in msg and "503" in msg and "engine unhealthy: dead" in msg, msg


def test_rejected_push_is_not_retried() -> None:
    answer = {"error": "version 1 is not newer than the server's last version 4"}
    with scripted_server([(409, answer)]) as (url, seen):
        with pytest.raises(PublishError) as e:
            publisher(url).publish(WEIGHTS, 1)
    assert len(seen) == 1 and e.value.status == 409
    msg = str(e.value)
    assert url in msg and ROUTE in msg and "409" in msg and answer["error"] in msg, msg


def test_dropped_connection_is_retried() -> None:
    """The server applied the push and died before answering: the retry's answer counts."""
    with scripted_server(["drop", (200, {"version": 1, "already_applied": True})]) as (url, seen):
        stats = publisher(url).publish(WEIGHTS, 1)
    assert len(seen) == 2 and stats["servers"][url]["already_applied"] is True


def test_server_version_is_the_highest_among_the_servers() -> None:
    with scripted_server([(200, {"last_version": 3})]) as (a, seen_a), \
            scripted_server([(503, {"error": "busy"}), (200, {"last_version": 7})]) as (b, seen_b):
        assert publisher([a, b]).server_version() == 7
    assert seen_a == ["GET /ludic/policy"] and seen_b == ["GET /ludic/policy"] * 2


def test_force_and_the_first_publish() -> None:
    """force=True reaches the server; a publisher's first publish happens even when not due."""
    with scripted_server([(200, {"version": 5}), (200, {"version": 8})]) as (url, seen):
        pub = VLLMFullWeightsPublisher([url], transport="upload", token="t", every_n_steps=4)
        assert pub.publish(WEIGHTS, 5, force=True)["servers"][url]["version"] == 5  # first: always due
        assert pub.publish(WEIGHTS, 6)["skipped"] == "not due"
        assert pub.publish(WEIGHTS, 8)["servers"][url]["version"] == 8
    assert seen == [f"POST {ROUTE}?version=5&force=1", f"POST {ROUTE}?version=8&force=0"]


def test_unreachable_server_is_recorded_and_skipped() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        url = f"http://127.0.0.1:{s.getsockname()[1]}"  # bound, not listening: connection refused
        stats = publisher(url, retries=1).publish(WEIGHTS, 1)
    assert url in stats["errors"] and "Connect" in stats["errors"][url]


def test_publish_folder_sends_the_saved_file_or_its_path(tmp_path) -> None:
    """publish_folder pushes a folder saved earlier: its bytes to an upload server, its path to
    a path server; a folder without model.safetensors and the NCCL transport are refused."""
    from safetensors.torch import load, save_file

    save_file(WEIGHTS, str(tmp_path / "model.safetensors"))
    with scripted_server([(200, {"version": 3})]) as (url, seen):
        stats = publisher(url).publish_folder(tmp_path, 3)
        body = seen.bodies[0]
    assert seen == [f"POST {ROUTE}?version=3&force=0"] and stats["servers"][url]["version"] == 3
    assert body == (tmp_path / "model.safetensors").read_bytes() and torch.equal(load(body)["w"], WEIGHTS["w"])

    with scripted_server([(200, {"version": 4})]) as (url, seen):
        pub = VLLMFullWeightsPublisher(url, transport="path", token="t")
        pub.publish_folder(tmp_path, 4, force=True)
        assert json.loads(seen.bodies[0]) == {"path": str(tmp_path.resolve()), "version": 4, "force": True}

    with pytest.raises(FileNotFoundError, match="model.safetensors"):
        publisher("http://127.0.0.1:9").publish_folder(tmp_path / "missing", 1)
    with pytest.raises(ValueError, match="NCCL"):
        VLLMFullWeightsPublisher("http://127.0.0.1:9", transport="nccl").publish_folder(tmp_path, 1)
