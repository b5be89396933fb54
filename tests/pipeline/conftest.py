"""A real redis-server process per test (AOF on, appendfsync always), in the test's tmp dir."""

import os
import shutil

import pytest


@pytest.fixture
def redis_server(tmp_path):
    from ludic.pipeline.redis_server import RedisServer

    if shutil.which("redis-server") is None:
        if os.environ.get("CI"):
            pytest.fail("redis-server is not installed: scripts/setup.sh must install it in CI")
        pytest.skip("redis-server is not installed (make setup installs it with apt-get)")
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.kill()


@pytest.fixture
def streams(redis_server):
    from ludic.pipeline.streams import PipelineStreams

    return PipelineStreams(redis_server.url, prefix="t")
