"""Ownership of the server's update lock: only the lease that took it gives it back, and the
NCCL watchdog and finish give back only the NCCL update's own hold (pure asyncio; the routes
around them run against a real server in tests/integration/test_vllm.py)."""

from __future__ import annotations

import asyncio

import pytest

from ludic.inference.vllm_server.state import NCCLSession, PolicyState, UpdateLock


async def _noop() -> None:
    return None


async def blocked(lock: UpdateLock) -> bool:
    """Whether acquiring ``lock`` has to wait."""
    try:
        lease = await asyncio.wait_for(lock.acquire("probe"), 0.05)
    except asyncio.TimeoutError:
        return True
    lock.release(lease)
    return False


async def test_update_lock_is_released_only_by_its_holder() -> None:
    lock = UpdateLock()
    first = await lock.acquire("nccl")
    assert lock.release(first)
    second = await lock.acquire("load_adapter")
    assert not lock.release(first)  # a stale lease frees nothing
    assert lock.holder is second and await blocked(lock)
    assert lock.release(second) and not await blocked(lock)


async def test_nccl_watchdog_gives_back_only_its_own_hold() -> None:
    state = PolicyState(base_model="m")
    session = NCCLSession(state, timeout_s=0.05)
    lease, _ = await session.start(1.0, _noop)
    assert state.lock.holder is lease and state.gate.updating
    await asyncio.sleep(0.2)  # the trainer never finishes: the watchdog reopens the gate
    assert state.lock.holder is None and not state.gate.updating
    other = await state.lock.acquire("load_adapter")
    assert session.take(lease.id) is None and session.current() is None  # the late finish gets a 409
    assert not state.lock.release(lease)
    assert state.lock.holder is other


async def test_nccl_finish_stands_the_watchdog_down() -> None:
    state = PolicyState(base_model="m")
    session = NCCLSession(state, timeout_s=0.05)
    lease, _ = await session.start(1.0, _noop)
    assert session.take("another-trainer") is None  # a lease id that is not this update's
    assert session.take(lease.id) is lease
    await asyncio.sleep(0.2)  # past the timeout: the watchdog must not release the finisher's hold
    assert state.lock.holder is lease and state.gate.updating
    epoch = state.gate.epoch
    await session.end(lease)
    assert state.lock.holder is None and not state.gate.updating and state.gate.epoch == epoch + 1


async def test_failed_nccl_start_gives_everything_back() -> None:
    state = PolicyState(base_model="m")
    session = NCCLSession(state, timeout_s=10)

    async def broken() -> None:
        raise RuntimeError("Weight transfer not configured")

    with pytest.raises(RuntimeError):
        await session.start(1.0, broken)
    assert state.lock.holder is None and not state.gate.updating and state.gate.epoch == 0
    assert session.current() is None
