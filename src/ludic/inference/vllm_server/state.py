"""What the server serves as 'the policy', the gate that keeps weight swaps atomic, and the
update lock with an explicit holder (an NCCL update holds it across requests)."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ludic.inference.wire import POLICY_ALIAS

logger = logging.getLogger("ludic.vllm_server")


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


@dataclass(frozen=True, eq=False)
class Lease:
    """One holding of the update lock."""

    owner: str
    """What took it (a route name)."""
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    """Unique per holding; an NCCL trainer sends it back with /ludic/nccl/update and /finish."""


class UpdateLock:
    """The lock that serialises weight changes, with an explicit holder: only the lease that
    acquired it releases it, so a late or repeated release (an NCCL finish after its watchdog
    gave up, a finish without a start) cannot free a lock another route holds."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()
        self.holder: Lease | None = None

    async def acquire(self, owner: str) -> Lease:
        await self._lock.acquire()
        self.holder = Lease(owner)
        return self.holder

    def release(self, lease: Lease) -> bool:
        """Release if ``lease`` holds the lock; False (and nothing released) otherwise."""
        if self.holder is not lease:
            return False
        self.holder = None
        self._lock.release()
        return True

    @asynccontextmanager
    async def hold(self, owner: str) -> AsyncIterator[Lease]:
        lease = await self.acquire(owner)
        try:
            yield lease
        finally:
            self.release(lease)


@dataclass
class PolicyState:
    """What the server is serving as 'the policy'."""

    base_model: str
    version: int = 0
    """Version of the current policy."""
    last_version: int = 0
    """Version of the last push (new pushes must exceed it unless forced; a forced one may lower it)."""
    last_source: str | None = None
    """What the last push loaded (see ``folder_source``; ``upload:<sha256>`` for uploads)."""
    base_version: int = 0
    """Version of the last full-weight push (0 = the weights the server started with)."""
    adapter: str | None = None
    """Served name of the current adapter (None = base weights)."""
    adapters: dict[str, int] = field(default_factory=dict)
    """Ludic-loaded adapters still registered: served name -> version."""
    retired: set[str] = field(default_factory=set)
    inflight: dict[str, int] = field(default_factory=dict)
    """In-flight generation requests per resolved model name."""
    lock: UpdateLock = field(default_factory=UpdateLock)
    gate: UpdateGate = field(default_factory=UpdateGate)

    def resolve(self, model: str | None) -> tuple[str, int]:
        """(served model name, policy version) for a request's ``model`` field."""
        if model in (None, "", POLICY_ALIAS):
            model = self.adapter or self.base_model
        if model in self.adapters:
            return model, max(self.adapters[model], self.base_version)
        return model, self.base_version

    def admit(self, requested: Any, force: bool, source: str) -> int | None:
        """Version for a push of ``source``; None when this very push (same version, same
        source) was the last one applied, e.g. a retry whose first answer was lost."""
        if not force and type(requested) is int and requested == self.last_version and source == self.last_source:
            return None
        return self.next_version(requested, force)

    def applied(self, version: int, source: str | None) -> None:
        """Record a push that changed the policy."""
        self.version = self.last_version = version
        self.last_source = source

    def next_version(self, requested: Any, force: bool) -> int:
        if requested is None:
            return self.last_version + 1
        if isinstance(requested, bool) or not isinstance(requested, int):
            raise TypeError(f"version must be an integer, got {requested!r}")
        if requested <= self.last_version and not force:
            raise ValueError(
                f"version {requested} is not newer than the server's last version "
                f"{self.last_version} (send force=true to override)"
            )
        return int(requested)

    def as_dict(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "last_version": self.last_version,
            "adapter": self.adapter,
            "model": self.adapter or self.base_model,
            "base_model": self.base_model,
            "base_version": self.base_version,
            "adapters": dict(self.adapters),
            "alias": POLICY_ALIAS,
        }


def folder_source(kind: str, folder: Path) -> str:
    """Identity of a pushed folder: its resolved path and its files' names, sizes and mtimes, so a
    folder rewritten in place (other weights under the same path) counts as another source."""
    files = sorted(f for f in folder.rglob("*") if f.is_file())
    stats = [(str(f.relative_to(folder)), f.stat().st_size, f.stat().st_mtime_ns) for f in files]
    return f"{kind}:{folder}:{hashlib.sha256(repr(stats).encode()).hexdigest()[:16]}"


NO_NCCL_UPDATE = "no NCCL weight update in progress"


class NCCLSession:
    """The NCCL weight update in progress (at most one). It holds the update lock and the gate
    from /ludic/nccl/start to /ludic/nccl/finish; if the trainer never finishes, the watchdog
    gives back exactly that hold after ``timeout_s``. A finish or update that does not belong to
    the running update (none running, or another lease id) gets nothing."""

    def __init__(self, state: PolicyState, timeout_s: float) -> None:
        self.state = state
        self.timeout_s = timeout_s
        self.lease: Lease | None = None
        self._watchdog: asyncio.Future | None = None

    async def start(self, drain_timeout_s: float, engine_start: Callable[[], Awaitable[Any]]) -> tuple[Lease, bool]:
        """Take the lock, drain, then ``engine_start()``; returns (lease, drained)."""
        lease = await self.state.lock.acquire("nccl")
        drained = await self.state.gate.begin_update(drain_timeout_s)
        try:
            await engine_start()
        except BaseException:
            await self.end(lease, swapped=False)
            raise
        self.lease = lease
        self._watchdog = asyncio.ensure_future(self._expire(lease))
        return lease, drained

    def current(self, lease_id: str | None = None) -> Lease | None:
        """The running update's lease, if there is one and ``lease_id`` (when given) names it."""
        if self.lease is None or (lease_id is not None and lease_id != self.lease.id):
            return None
        return self.lease

    def take(self, lease_id: str | None = None) -> Lease | None:
        """Hand the running update to its finisher (the watchdog stands down); None if none runs."""
        lease = self.current(lease_id)
        if lease is not None:
            self.lease = None
            if self._watchdog is not None:
                self._watchdog.cancel()
        return lease

    async def end(self, lease: Lease, swapped: bool = True) -> None:
        """Reopen the gate and release the lock that ``lease`` holds."""
        await self.state.gate.end_update(swapped=swapped)
        self.state.lock.release(lease)

    def refusal(self) -> str:
        return (f"{NO_NCCL_UPDATE}: none was started with /ludic/nccl/start, it belongs to another "
                f"trainer (lease id), or it was given up after --ludic-update-timeout {self.timeout_s:.0f}s")

    async def _expire(self, lease: Lease) -> None:
        await asyncio.sleep(self.timeout_s)
        if self.take(lease.id) is lease:
            logger.error("NCCL weight update not finished after %.0fs: reopening the gate", self.timeout_s)
            await self.end(lease)
