"""RolloutEngine: run many episodes concurrently and log them with their tokens.

A request names an env (by registry kind + kwargs), a protocol (by key into
the engine's protocol registry: a factory that builds a fresh agent/context
per episode), seeds and a group. The engine builds env and protocol fresh for
every episode, runs up to ``concurrency`` episodes at once (their model calls
are batched by the inference engine), stamps rollout metadata and, if asked,
appends every rollout to a JSONL log that keeps the token ids. An episode
that raises (env construction, protocol factory, anything a protocol let
escape) becomes a failed rollout with the error in its meta; the batch goes on.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
import uuid
from pathlib import Path
from typing import Callable, Protocol, Sequence

from ludic.envs.registry import make_env
from ludic.errors import episode_failure, stage
from ludic.interaction.base import InteractionProtocol
from ludic.progress import Progress
from ludic.types import DEFAULT_MAX_STEPS, FinishReason, Rollout, RolloutRequest, Step

ProtocolFactory = Callable[[], InteractionProtocol]


class RequestStrategy(Protocol):
    """Expands a list of requests (e.g. into GRPO groups).

    A strategy with state (an RNG) also has ``state_dict() -> JSON`` and
    ``load_state_dict(JSON)``, so a resumed run draws the seeds it would have drawn.
    """

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]: ...


class IdentityStrategy:
    """Leave requests as they are."""

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        return list(requests)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def rng_state(rng: random.Random) -> list:
    """A ``random.Random`` state as JSON-able data."""
    version, internal, gauss = rng.getstate()
    return [version, list(internal), gauss]


def set_rng_state(rng: random.Random, state: list) -> None:
    version, internal, gauss = state
    rng.setstate((version, tuple(internal), gauss))


class GRPORequestStrategy:
    """Each request becomes ``group_size`` copies: same env seed, distinct sampling seeds.

    Copies share a fresh ``group_id`` so ``GroupNormalizedReturn`` compares
    them with each other. Seeds come from a seeded RNG, so a run is reproducible.
    ``explore=k`` sends the last k copies of each group to the protocol ``explore_protocol``
    (meta ``explore: True``), e.g. the same agent sampling hotter: when the policy's own
    samples of a group all agree, those copies still give the group something to compare.
    """

    def __init__(self, group_size: int, seed: int = 0, *, explore: int = 0,
                 explore_protocol: str = "explore") -> None:
        if group_size < 1:
            raise ValueError(f"GRPORequestStrategy: group_size must be >= 1, got {group_size}")
        if not 0 <= explore < group_size:
            raise ValueError(f"GRPORequestStrategy: explore must be in [0, group_size={group_size}), got {explore}: "
                             "a group needs at least one sample of the policy itself")
        self.group_size = group_size
        self.explore, self.explore_protocol = explore, explore_protocol
        self.rng = random.Random(seed)

    def expand(self, requests: Sequence[RolloutRequest]) -> list[RolloutRequest]:
        out = []
        for req in requests:
            env_seed = req.env_seed if req.env_seed is not None else self.rng.getrandbits(31)
            base = self.rng.getrandbits(31)
            gid = req.group_id or uuid.UUID(int=self.rng.getrandbits(128)).hex
            for i in range(self.group_size):
                hot = i >= self.group_size - self.explore
                out.append(
                    RolloutRequest(
                        env=req.env, protocol=self.explore_protocol if hot else req.protocol, env_seed=env_seed,
                        sampling_seed=base + i * 7919, group_id=gid,
                        max_steps=req.max_steps, meta={**req.meta, "explore": True} if hot else req.meta,
                    )
                )
        return out

    def state_dict(self) -> dict:
        return {"rng": rng_state(self.rng)}

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(self.rng, state["rng"])


class RolloutEngine:
    """Runs episodes concurrently.

    Args:
        protocols: ``{key: factory}``; each factory returns a fresh protocol
            (with fresh agents and contexts) for one episode.
        concurrency: episodes in flight at once.
        jsonl_path: if set, every rollout is appended here (token ids included).
    """

    def __init__(
        self,
        protocols: dict[str, ProtocolFactory],
        *,
        concurrency: int = 32,
        jsonl_path: str | Path | None = None,
    ) -> None:
        self.protocols = protocols
        self.concurrency = concurrency
        self.jsonl_path = Path(jsonl_path) if jsonl_path else None
        self.episodes = 0
        """Episodes started so far (the default env seed of an episode is its index)."""

    async def run_episode(self, req: RolloutRequest, episode_idx: int) -> list[Rollout]:
        """Play one request; if anything raises, one failed rollout records the error instead."""
        env_seed = req.env_seed if req.env_seed is not None else episode_idx
        t0 = time.perf_counter()
        try:
            with stage("protocol.make"):
                if req.protocol not in self.protocols:
                    raise KeyError(f"unknown protocol {req.protocol!r}; registered: {sorted(self.protocols)}")
                protocol = self.protocols[req.protocol]()
            with stage("env.make"):
                env = make_env(req.env)
            max_steps = req.max_steps if req.max_steps is not None else (env.max_turns or DEFAULT_MAX_STEPS)
            rollouts = await protocol.run(env, max_steps=max_steps, env_seed=env_seed, sampling_seed=req.sampling_seed)
        except Exception as e:  # the backstop: protocols catch what happens inside the episode
            failure = episode_failure(e, "protocol")
            rollouts = [Rollout(meta={"agent_id": None, "truncation_reason": "error", **failure})]
        dt = time.perf_counter() - t0
        for r in rollouts:
            r.meta.update(
                {
                    "env_kind": req.env.kind, "env_kwargs": req.env.kwargs, "env_seed": env_seed,
                    "sampling_seed": req.sampling_seed, "group_id": req.group_id,
                    "episode_idx": episode_idx, "duration_s": dt, **req.meta,
                }
            )
        return rollouts

    async def generate_rollouts(self, requests: Sequence[RolloutRequest], progress: str | None = None) -> list[Rollout]:
        """Run every request; rollouts come back in request order (one or more per request).

        ``progress``: a description to show a ``ludic.progress`` bar over the episodes (evaluation and
        data generation pass one; a training step does not, its logger shows the steps)."""
        sem = asyncio.Semaphore(self.concurrency)
        start = self.episodes
        self.episodes += len(requests)
        bar = (Progress(progress, len(requests), unit="episode", eta_after=max(2, len(requests) // 20))
               if progress else None)
        errors = 0

        async def one(i: int, req: RolloutRequest) -> list[Rollout]:
            nonlocal errors
            async with sem:
                rollouts = await self.run_episode(req, start + i)
            if bar is not None:
                errors += any(r.meta.get("failed") for r in rollouts)
                bar.update(1, **({"failed": errors} if errors else {}))
            return rollouts

        try:
            results = await asyncio.gather(*(one(i, r) for i, r in enumerate(requests)))
        finally:
            if bar is not None:
                bar.close()
        rollouts = [r for rs in results for r in rs]
        if self.jsonl_path is not None:
            append_rollouts(self.jsonl_path, rollouts)
        return rollouts


def append_rollouts(path: Path, rollouts: Sequence[Rollout]) -> None:
    """Append rollouts as JSON lines (one rollout per line, token traces included)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        for r in rollouts:
            f.write(json.dumps(r.to_dict()) + "\n")


def read_rollouts(path: str | Path) -> list[Rollout]:
    """Read a rollout JSONL log; a bad line raises naming the file and line."""
    out = []
    with open(path) as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                out.append(Rollout.from_dict(json.loads(line)))
            except Exception as e:
                raise ValueError(f"{path}:{lineno}: not a valid rollout record ({type(e).__name__}: {e})") from e
    return out


def episode_success(r: Rollout) -> float:
    """``info["success"]`` of the last step (or any step), else 1 for a positive total reward."""
    for s in reversed(r.steps):
        if "success" in s.info:
            return float(s.info["success"])
    return float(r.total_reward > 0)


def outcome_counts(rollouts: Sequence[Rollout]) -> dict[str, float]:
    """Rates useful for any env: success (``episode_success``), parse errors, truncation, mean reward, and failures:
    ``failed_rate`` (failed inference or an exception) and ``error_count`` / ``error_rate``
    (rollouts ended by an exception, ``meta["error"]``)."""
    steps: list[Step] = [s for r in rollouts for s in r.steps if not s.no_turn]  # the model's turns
    n_r, n_s = max(len(rollouts), 1), max(len(steps), 1)
    errors = sum(bool(r.meta.get("error")) for r in rollouts)
    return {
        "reward_mean": sum(r.total_reward for r in rollouts) / n_r,
        "success_rate": sum(episode_success(r) >= 1.0 for r in rollouts if not r.meta.get("failed")) / n_r,
        "parse_error_rate": sum(s.parse_error for s in steps) / n_s,
        "truncated_rate": sum(bool(r.meta.get("truncation_reason")) for r in rollouts) / n_r,
        "cut_reply_rate": sum(s.trace is not None and s.trace.finish_reason == FinishReason.LENGTH for s in steps) / n_s,
        "failed_rate": sum(bool(r.meta.get("failed")) for r in rollouts) / n_r,
        "error_count": float(errors),
        "error_rate": errors / n_r,
        "steps_per_episode": len(steps) / n_r,
        "completion_tokens_mean": sum(len(s.trace.completion_ids) for s in steps if s.trace) / n_s,
    }
