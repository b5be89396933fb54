"""A ``redis-server`` process for development topologies and tests (production points the
actors and the learner at its own Redis instead).

Durability policy: the server runs with the append-only file on and ``appendfsync always``:
every write (an ``XADD`` of a sample, an ``XACK``, a group's delivery state) is on disk before
Redis answers, so a ``kill -9`` of Redis loses nothing acknowledged or pending. ``everysec``
(Redis's default when AOF is on) is faster but can lose the last second of writes on a crash:
samples actors believe were pushed, and acknowledgements the learner believes were made (the
learner would then re-read entries its checkpoint already holds; ``PipelineBatchSource`` acks
a checkpoint's entries again on resume, so those are not trained twice, but lost samples are
lost). RDB snapshots are off: the AOF is the only persistence.

Access: the server binds 127.0.0.1 with protected mode on. Another bind address (other hosts,
network namespaces) needs a password, read from ``$LUDIC_REDIS_PASSWORD`` or the file named by
``$LUDIC_REDIS_PASSWORD_FILE`` and handed to redis-server in a config file only this user can read,
never on its command line (where ``ps`` shows it to every user); ``PipelineStreams`` reads the same
variables, so URLs never carry it.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

PASSWORD_ENV = "LUDIC_REDIS_PASSWORD"
PASSWORD_FILE_ENV = "LUDIC_REDIS_PASSWORD_FILE"


def redis_password() -> str | None:
    """The pipeline's Redis password: ``$LUDIC_REDIS_PASSWORD``, else the first line of the file
    ``$LUDIC_REDIS_PASSWORD_FILE``, else None."""
    if os.environ.get(PASSWORD_ENV):
        return os.environ[PASSWORD_ENV]
    path = os.environ.get(PASSWORD_FILE_ENV)
    if path:
        text = Path(path).read_text().strip()
        if not text:
            raise ValueError(f"{PASSWORD_FILE_ENV}={path} is empty")
        return text.splitlines()[0].strip()
    return None


def _loopback(host: str) -> bool:
    return host in ("127.0.0.1", "localhost", "::1")


class RedisServer:
    """Start and stop a local ``redis-server`` that keeps its data in ``data_dir``.

    Args:
        data_dir: the AOF lives here; a restarted server on the same folder gets it back.
        port: TCP port (0: a free one).
        host: bind address ("0.0.0.0" for other hosts and network namespaces: needs a password).
        appendfsync: ``always`` (default, see the module docstring), ``everysec`` or ``no``.
    """

    def __init__(self, data_dir: str | Path, port: int = 0, *, host: str = "127.0.0.1",
                 appendfsync: str = "always") -> None:
        from ludic.inference.vllm_launcher import free_port

        if appendfsync not in ("always", "everysec", "no"):
            raise ValueError(f"appendfsync must be always, everysec or no, got {appendfsync!r}")
        self.binary = shutil.which("redis-server")
        if self.binary is None:
            raise FileNotFoundError("redis-server is not installed (make setup installs it with apt-get)")
        self.password = redis_password()
        if not _loopback(host) and self.password is None:
            raise ValueError(f"binding redis-server to {host} exposes it beyond this machine: set {PASSWORD_ENV} "
                             f"or {PASSWORD_FILE_ENV} (a file holding the password) for the server and every "
                             "actor and learner; a password is never given on the command line")
        self.data_dir = Path(data_dir).resolve()
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.host, self.port, self.appendfsync = host, port or free_port(), appendfsync
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        host = "127.0.0.1" if self.host == "0.0.0.0" else self.host
        return f"redis://{host}:{self.port}/0"

    def start(self, timeout_s: float = 30.0) -> "RedisServer":
        import redis

        conf = self.data_dir / "ludic-redis.conf"  # the password's only place: a file this user alone reads
        fd = os.open(conf, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f'requirepass "{self.password}"\n' if self.password else "")
        os.chmod(conf, 0o600)
        cmd = [self.binary, str(conf), "--port", str(self.port), "--bind", self.host, "--dir", str(self.data_dir),
               "--appendonly", "yes", "--appendfsync", self.appendfsync, "--save", "",
               "--protected-mode", "yes", "--daemonize", "no", "--loglevel", "warning",
               "--logfile", str(self.data_dir / "redis.log")]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        client = redis.Redis(host=self.host if self.host != "0.0.0.0" else "127.0.0.1", port=self.port,
                             password=self.password)
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                log = (self.data_dir / "redis.log")
                raise RuntimeError(f"redis-server exited with {self.proc.returncode}: "
                                   f"{log.read_text()[-2000:] if log.exists() else ''}")
            try:
                if client.ping():
                    return self
            except (redis.ConnectionError, redis.BusyLoadingError):
                pass
            if time.monotonic() > deadline:
                self.kill()
                raise TimeoutError(f"redis-server on port {self.port} did not answer within {timeout_s}s")
            time.sleep(0.05)

    def kill(self) -> None:
        """``kill -9``: no shutdown save, what is on disk is what the AOF had."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()

    def __enter__(self) -> "RedisServer":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
