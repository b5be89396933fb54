"""Redis Streams between actors and the learner: samples with a consumer group and
acknowledgements, and weight announcements on their own stream.

    streams = PipelineStreams("redis://127.0.0.1:6379/0", prefix="run1")
    # actor
    writer = SampleWriter(streams, max_unread=256)
    ids = writer.push(items)                       # waits while the learner is behind
    version, info = streams.latest_weights()       # or streams.wait_weights(after=...)
    # learner
    reader = SampleReader(streams, consumer="learner")
    for entry_id, item in reader.read(64):         # its own pending entries first, then new ones
        ...
    reader.ack(done_ids)                           # only once the checkpoint holding them is on disk
    streams.announce_weights(version, {"adapter": "/path"})

The sample stream is never trimmed (no ``XADD MAXLEN``, no ``XTRIM``): on Redis 7.0.15,
trimming deleted entries still pending in a consumer group, which loses samples a crashed
learner had read but not trained on. Its size is bounded instead by backpressure: a writer
waits while more than ``max_unread`` entries are not yet delivered to the learner's group.
Acknowledged entries stay in the stream (a few hundred bytes per token each); ``XDEL`` of
acknowledged ids is safe, and ``PipelineStreams.delete_acked`` does it explicitly.

Entries are ``ludic.pipeline.wire`` maps: JSON and raw numbers, never pickle.
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any, Iterable, Iterator, Sequence

from ludic.pipeline.wire import MalformedEntry, decode_item, encode_item
from ludic.types import SAWItem


def _id(x: bytes | str) -> str:
    return x.decode() if isinstance(x, bytes) else x


class PipelineStreams:
    """One run's streams on one Redis: ``<prefix>:samples`` (read by the consumer group
    ``group``) and ``<prefix>:weights`` (read by everyone, no group).

    Args:
        url: ``redis://host:port/db``.
        prefix: namespaces the run's keys (several runs can share a Redis).
        group: the learner's consumer group on the sample stream.
        retries_on_redis_down: attempts (backoff up to 2 s each) before a command gives up on
            an unreachable Redis. A write retried after a connection died mid-command may be
            stored twice (the actors' side is at least once); reads and acks are idempotent.
    """

    def __init__(self, url: str, *, prefix: str = "ludic", group: str = "learner",
                 retries_on_redis_down: int = 40) -> None:
        import redis
        from redis.backoff import ExponentialBackoff
        from redis.retry import Retry

        from ludic.pipeline.redis_server import redis_password

        self.url, self.prefix, self.group = url, prefix, group
        password = redis_password()  # $LUDIC_REDIS_PASSWORD(_FILE); a password in the URL wins
        # a restarting Redis (kill -9, then AOF reload) is waited for, up to about a minute
        self.redis = redis.Redis.from_url(
            url, socket_timeout=None, retry=Retry(ExponentialBackoff(cap=2.0, base=0.1), retries_on_redis_down),
            retry_on_error=[redis.ConnectionError, redis.TimeoutError, redis.BusyLoadingError],
            **({"password": password} if password else {}))
        self.samples = f"{prefix}:samples"
        self.weights = f"{prefix}:weights"

    def new_actor_id(self) -> str:
        """A name no other actor of this run has taken: ``actor-<n>``, with ``n`` counted in Redis
        (``<prefix>:actor_count``) as actors start, so actors on any host or in any container (where
        process ids repeat) get distinct names, and from them distinct seeds (``recipes.pipeline.actor_seed``)."""
        return f"actor-{int(self.redis.incr(f'{self.prefix}:actor_count'))}"

    def ensure_group(self) -> None:
        """Create the stream and the learner's group (from the stream's start) if missing."""
        import redis

        try:
            self.redis.xgroup_create(self.samples, self.group, id="0", mkstream=True)
        except redis.ResponseError as e:
            if "BUSYGROUP" not in str(e):
                raise

    def unread(self) -> int:
        """Entries of the sample stream not yet delivered to the learner's group (all of
        them when the group does not exist yet)."""
        for g in self.redis.xinfo_groups(self.samples) if self.redis.exists(self.samples) else []:
            if _id(g["name"]) == self.group:
                lag = g.get("lag")
                if lag is not None:
                    return int(lag)
                # Redis cannot say (e.g. after it restarted from its AOF): count the entries after
                # the group's last delivered id (few: backpressure bounds them)
                return len(self.all_ids(after=_id(g["last-delivered-id"])))
        return int(self.redis.xlen(self.samples)) if self.redis.exists(self.samples) else 0

    def pending_ids(self) -> list[str]:
        """Ids delivered to the learner's group and not acknowledged (``XPENDING``)."""
        out: list[str] = []
        start = "-"
        while True:
            rows = self.redis.xpending_range(self.samples, self.group, min=start, max="+", count=1000)
            out += [_id(r["message_id"]) for r in rows]
            if len(rows) < 1000:
                return out
            start = "(" + out[-1]

    def all_ids(self, after: str | None = None) -> list[str]:
        """Every id in the sample stream (``XRANGE``), acknowledged or not; with ``after``, only
        those after that id."""
        out: list[str] = []
        start = "-" if after is None else "(" + after
        while True:
            rows = self.redis.xrange(self.samples, min=start, max="+", count=1000)
            out += [_id(i) for i, _ in rows]
            if len(rows) < 1000:
                return out
            start = "(" + out[-1]

    def delete_acked(self, ids: Sequence[str]) -> int:
        """``XDEL`` entries the learner has acknowledged (never pending ones)."""
        pending = set(self.pending_ids())
        done = [i for i in ids if i not in pending]
        return int(self.redis.xdel(self.samples, *done)) if done else 0

    # ----------------------------------------------------------------- weights
    def announce_weights(self, version: int, info: dict[str, Any] | None = None) -> str:
        """Tell actors that ``version`` is published (``info``: where and how, JSON)."""
        body = json.dumps({"version": int(version), **(info or {})})
        return _id(self.redis.xadd(self.weights, {b"announce": body.encode()}))

    def latest_weights(self) -> tuple[int, dict[str, Any], str] | None:
        """(version, info, entry id) of the newest announcement, or None."""
        rows = self.redis.xrevrange(self.weights, max="+", min="-", count=1)
        return _announcement(rows[0]) if rows else None

    def wait_weights(self, after: str = "$", block_ms: int = 1000) -> tuple[int, dict[str, Any], str] | None:
        """The newest announcement after entry id ``after`` (``$``: after now), waiting up to
        ``block_ms``; None if none came."""
        got = self.redis.xread({self.weights: after}, block=block_ms)
        if not got:
            return None
        return _announcement(got[0][1][-1])


def _announcement(row: Any) -> tuple[int, dict[str, Any], str]:
    entry_id, fields = row
    info = json.loads(fields[b"announce"])
    return int(info.pop("version")), info, _id(entry_id)


class SampleWriter:
    """An actor's side of the sample stream: ``push`` waits while more than ``max_unread``
    entries wait for the learner, then appends (``XADD``, never trimmed)."""

    def __init__(self, streams: PipelineStreams, *, max_unread: int = 256, poll_s: float = 0.05) -> None:
        if max_unread < 1:
            raise ValueError(f"max_unread must be >= 1, got {max_unread}")
        self.streams, self.max_unread, self.poll_s = streams, max_unread, poll_s
        self.waited_s = 0.0

    def wait_for_room(self, timeout_s: float | None = None, stop: threading.Event | None = None) -> bool:
        """Block while the learner is more than ``max_unread`` entries behind; False on timeout or
        once ``stop`` is set (an actor cancelled while it waits in a worker thread sets it)."""
        t0 = time.perf_counter()
        try:
            while self.streams.unread() >= self.max_unread:
                if timeout_s is not None and time.perf_counter() - t0 > timeout_s:
                    return False
                if stop is not None and stop.is_set():
                    return False
                time.sleep(self.poll_s)
            return True
        finally:
            self.waited_s += time.perf_counter() - t0

    def push(self, items: Iterable[SAWItem], *, wait: bool = True) -> list[str]:
        """Append items (one entry each); returns their stream ids."""
        if wait:
            self.wait_for_room()
        pipe = self.streams.redis.pipeline(transaction=False)
        for item in items:
            pipe.xadd(self.streams.samples, encode_item(item))
        return [_id(i) for i in pipe.execute()]

    def push_raw(self, fields: dict[bytes, bytes]) -> str:
        """Append an entry as given (tests use it for malformed entries)."""
        return _id(self.streams.redis.xadd(self.streams.samples, fields))


class ActorStatus:
    """An actor's heartbeat: one field of the hash ``<prefix>:actors`` (actor id -> JSON ``{t, version,
    pushed, error}``), written as the actor works and when it fails, so a learner waiting for samples
    can say why none come (``describe_actors``)."""

    def __init__(self, streams: PipelineStreams, actor_id: str) -> None:
        self.streams, self.actor_id = streams, actor_id

    def beat(self, *, version: int | None = None, pushed: int = 0, error: str | None = None,
             t: float | None = None) -> None:
        body = {"t": time.time() if t is None else t, "version": version, "pushed": pushed, "error": error}
        self.streams.redis.hset(f"{self.streams.prefix}:actors", self.actor_id, json.dumps(body))


def describe_actors(streams: PipelineStreams, silent_after_s: float = 120.0) -> str:
    """What the actors' heartbeats say, for a learner that waits: none seen, each one's last error, or
    how long ago each was last heard of."""
    raw = streams.redis.hgetall(f"{streams.prefix}:actors")
    if not raw:
        return (f"no actor has reported to {streams.url} under prefix {streams.prefix!r}: start `ludic actor` "
                "with the same --redis-url and --stream-prefix")
    now, parts = time.time(), []
    for k, v in sorted(raw.items()):
        try:
            s = json.loads(v)
        except ValueError:
            continue
        name, ago = _id(k), now - float(s.get("t") or 0.0)
        if s.get("error"):
            parts.append(f"{name} stopped with {s['error']} ({ago:.0f} s ago)")
        elif ago > silent_after_s:
            parts.append(f"{name}: last heard {ago:.0f} s ago (dead?), at version {s.get('version')}, "
                         f"{s.get('pushed')} items pushed")
        else:
            parts.append(f"{name}: alive {ago:.0f} s ago at version {s.get('version')}, {s.get('pushed')} items pushed")
    return "; ".join(parts)


class SampleReader:
    """The learner's side: reads through the consumer group; its own pending entries (read
    before a restart, not acknowledged) come back first, then new ones.

    ``read`` yields ``(entry id, SAWItem or MalformedEntry)``: a broken entry is handed over
    with its id, for the caller to count, log and acknowledge, never raised. ``vocab_size``: token
    ids must be below it (the learner's embedding rows; ``wire.decode_item``).
    """

    def __init__(self, streams: PipelineStreams, consumer: str = "learner", vocab_size: int | None = None) -> None:
        self.streams, self.consumer, self.vocab_size = streams, consumer, vocab_size
        streams.ensure_group()
        self._backlog: str | None = "0"  # first re-read what this consumer had pending, from this id on

    def read(self, count: int, block_ms: int = 1000) -> list[tuple[str, SAWItem | MalformedEntry]]:
        s = self.streams
        if self._backlog is not None:
            got = s.redis.xreadgroup(s.group, self.consumer, {s.samples: self._backlog}, count=count)
            rows = got[0][1] if got else []
            self._backlog = _id(rows[-1][0]) if len(rows) == count else None
            if rows:
                return list(_decode(rows, self.vocab_size))
        got = s.redis.xreadgroup(s.group, self.consumer, {s.samples: ">"}, count=count, block=block_ms)
        return list(_decode(got[0][1], self.vocab_size)) if got else []

    def ack(self, ids: Sequence[str]) -> int:
        return int(self.streams.redis.xack(self.streams.samples, self.streams.group, *ids)) if ids else 0


def _decode(rows: Any, vocab_size: int | None = None) -> Iterator[tuple[str, SAWItem | MalformedEntry]]:
    for entry_id, fields in rows:
        if not fields:  # deleted while pending
            yield _id(entry_id), MalformedEntry("the entry was deleted while pending")
            continue
        try:
            yield _id(entry_id), decode_item(fields, vocab_size=vocab_size)
        except MalformedEntry as e:
            yield _id(entry_id), e
