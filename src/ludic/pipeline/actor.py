"""Actors and the learner of pipeline RL, joined only by Redis (weights travel through it too,
unless a shared folder or an inference server is chosen).

Actor: roll out with its own engine, assign credit, push SAW items (``SampleWriter`` waits while
the learner is behind), and follow the weight stream: a new version is swapped into the engine
between two generation batches, even in the middle of an episode, and every token keeps the
version that produced it. Actors hold no state that matters: a restarted one loads the newest
announced weights and goes on.

Learner: a ``Trainer`` whose batches come from ``PipelineBatchSource`` and whose publisher is
``AnnouncingPublisher`` (save the weights, then announce them). Entries are acknowledged when the
checkpoint holding their step is on disk.

    # actor process                                   # learner process
    actor = Actor(streams, rollout_source, engine,    trainer = make_learner(model, tok, algo, cfg,
                  model=model)                                               streams, run_dir, batch_size=32)
    await actor.run()                                 trainer.resume(); await trainer.train(steps)

``ActorThread`` runs an actor on a thread of the learner's process (``--overlap``: the pipeline with
max_lag 1 in one process, generation of batch k+1 overlapping the optimizer step on batch k).
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Awaitable, Callable

from ludic.inference.publish import prune_versions
from ludic.pipeline.source import PipelineBatchSource
from ludic.pipeline.streams import ActorStatus, PipelineStreams, SampleReader, SampleWriter

log = logging.getLogger(__name__)


def stamped_items(batch: Any, actor_id: str) -> list[Any]:
    """The batch's items with what the learner needs from their actor batch in each item's meta: the actor,
    the batch's ``zero_var_group_share`` (no silent non-learning), and the action tokens its sample filter
    dropped per token kept (``filtered_tokens_per_token``: the learner's scale_lr_by_signal counts them)."""
    stamp: dict[str, Any] = {"actor": actor_id}
    if "zero_var_group_share" in batch.meta:
        stamp["zero_var_group_share"] = batch.meta["zero_var_group_share"]
    kept = sum(it.num_action_tokens for it in batch.items)
    if batch.meta.get("filtered_action_tokens") and kept:
        stamp["filtered_tokens_per_token"] = batch.meta["filtered_action_tokens"] / kept
    return [replace(it, meta={**it.meta, **stamp}) for it in batch.items]


# --------------------------------------------------------------------------- weights


class AnnouncingPublisher:
    """The learner's publisher: store version ``v``'s weights (a peft adapter's tensors, or the
    full weights), then announce them on the weight stream.

    ``transport="redis"`` (default) stores the safetensors bytes in Redis under
    ``<prefix>:weights:v<v>`` (the last ``keep_last`` versions are kept): actors on other hosts
    need nothing but the Redis address. ``"path"`` writes ``out_dir/v<v>`` instead (a filesystem
    the actors share; better for full weights of large models). With ``inner`` (e.g. a
    ``VLLMAdapterPublisher``), that publisher pushes to the inference servers and the
    announcement only carries the version.

    Versions are never reused. ``server_version`` is the highest version announced on the weight
    stream (or pushed to ``inner``'s servers), so a learner resumed from a checkpoint older than what
    its dead predecessor announced publishes its weights as the next number, and ``Trainer.publish_start``
    tells the batch source to drop what the numbers in between sampled (``discard_versions``). Keys
    are pruned relative to the version just announced (the ``keep_last`` up to it), never that one."""

    def __init__(self, streams: PipelineStreams, out_dir: str | Path | None = None, *, inner: Any = None,
                 transport: str = "redis", keep_last: int = 3) -> None:
        if transport not in ("redis", "path"):
            raise ValueError(f"transport must be redis or path, got {transport!r}")
        if transport == "path" and out_dir is None:
            raise ValueError("transport='path' needs out_dir")
        self.streams, self.inner, self.transport, self.keep_last = streams, inner, transport, keep_last
        self.out_dir = Path(out_dir).resolve() if out_dir is not None else None
        self.last_version: int | None = None

    def server_version(self) -> int | None:
        """The highest version announced on the weight stream or held by ``inner``'s servers (None: none)."""
        latest = self.streams.latest_weights()
        inner = self.inner.server_version() if hasattr(self.inner, "server_version") else None
        known = [v for v in (latest[0] if latest else None, inner) if v is not None]
        return max(known) if known else None

    def publish(self, model: Any, version: int, *, force: bool = False) -> dict[str, Any]:
        t0 = time.perf_counter()
        out: dict[str, Any] = {}
        if self.inner is not None:
            out = self.inner.publish(model, version, force=force) or {}
            info: dict[str, Any] = {"kind": "server"}
        elif self.transport == "path":
            assert self.out_dir is not None
            info = save_weights(model, self.out_dir / f"v{version:07d}")
            prune_versions(self.out_dir, self.keep_last)
        else:
            kind, blob = weights_bytes(model)
            key = f"{self.streams.prefix}:weights:v{version:07d}"
            self.streams.redis.set(key, blob)
            info = {"kind": kind, "key": key, "bytes": len(blob)}
            self._prune(version)
        entry = self.streams.announce_weights(version, info)
        self.last_version = version
        return {**out, "version": version, "announce_id": entry, "total_s": time.perf_counter() - t0}

    def _prune(self, version: int) -> None:
        """Keep the weight keys of the ``keep_last`` versions up to ``version``; delete older ones and any
        newer one (left by a learner that died after announcing it)."""
        prefix = f"{self.streams.prefix}:weights:v"
        gone = []
        for k in self.streams.redis.scan_iter(match=prefix + "*"):
            name = k.decode() if isinstance(k, bytes) else k
            try:
                v = int(name[len(prefix):])
            except ValueError:
                continue
            if v != version and not version - self.keep_last < v <= version:
                gone.append(name)
        if gone:
            self.streams.redis.delete(*gone)


def weights_bytes(model: Any) -> tuple[str, bytes]:
    """("adapter", the peft adapter's tensors) or ("full", the merged weights), as safetensors bytes."""
    from safetensors.torch import save

    from ludic.inference.models import is_peft, unwrap
    from ludic.inference.publish import merged_state_dict

    m = unwrap(model)
    if is_peft(m):
        from peft import get_peft_model_state_dict

        sd = {k: v.detach().contiguous().cpu() for k, v in get_peft_model_state_dict(m).items()}
        return "adapter", save(sd)
    return "full", save(merged_state_dict(m, dtype=None))


def save_weights(model: Any, folder: Path) -> dict[str, Any]:
    """Save a peft adapter (``save_pretrained``) or full weights; atomic (tmp + rename)."""
    import shutil

    from ludic.inference.models import is_peft, unwrap
    from ludic.inference.publish import merged_state_dict

    tmp = folder.with_name(folder.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    m = unwrap(model)
    if is_peft(m):
        m.save_pretrained(tmp)
        kind = "adapter"
    else:
        from safetensors.torch import save_file

        tmp.mkdir(parents=True)
        save_file(merged_state_dict(m, dtype=None), str(tmp / "model.safetensors"))
        kind = "full"
    shutil.rmtree(folder, ignore_errors=True)
    tmp.rename(folder)
    return {"kind": kind, "path": str(folder)}


def load_weights(model: Any, info: dict[str, Any], streams: PipelineStreams | None = None) -> None:
    """Load what an announcement names (``key`` in Redis, or ``path``) into ``model`` in place."""
    import torch
    from safetensors.torch import load, load_file

    from ludic.inference.models import unwrap

    if "key" in info:
        if streams is None:
            raise ValueError(f"announcement {info} names a Redis key but no streams were given")
        blob = streams.redis.get(info["key"])
        if blob is None:
            raise KeyError(f"{info['key']} is gone from Redis (a newer version replaced it)")
        sd = load(blob)
    else:
        folder = Path(info["path"])
        name = "adapter_model.safetensors" if info["kind"] == "adapter" else "model.safetensors"
        sd = load_file(str(folder / name))
    m = unwrap(model)
    with torch.no_grad():
        if info["kind"] == "adapter":
            from peft import set_peft_model_state_dict

            set_peft_model_state_dict(m, sd)
        elif info["kind"] == "full":
            _, unexpected = m.load_state_dict(sd, strict=False)
            if unexpected:
                raise ValueError(f"weights the model does not have: {unexpected[:5]} ({info})")
        else:
            raise ValueError(f"unknown weights kind {info['kind']!r} in announcement {info}")


class WeightFollower:
    """Applies each newer announcement to an in-process engine (``swap_weights``): between two
    generation batches, so an episode can span versions. The newest announcement always wins,
    also one with a lower version (a learner resumed from an earlier checkpoint)."""

    def __init__(self, streams: PipelineStreams, engine: Any, model: Any = None) -> None:
        self.streams, self.engine, self.model = streams, engine, model
        self.last_id = "0-0"
        self.applied = 0

    async def apply(self, announcement: tuple[int, dict[str, Any], str]) -> None:
        version, info, entry = announcement
        if info.get("kind") != "server" and self.model is not None:
            try:
                await self.engine.swap_weights(lambda: load_weights(self.model, info, self.streams), version)
            except KeyError as e:  # already replaced by a newer version: take that one
                latest = await asyncio.to_thread(self.streams.latest_weights)
                if latest is None or latest[2] == entry:
                    raise  # nothing newer: the weights are lost, say so
                log.warning("actor: %s; taking version %d", e, latest[0])
                return await self.apply(latest)
        else:  # the server has the weights already; its responses carry the version
            self.engine.policy_version = version
        self.last_id = entry
        self.applied += 1
        log.info("actor: weights v%d (%s)", version, info.get("kind"))

    async def catch_up(self) -> None:
        """Apply the newest announcement if it is not applied yet (no wait)."""
        latest = await asyncio.to_thread(self.streams.latest_weights)
        if latest is not None and latest[2] != self.last_id:
            await self.apply(latest)

    async def wait_first(self, timeout_s: float | None = None) -> None:
        """Block until some weights are announced (the learner publishes its start weights)."""
        t0 = time.monotonic()
        while self.applied == 0:
            await self.catch_up()
            if self.applied:
                return
            if timeout_s is not None and time.monotonic() - t0 > timeout_s:
                raise TimeoutError(f"no weights announced on {self.streams.weights} within {timeout_s}s")
            await asyncio.to_thread(self.streams.wait_weights, self.last_id, 500)

    async def run(self) -> None:
        """Follow announcements until cancelled."""
        while True:
            got = await asyncio.to_thread(self.streams.wait_weights, self.last_id, 500)
            if got is not None:
                await self.catch_up()  # the newest, not every one in between


# --------------------------------------------------------------------------- actor


class Actor:
    """Roll out, push, follow the weights.

    Args:
        streams: the run's streams.
        source: a ``RolloutBatchSource`` (rollouts + credit + filter), e.g. the one
            ``ludic train`` builds.
        engine: the in-process engine the source's agents sample from (``swap_weights``).
        model: the engine's model (weights are loaded into it).
        max_unread: backpressure bound (entries waiting for the learner).
        actor_id: names this actor in item meta and its log (default: ``streams.new_actor_id()``).
        log_path: JSONL, one line per push: the stream ids and rollout ids (for audits).
    """

    def __init__(self, streams: PipelineStreams, source: Any, engine: Any, *, model: Any = None,
                 max_unread: int = 256, actor_id: str | None = None, log_path: str | Path | None = None) -> None:
        self.streams, self.source, self.engine = streams, source, engine
        self.writer = SampleWriter(streams, max_unread=max_unread)
        self.follower = WeightFollower(streams, engine, model)
        self.actor_id = actor_id or streams.new_actor_id()
        self.log_path = Path(log_path) if log_path else None
        self.pushed = 0
        self.status = ActorStatus(streams, self.actor_id)
        """This actor's heartbeat in Redis (what a waiting learner reports)."""
        self._stopped = threading.Event()  # set when run() ends: a wait for room in a worker thread gives up

    async def run(self, batches: int | None = None, first_weights_timeout_s: float | None = 600.0) -> int:
        """Push ``batches`` batches (None: until cancelled); returns the items pushed. Its heartbeat
        says how far it got, and why it stopped when it fails."""
        try:
            return await self._run(batches, first_weights_timeout_s)
        except Exception as e:
            await asyncio.to_thread(self.status.beat, version=getattr(self.engine, "policy_version", None),
                                    pushed=self.pushed, error=f"{type(e).__name__}: {e}")
            raise

    async def _run(self, batches: int | None, first_weights_timeout_s: float | None) -> int:
        self._stopped.clear()
        await asyncio.to_thread(self.status.beat, pushed=0)
        await self.follower.wait_first(first_weights_timeout_s)
        follow = asyncio.create_task(self.follower.run())
        try:
            n = 0
            while batches is None or n < batches:
                if follow.done():  # weights stopped arriving: say why instead of pushing stale samples
                    follow.result()
                    raise RuntimeError("the weight follower stopped")
                await asyncio.to_thread(self.status.beat, version=getattr(self.engine, "policy_version", None),
                                        pushed=self.pushed)
                await asyncio.to_thread(self.writer.wait_for_room, stop=self._stopped)
                await self.follower.catch_up()  # the newest announced weights sample this batch
                batch = await self.source.next_batch()
                items = stamped_items(batch, self.actor_id)
                ids = await asyncio.to_thread(self._push_and_log, items)
                self.pushed += len(ids)
                n += 1
            return self.pushed
        finally:
            self._stopped.set()
            follow.cancel()

    def _push_and_log(self, items: list[Any]) -> list[str]:
        """Push and write the log line in one worker-thread call: an actor cancelled while it pushes
        (``ActorThread.stop``) still logs what reached Redis, so the audit finds every id logged."""
        ids = self.writer.push(items, wait=False)
        if self.log_path is not None:
            with open(self.log_path, "a") as f:
                f.write(json.dumps({"actor": self.actor_id, "ids": ids, "t": time.time(),
                                    "versions": [it.min_policy_version for it in items]}) + "\n")
        return ids


class ActorThread:
    """An actor coroutine on its own thread and event loop, in the learner's process.

    The learner's ``PipelineBatchSource`` takes ``health_fn=thread.check``, so a failed actor stops
    the learner with the actor's error instead of leaving it waiting for batches; ``stop`` cancels
    the coroutine (its ``finally`` blocks run) and joins the thread.
    """

    def __init__(self, make_coro: Callable[[], Awaitable[Any]], name: str = "ludic-overlap-actor") -> None:
        self.make_coro, self.name = make_coro, name
        self.error: BaseException | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._ready = threading.Event()
        self._stopping = False
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)

    def _main(self) -> None:
        loop = asyncio.new_event_loop()
        asyncio.set_event_loop(loop)
        self._loop = loop
        try:
            self._task = loop.create_task(self.make_coro())
            self._ready.set()
            loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            pass
        except BaseException as e:  # noqa: BLE001 - reported to the learner by check()
            self.error = e
            log.exception("in-process actor failed")
        finally:
            self._ready.set()
            try:  # as asyncio.run does: the engine's own tasks are cancelled and awaited, not dropped
                rest = asyncio.all_tasks(loop)
                for t in rest:
                    t.cancel()
                if rest:
                    loop.run_until_complete(asyncio.gather(*rest, return_exceptions=True))
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(loop.shutdown_default_executor())  # a push in flight finishes, logged
            finally:
                asyncio.set_event_loop(None)
                loop.close()

    def start(self) -> "ActorThread":
        self._thread.start()
        self._ready.wait()
        return self

    def check(self) -> None:
        """Raise if the actor failed or stopped while the learner still expects its batches."""
        if self.error is not None:
            raise RuntimeError(f"the in-process actor failed: {self.error!r}") from self.error
        if not self._thread.is_alive() and not self._stopping:
            raise RuntimeError("the in-process actor stopped before the learner finished")

    def stop(self, timeout_s: float = 120.0) -> None:
        """Cancel the actor and wait for its thread (the learner is done)."""
        self._stopping = True
        loop, task = self._loop, self._task
        if task is not None and loop is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed in between: the thread is ending anyway
                pass
        self._thread.join(timeout_s)
        if self._thread.is_alive():
            raise TimeoutError(f"the in-process actor thread did not stop within {timeout_s}s")


# --------------------------------------------------------------------------- learner


def make_learner(model: Any, tokenizer: Any, algorithm: Any, cfg: Any, streams: PipelineStreams, run_dir: str | Path,
                 *, batch_size: int, inner_publisher: Any = None, logger: Any = None,
                 timeout_s: float | None = None, weights_transport: str = "redis",
                 health_fn: Callable[[], None] | None = None) -> Any:
    """A ``Trainer`` over the sample stream: batches of ``batch_size`` episodes (``cfg.max_lag``
    drops stale ones), checkpoints in ``run_dir/checkpoints`` (each acknowledges its entries and
    appends to ``pipeline_ledger.jsonl`` there), weights announced after every publish.
    ``health_fn`` (e.g. ``ActorThread.check``) is called while a batch is awaited and may raise.
    One learner process only: its consumer name and acknowledgements assume a single reader."""
    from ludic.training.trainer import Trainer

    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if world > 1:
        raise RuntimeError(f"the pipeline runs one learner process (WORLD_SIZE={world}): the learner's consumer "
                           "name and its acknowledgements after each checkpoint assume a single reader of the "
                           "sample stream. Add actors to sample faster; to shard a large model, train it in one "
                           "learner with more memory or use the synchronous `ludic train` under torchrun")

    run_dir = Path(run_dir)
    ckpt = run_dir / "checkpoints"
    publisher = AnnouncingPublisher(streams, run_dir / "weights", inner=inner_publisher, transport=weights_transport)
    trainer = Trainer(model, algorithm, None, cfg, publisher=publisher, logger=logger, checkpoint_dir=ckpt,
                      tokenizer=tokenizer, pad_token_id=tokenizer.pad_token_id)
    vocab = model.get_input_embeddings().weight.shape[0]  # token ids at or above it are refused (wire)
    trainer.source = PipelineBatchSource(SampleReader(streams, consumer="learner", vocab_size=vocab), batch_size,
                                         version_fn=lambda: trainer.policy_version, max_lag=cfg.max_lag,
                                         ledger_path=ckpt / "pipeline_ledger.jsonl", timeout_s=timeout_s,
                                         health_fn=health_fn)
    return trainer
