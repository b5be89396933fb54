"""What the server serves as 'the policy', and the gate that keeps weight swaps atomic."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from ludic.inference.wire import POLICY_ALIAS


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
