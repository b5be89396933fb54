"""The learner's BatchSource over the Redis sample stream, with acknowledgement after checkpoint.

    source = PipelineBatchSource(SampleReader(streams), batch_size=32, max_lag=2,
                                 version_fn=lambda: trainer.policy_version,
                                 ledger_path=ckpt_dir / "pipeline_ledger.jsonl")
    trainer = Trainer(model, algo, source, cfg, checkpoint_dir=ckpt_dir)
    trainer.resume()            # acks the resumed checkpoint's entries again (a crash may have hit
                                # between the checkpoint and its XACK), so none is trained twice
    await trainer.train(1000)   # each checkpoint on disk -> XACK of every entry it consumed

Every entry read is, by the next checkpoint, one of: trained (in a batch of a checkpointed
step), dropped as stale (its oldest sampled token more than ``max_lag`` versions behind the
learner), or dropped as malformed (counted and logged with its id). The checkpoint's source
state holds that window's ids; after the checkpoint is on disk they are acknowledged and
appended to the ledger (one JSON line per checkpoint). Entries read after the last checkpoint
stay pending in Redis: a learner killed before its next checkpoint gets them back on restart
and trains them in the steps it redoes.
"""

from __future__ import annotations

import asyncio
import json
import math
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

from ludic.pipeline.streams import SampleReader, describe_actors
from ludic.pipeline.wire import MalformedEntry
from ludic.types import SAWBatch, SAWItem

log = logging.getLogger(__name__)


def _empty_window() -> dict[str, list]:
    return {"batches": [], "stale": [], "malformed": []}


class PipelineBatchSource:
    """Batches of ``batch_size`` episodes' worth of items pulled from the sample stream.

    Args:
        reader: the learner's ``SampleReader``.
        batch_size: episodes per batch (the trainer's step): an item counts as its
            ``episode_share`` (1 for a whole episode, 1/n for each of an episode's n per-turn items),
            so a batch holds as many episodes as a synchronous step of the same size.
        version_fn: the learner's current policy version (for ``max_lag``).
        max_lag: drop items whose oldest sampled token is more than this many versions
            behind (None: keep all). Items from versions ahead of the learner (sampled with
            weights a learner announced and then died before checkpointing) are dropped too.
        block_ms: how long one read waits for new entries.
        timeout_s: give up (TimeoutError, saying what the actors' heartbeats say) when a batch is
            not complete after this long (None: wait for the actors forever).
        report_every_s: while a batch waits, log what the actors' heartbeats say this often.
        ledger_path: JSONL of what each checkpoint consumed (None: no ledger).
        health_fn: called before every read while a batch is incomplete; raises when the producer
            is known to be dead (an in-process actor thread), so the learner fails instead of waiting.
    """

    def __init__(self, reader: SampleReader, batch_size: int, *, version_fn: Callable[[], int] = lambda: 0,
                 max_lag: int | None = None, block_ms: int = 500, timeout_s: float | None = None,
                 ledger_path: str | Path | None = None, health_fn: Callable[[], None] | None = None,
                 report_every_s: float = 60.0) -> None:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.reader, self.batch_size, self.version_fn = reader, batch_size, version_fn
        self.max_lag, self.block_ms, self.timeout_s = max_lag, block_ms, timeout_s
        self.report_every_s = report_every_s
        self.ledger_path = Path(ledger_path) if ledger_path else None
        self.health_fn = health_fn
        self.window = _empty_window()
        self.commit = 0  # checkpoints whose entries were acknowledged
        self._ledger: tuple[int, bool] | None = None  # (last commit in the ledger, torn tail), once read
        self.totals = {"trained": 0, "stale": 0, "malformed": 0}
        self.discarded: list[tuple[int, int]] = []
        """Version ranges [lo, hi] whose weights are gone (announced by a learner that died before
        checkpointing them; ``discard_versions``): an item with a token from one is stale."""

    def discard_versions(self, lo: int, hi: int) -> None:
        """Versions ``lo``..``hi`` name weights this learner does not have (see ``discarded``)."""
        if lo <= hi:
            self.discarded.append((int(lo), int(hi)))
            log.warning("pipeline: versions %d-%d were announced by a learner that died before checkpointing "
                        "them; what they sampled is dropped as stale", lo, hi)

    def _discarded(self, item: SAWItem) -> bool:
        return bool(self.discarded and item.policy_versions) and any(
            lo <= v <= hi for v in set(item.policy_versions) for lo, hi in self.discarded)

    async def next_batch(self) -> SAWBatch:
        t0 = time.perf_counter()
        items: list[SAWItem] = []
        ids: list[str] = []
        stale: list[str] = []
        malformed: list[str] = []
        lags: list[int] = []
        episodes = 0.0
        reported = t0
        while episodes < self.batch_size - 1e-9:
            waited = time.perf_counter() - t0
            if self.timeout_s is not None and waited > self.timeout_s:
                raise TimeoutError(f"PipelineBatchSource: {episodes:g} of {self.batch_size} episodes after "
                                   f"{self.timeout_s}s. Actors: {describe_actors(self.reader.streams)}")
            if time.perf_counter() - reported > self.report_every_s:
                reported = time.perf_counter()
                log.warning("pipeline: waiting %.0f s for a batch (%g of %d episodes). Actors: %s", waited,
                            episodes, self.batch_size, describe_actors(self.reader.streams))
            if self.health_fn is not None:
                self.health_fn()
            want = max(1, math.floor(self.batch_size - episodes))  # never more than the batch still needs
            rows = await asyncio.to_thread(self.reader.read, want, self.block_ms)
            version = self.version_fn()
            for entry_id, x in rows:
                if isinstance(x, MalformedEntry):
                    malformed.append(entry_id)
                    log.warning("pipeline: skipping malformed entry %s: %s", entry_id, x)
                    continue
                oldest = x.min_policy_version
                lag = 0 if oldest is None else version - oldest
                if lag < 0 or (self.max_lag is not None and lag > self.max_lag) or self._discarded(x):
                    # lag < 0 or discarded: from weights a learner announced and died before checkpointing
                    stale.append(entry_id)
                    continue
                lags.append(lag)
                items.append(x)
                ids.append(entry_id)
                episodes += x.episode_share
        self.window["batches"].append(ids)
        self.window["stale"] += stale
        self.window["malformed"] += malformed
        self.totals["trained"] += len(ids)
        self.totals["stale"] += len(stale)
        self.totals["malformed"] += len(malformed)
        seen = len(ids) + len(stale) + len(malformed)
        rewarded = [(it.meta["total_reward"], it.episode_share) for it in items
                    if isinstance(it.meta.get("total_reward"), (int, float))]
        meta = {"num_items": len(items), "pipeline_wait_s": time.perf_counter() - t0,
                "pipeline_stale_share": len(stale) / max(seen, 1), "pipeline_stale_dropped": len(stale),
                "pipeline_malformed": len(malformed), "pipeline_lag_mean": sum(lags) / max(len(lags), 1),
                "pipeline_lag_max": max(lags, default=0), "pipeline_unread": self.reader.streams.unread()}
        if rewarded:  # the episodes' mean reward, as RolloutBatchSource reports it
            meta["reward_mean"] = sum(r * w for r, w in rewarded) / sum(w for _, w in rewarded)
        flat = [(it.meta["zero_var_group_share"], it.episode_share) for it in items
                if isinstance(it.meta.get("zero_var_group_share"), (int, float))]
        if flat:  # stamped by the actors (their batch's share: flat groups' items may be filtered out there)
            meta["zero_var_group_share"] = sum(z * w for z, w in flat) / sum(w for _, w in flat)
        # what the actors' sample filters dropped beside these items (a batch filtered whole is not counted)
        meta["filtered_action_tokens"] = sum(it.meta.get("filtered_tokens_per_token", 0.0) * it.num_action_tokens
                                             for it in items)
        return SAWBatch(items=items, meta=meta)

    # ------------------------------------------------------------ checkpointing
    def state_dict(self) -> dict[str, Any]:
        """What this checkpoint consumed since the previous one (acknowledged once it is on disk)."""
        return {"commit": self.commit + 1, "window": self.window, "totals": dict(self.totals),
                "discarded": [list(r) for r in self.discarded]}

    def on_checkpoint(self, path: Path | None = None) -> None:
        """The checkpoint holding ``state_dict()`` is on disk: acknowledge its entries."""
        self._commit(self.commit + 1, self.window)
        self.window = _empty_window()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume: acknowledge again (idempotent) the checkpoint's entries and every entry the ledger
        records as consumed, so no lost XACK (a crash between a checkpoint and its XACK, or an XACK
        Redis never got) makes the learner train an entry twice: the pending list a restarted
        reader gets first then holds only what no checkpoint consumed."""
        self.totals = dict(state.get("totals", self.totals))
        self.discarded = [(int(lo), int(hi)) for lo, hi in state.get("discarded", [])]
        self.window = _empty_window()
        self._commit(int(state["commit"]), state["window"])
        if self.ledger_path is not None and self.ledger_path.exists():
            consumed = read_ledger(self.ledger_path)
            ids = sorted(consumed["trained"] | consumed["stale"] | consumed["malformed"])
            for s in range(0, len(ids), 1000):
                self.reader.ack(ids[s:s + 1000])

    def _commit(self, commit: int, window: dict[str, list]) -> None:
        ids = [i for b in window["batches"] for i in b] + window["stale"] + window["malformed"]
        if os.environ.get("LUDIC_FAULT_DROP_ACK") != str(commit):  # test hook: this commit's XACK is lost
            self.reader.ack(ids)
        if self.ledger_path is not None:
            if self._ledger is None:  # read the ledger once per process, then track it here
                self._ledger = self._scan_ledger()
            last, torn = self._ledger
            if commit > last:
                self.ledger_path.parent.mkdir(parents=True, exist_ok=True)
                with open(self.ledger_path, "a") as f:
                    f.write(("\n" if torn else "") + json.dumps({"commit": commit, **window}) + "\n")
                    f.flush()
                self._ledger = (commit, False)
        self.commit = commit

    def _scan_ledger(self) -> tuple[int, bool]:
        """(the last complete commit in the ledger, whether the file ends in a torn line)."""
        assert self.ledger_path is not None
        if not self.ledger_path.exists():
            return 0, False
        data = self.ledger_path.read_bytes()
        torn = not data.endswith(b"\n")
        for line in reversed(data.decode(errors="replace").splitlines()):
            try:
                return int(json.loads(line)["commit"]), torn
            except (ValueError, KeyError, TypeError):
                continue  # a torn line (a kill in the middle of a write)
        return 0, torn


def read_ledger(path: str | Path) -> dict[str, set[str]]:
    """The ids a learner's ledger says it consumed: trained, stale and malformed (a torn last line,
    from a kill in the middle of a write, is skipped: that commit is re-written on resume)."""
    out: dict[str, set[str]] = {"trained": set(), "stale": set(), "malformed": set()}
    for line in Path(path).read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue  # torn
        out["trained"].update(i for b in rec["batches"] for i in b)
        out["stale"].update(rec["stale"])
        out["malformed"].update(rec["malformed"])
    return out
