"""The pipeline's wire format, Redis streams and learner source, against a real redis-server."""

import asyncio
import json
import pickle

import pytest

from ludic.pipeline.source import PipelineBatchSource, read_ledger
from ludic.pipeline.streams import SampleReader, SampleWriter
from ludic.pipeline.wire import SCHEMA, MalformedEntry, decode_item, encode_item
from ludic.types import SAWBatch, SAWItem


def item(k: int, version: int = 0, n: int = 3, share: float = 1.0) -> SAWItem:
    return SAWItem(prompt_ids=(1, 2, k), completion_ids=tuple(range(10, 10 + n)), weight=0.5 * k,
                   logprobs=tuple(-0.25 * i for i in range(n)), policy_versions=(version,) * n,
                   meta={"rollout_id": f"r{k}", "reward": 1.0, "total_reward": float(k)}, action_mask=(1,) * (n - 1) + (0,),
                   token_weights=(0.5 * k,) * n, episode_share=share, temperature=0.7, top_k=5)


def test_wire_round_trip_and_malformed_entries():
    it = item(3, version=7, share=0.5)
    back = decode_item(encode_item(it))
    assert back == it
    bare = SAWItem(prompt_ids=(1,), completion_ids=(2, 3), weight=1.0)
    assert decode_item(encode_item(bare)) == bare
    assert decode_item({k.decode(): v for k, v in encode_item(it).items()}) == it  # str keys too

    good = encode_item(it)
    broken = {
        "schema": {**good, b"schema": b"ludic.saw/0"},
        "head": {**good, b"head": b"{not json"},
        "pickle": {b"schema": SCHEMA, b"head": pickle.dumps({"arrays": []})},
        "missing array": {k: v for k, v in good.items() if k != b"logprobs"},
        "odd bytes": {**good, b"completion_ids": good[b"completion_ids"][:-1]},
        "unknown array": {**good, b"head": json.dumps({**json.loads(good[b"head"]),
                                                        "arrays": ["prompt_ids", "evil"]}).encode()},
        "lengths": {**good, b"logprobs": good[b"logprobs"][:4]},
    }
    for name, fields in broken.items():
        with pytest.raises(MalformedEntry):
            decode_item(fields)
        print(name, "->", "MalformedEntry")


def test_backpressure_never_trims(streams):
    """A writer waits while max_unread entries are undelivered; nothing is ever trimmed."""
    writer = SampleWriter(streams, max_unread=3, poll_s=0.01)
    reader = SampleReader(streams)
    ids = writer.push([item(k) for k in range(3)])
    assert streams.unread() == 3 and not writer.wait_for_room(timeout_s=0.2)
    got = reader.read(2)
    assert [i for i, _ in got] == ids[:2] and streams.unread() == 1
    assert writer.wait_for_room(timeout_s=1.0)
    ids += writer.push([item(k) for k in range(3, 8)], wait=False)
    assert streams.redis.xlen(streams.samples) == 8 and streams.all_ids() == ids
    assert streams.pending_ids() == ids[:2]


def test_a_restarted_reader_gets_its_pending_entries_first(streams):
    writer = SampleWriter(streams, max_unread=100)
    ids = writer.push([item(k) for k in range(6)])
    first = SampleReader(streams)
    assert [i for i, _ in first.read(4)] == ids[:4]
    first.ack(ids[:1])
    again = SampleReader(streams)  # a new process of the same learner
    got = [i for i, _ in again.read(2)] + [i for i, _ in again.read(2)] + [i for i, _ in again.read(10)]
    assert got == ids[1:]  # pending (unacked) ones first, in order, then the undelivered


def test_weight_announcements(streams):
    assert streams.latest_weights() is None
    assert streams.wait_weights(block_ms=50) is None
    first = streams.announce_weights(1, {"adapter": "/w/v1"})
    streams.announce_weights(2, {"adapter": "/w/v2"})
    version, info, entry = streams.latest_weights()
    assert version == 2 and info == {"adapter": "/w/v2"}
    assert streams.wait_weights(after=first, block_ms=50)[:2] == (2, {"adapter": "/w/v2"})
    assert streams.wait_weights(after=entry, block_ms=50) is None


def _poisoned(field, value):
    """A well-formed entry with one field's value replaced (arrays re-encoded in their wire dtype)."""
    import numpy as np

    from ludic.pipeline.wire import _ARRAYS

    good = encode_item(item(3, version=7))
    head = json.loads(good[b"head"])
    if field in _ARRAYS:
        return {**good, field.encode(): np.asarray(value, dtype=_ARRAYS[field]).tobytes()}
    if field.startswith("meta."):  # one field of the item's meta
        head["meta"][field[len("meta."):]] = value
    else:
        head[field] = value
    return {**good, b"head": json.dumps(head).encode()}


POISON = {  # field, value -> the word the error names
    "NaN weight": ("weight", float("nan"), "weight"),
    "infinite weight": ("weight", float("inf"), "weight"),
    "NaN log-prob": ("logprobs", [float("nan"), -0.25, -0.5], "logprobs"),
    "positive log-prob": ("logprobs", [0.5, -0.25, -0.5], "logprobs"),
    "NaN token weight": ("token_weights", [1.0, float("inf"), 1.0], "token_weights"),
    "id over the vocabulary": ("completion_ids", [10, 11, 50_000], "completion_ids"),
    "negative id": ("prompt_ids", [1, -2, 3], "prompt_ids"),
    "empty prompt": ("prompt_ids", [], "prompt_ids"),
    "empty completion": ("completion_ids", [], "completion_ids"),
    "mask of 2": ("action_mask", [1, 2, 0], "action_mask"),
    "nothing trained": ("action_mask", [0, 0, 0], "action_mask"),
    "top_p 0": ("top_p", 0.0, "top_p"),
    "negative top_k": ("top_k", -1, "top_k"),
    "NaN episode share": ("episode_share", float("nan"), "episode_share"),
    "meta not an object": ("meta", [1, 2], "meta"),
    # the meta fields the learner reads: an actor's string once crashed the learner's batch (and every restart)
    "string filtered tokens": ("meta.filtered_tokens_per_token", "1.5", "filtered_tokens_per_token"),
    "negative filtered tokens": ("meta.filtered_tokens_per_token", -1.0, "filtered_tokens_per_token"),
    "zero-variance share over 1": ("meta.zero_var_group_share", 1.5, "zero_var_group_share"),
    "NaN total reward": ("meta.total_reward", float("nan"), "total_reward"),
    "list reward": ("meta.reward", [1.0], "reward"),
    "string value target": ("meta.value_target", "0.3", "value_target"),
    "boolean value_old": ("meta.value_old", True, "value_old"),
    "parse_error as a string": ("meta.parse_error", "false", "parse_error"),
    "fractional step index": ("meta.step_index", 1.5, "step_index"),
    "numeric rollout id": ("meta.rollout_id", 7, "rollout_id"),
}


@pytest.mark.parametrize("name", list(POISON))
def test_poisoned_entries_are_malformed_naming_the_field(name):
    field, value, word = POISON[name]
    with pytest.raises(MalformedEntry, match=word):
        decode_item(_poisoned(field, value), vocab_size=49152)


async def test_a_poisoned_entry_is_skipped_counted_and_acked_not_trained(streams, tmp_path):
    """A NaN weight once passed the shape checks and crashed the learner's step; being unacknowledged,
    it was read first again after every restart. Now it is malformed: skipped, counted, acknowledged."""
    writer = SampleWriter(streams, max_unread=100)
    bad = writer.push_raw(_poisoned("weight", float("nan")))
    good = writer.push([item(k, version=0) for k in range(2)])
    source = PipelineBatchSource(SampleReader(streams, vocab_size=49152), batch_size=2, ledger_path=tmp_path / "l.jsonl")
    b = await source.next_batch()
    assert [it.meta["rollout_id"] for it in b.items] == ["r0", "r1"] and b.meta["pipeline_malformed"] == 1
    source.on_checkpoint()
    assert streams.pending_ids() == [] and read_ledger(tmp_path / "l.jsonl")["malformed"] == {bad}
    assert set(good) == read_ledger(tmp_path / "l.jsonl")["trained"]


async def test_a_bad_meta_field_is_malformed_not_a_crash_loop(streams, tmp_path):
    """An actor's item with ``meta["filtered_tokens_per_token"] = "1.5"`` (a string) decoded, then crashed the
    learner's batch (``str * int``); unacknowledged, it was read first again after every restart. Now its meta is
    checked like its other fields: the entry is malformed (named in the error), skipped, counted and acknowledged,
    and a restarted learner reads on past it."""
    writer = SampleWriter(streams, max_unread=100)
    bad = writer.push_raw(_poisoned("meta.filtered_tokens_per_token", "1.5"))
    good = writer.push([item(k) for k in range(2)])
    source = PipelineBatchSource(SampleReader(streams, vocab_size=49152), batch_size=2, version_fn=lambda: 7,
                                 ledger_path=tmp_path / "l.jsonl")  # version 7: the poisoned item's (not stale)
    b = await source.next_batch()
    assert [it.meta["rollout_id"] for it in b.items] == ["r0", "r1"] and b.meta["pipeline_malformed"] == 1
    assert b.meta["filtered_action_tokens"] == 0.0 and b.meta["pipeline_stale_dropped"] == 0
    source.on_checkpoint()
    assert streams.pending_ids() == [] and read_ledger(tmp_path / "l.jsonl")["malformed"] == {bad}
    later = writer.push([item(5)])
    restarted = PipelineBatchSource(SampleReader(streams, vocab_size=49152), batch_size=1, version_fn=lambda: 7)
    assert [it.meta["rollout_id"] for it in (await restarted.next_batch()).items] == ["r5"]
    assert set(streams.all_ids()) == {bad, *good, *later}


async def test_source_drops_stale_and_malformed_and_acks_after_checkpoint(streams, tmp_path):
    """Accounting: produced = trained in checkpointed batches + stale + malformed + pending."""
    writer = SampleWriter(streams, max_unread=100)
    version = {"v": 5}
    fresh = writer.push([item(k, version=4) for k in range(4)])
    old = writer.push([item(9, version=1)])  # 4 versions behind: stale with max_lag 2
    bad = [writer.push_raw({b"schema": b"nope"})]
    late = writer.push([item(k, version=5) for k in range(3)])
    ledger = tmp_path / "ledger.jsonl"
    source = PipelineBatchSource(SampleReader(streams), batch_size=3, max_lag=2, version_fn=lambda: version["v"],
                                 ledger_path=ledger)
    b1 = await source.next_batch()
    b2 = await source.next_batch()
    assert [it.meta["rollout_id"] for it in b1.items] == ["r0", "r1", "r2"]
    assert b1.meta["reward_mean"] == pytest.approx(1.0)
    assert [it.meta["rollout_id"] for it in b2.items] == ["r3", "r0", "r1"]
    assert b2.meta["pipeline_stale_dropped"] == 1 and b2.meta["pipeline_malformed"] == 1
    assert streams.pending_ids() == fresh + old + bad + late[:2]  # nothing acked before a checkpoint
    state = source.state_dict()
    source.on_checkpoint()
    assert streams.pending_ids() == []
    consumed = read_ledger(ledger)
    assert consumed["trained"] == set(fresh + late[:2]) and consumed["stale"] == set(old)
    assert consumed["malformed"] == set(bad)
    produced = set(streams.all_ids())
    assert produced == consumed["trained"] | consumed["stale"] | consumed["malformed"] | set(late[2:])
    assert state["commit"] == 1 and source.totals == {"trained": 6, "stale": 1, "malformed": 1}

    # a crash between the checkpoint and its XACK: the resumed learner acks again, nothing twice
    more = writer.push([item(k, version=5) for k in range(2)])
    b = await source.next_batch()
    assert [it.meta["rollout_id"] for it in b.items] == ["r2", "r0", "r1"]
    mid = source.state_dict()
    assert streams.pending_ids() == late[2:] + more
    resumed = PipelineBatchSource(SampleReader(streams), batch_size=1, version_fn=lambda: 5, ledger_path=ledger)
    resumed.load_state_dict(mid)  # the checkpoint was written, the ack never happened
    assert streams.pending_ids() == [] and resumed.commit == 2
    assert [json.loads(x)["commit"] for x in ledger.read_text().splitlines()] == [1, 2]
    resumed.load_state_dict(mid)  # idempotent: no second ledger line
    assert len(ledger.read_text().splitlines()) == 2


async def test_a_batch_holds_episodes_not_items(streams):
    """Per-turn items count as their share of an episode: a batch of 2 episodes is 4 half-items."""
    SampleWriter(streams).push([item(k, share=0.5) for k in range(6)])
    b = await PipelineBatchSource(SampleReader(streams), batch_size=2).next_batch()
    assert len(b.items) == 4 and streams.unread() == 2


async def test_the_learner_reports_the_zero_variance_group_share_its_actors_saw(streams):
    """No silent non-learning in the pipeline either: each item carries its actor batch's
    ``zero_var_group_share`` (an actor may filter flat groups' items out before pushing), and the learner's
    batch reports their episode-weighted mean, as a synchronous run's batch source does."""
    flat, mixed = item(1, share=0.5), item(2, share=1.0)
    flat.meta["zero_var_group_share"], mixed.meta["zero_var_group_share"] = 1.0, 0.25
    SampleWriter(streams).push([flat, flat, mixed, item(3)])  # the last from an actor with no such stat
    b = await PipelineBatchSource(SampleReader(streams), batch_size=3).next_batch()
    assert len(b.items) == 4
    assert b.meta["zero_var_group_share"] == pytest.approx((0.5 * 1.0 + 0.5 * 1.0 + 1.0 * 0.25) / 2.0)


async def test_the_learner_counts_the_tokens_its_actors_sample_filters_dropped(streams):
    """An actor's sample filter (drop_zero_weight) removes zero-advantage items before the push; each pushed
    item carries its batch's dropped tokens per kept token, so the learner's batch meta has
    ``filtered_action_tokens`` for scale_lr_by_signal, as a synchronous run's batch source does."""
    from ludic.pipeline.actor import stamped_items

    # actor 0 kept 2 items (2 action tokens each) and dropped 6 tokens; actor 1 dropped nothing
    pushed = stamped_items(SAWBatch([item(1), item(2)], {"filtered_action_tokens": 6}), "a0") + \
        stamped_items(SAWBatch([item(3)], {"filtered_action_tokens": 0}), "a1")
    assert [it.meta.get("filtered_tokens_per_token") for it in pushed] == [1.5, 1.5, None]
    SampleWriter(streams).push(pushed)
    b = await PipelineBatchSource(SampleReader(streams), batch_size=3).next_batch()
    assert len(b.items) == 3 and b.meta["filtered_action_tokens"] == pytest.approx(6.0)


async def test_source_times_out_without_actors(streams):
    source = PipelineBatchSource(SampleReader(streams), batch_size=2, block_ms=50, timeout_s=0.3)
    with pytest.raises(TimeoutError, match="0 of 2 episodes"):
        await source.next_batch()


async def test_a_waiting_learner_says_why(streams, caplog):
    """No actor ever seen; an actor alive but failing to load weights; an actor gone quiet: the wait
    ends (or, without a timeout, logs) with what the actors' heartbeats in Redis say."""
    import logging

    from ludic.pipeline.streams import ActorStatus

    source = PipelineBatchSource(SampleReader(streams), batch_size=2, block_ms=50, timeout_s=0.3)
    with pytest.raises(TimeoutError, match="no actor has reported"):
        await source.next_batch()
    status = ActorStatus(streams, "a0")
    status.beat(version=3, pushed=8, error="KeyError: 'f:weights:v0000005' is gone from Redis")
    with pytest.raises(TimeoutError, match=r"a0 .*KeyError: 'f:weights:v0000005' is gone"):
        await source.next_batch()
    status.beat(version=3, pushed=8, t=0.0)  # last heard of at the epoch: long silent
    with pytest.raises(TimeoutError, match=r"a0: last heard .* ago"):
        await source.next_batch()
    quiet = PipelineBatchSource(SampleReader(streams), batch_size=2, block_ms=50, report_every_s=0.2)
    with caplog.at_level(logging.WARNING, logger="ludic.pipeline.source"):
        task = asyncio.ensure_future(quiet.next_batch())
        await asyncio.sleep(0.8)
        task.cancel()
    assert any("waiting" in r.message and "a0" in r.message for r in caplog.records)


def test_redis_kill_9_with_aof_always_loses_nothing(redis_server):
    """Entries, the group's pending list and acknowledgements survive kill -9 of Redis."""
    from ludic.pipeline.streams import PipelineStreams

    s = PipelineStreams(redis_server.url, prefix="k")
    ids = SampleWriter(s, max_unread=100).push([item(k) for k in range(10)])
    reader = SampleReader(s)
    reader.read(6)
    reader.ack(ids[:3])
    redis_server.kill()
    redis_server.start()
    s2 = PipelineStreams(redis_server.url, prefix="k")
    assert s2.all_ids() == ids and s2.pending_ids() == ids[3:6] and s2.unread() == 4
    again = SampleReader(s2)
    assert [i for i, _ in again.read(10)] == ids[3:6]
    assert [i for i, _ in again.read(10)] == ids[6:]


async def test_trainer_acks_only_checkpointed_steps_and_resume_trains_nothing_twice(streams, tiny_model_dir, tmp_path):
    """A real Trainer over the stream: entries of a checkpointed step are acknowledged after the
    checkpoint is on disk; those of a step after it stay pending and come back to a restarted
    learner, which resumes at the checkpoint's step."""
    from ludic.training.algorithms import make_algorithm
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer

    ids = SampleWriter(streams, max_unread=100).push(
        [SAWItem(prompt_ids=(5, 6, 7), completion_ids=(8, 9), weight=1.0 if k % 2 else -1.0, logprobs=(-1.0, -1.0),
                 policy_versions=(0, 0), meta={"rollout_id": f"r{k}"}) for k in range(6)])
    ckpt = tmp_path / "ckpt"

    def learner():
        model, tok = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
        cfg = TrainerConfig(lr=1e-3, checkpoint_every=2, max_lag=4)
        trainer = Trainer(model, make_algorithm("grpo"), None, cfg, checkpoint_dir=ckpt, tokenizer=tok,
                          pad_token_id=tok.pad_token_id)
        trainer.source = PipelineBatchSource(SampleReader(streams), batch_size=2, ledger_path=ckpt / "ledger.jsonl",
                                             version_fn=lambda: trainer.policy_version, max_lag=4)
        return trainer

    t = learner()
    await t.train_step()
    assert streams.pending_ids() == ids[:2]  # trained, not checkpointed: still pending
    await t.train_step()  # step 2: checkpoint, then XACK
    assert streams.pending_ids() == [] and read_ledger(ckpt / "ledger.jsonl")["trained"] == set(ids[:4])
    await t.train_step()  # step 3 is lost in the crash below
    assert streams.pending_ids() == ids[4:]

    restarted = learner()
    assert restarted.resume() and restarted.step == 2
    m = await restarted.train_step()  # retrains step 3 from the pending entries
    assert restarted.step == 3 and m["num_items"] == 2 and streams.pending_ids() == ids[4:]
    assert read_ledger(ckpt / "ledger.jsonl")["trained"] == set(ids[:4])


@pytest.mark.parametrize("transport", ["redis", "path"])
def test_announced_weights_load_into_an_actor_model(streams, tiny_model_dir, tmp_path, transport):
    """AnnouncingPublisher stores an adapter (in Redis or a folder) and announces it; an actor's
    model loads it and then has the learner's weights; Redis keeps the last keep_last versions."""
    import torch

    from ludic.pipeline.actor import AnnouncingPublisher, load_weights
    from ludic.training.lora import LoraSettings, load_policy

    learner, _ = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=0)
    actor, _ = load_policy(str(tiny_model_dir), lora=LoraSettings(rank=4, alpha=8), dtype="float32", seed=1)
    with torch.no_grad():
        for n, p in learner.named_parameters():
            if "lora_B" in n:
                p.normal_()
    pub = AnnouncingPublisher(streams, tmp_path / "w", transport=transport, keep_last=2)
    for v in (1, 2, 3):
        pub.publish(learner, v)
    version, info, _ = streams.latest_weights()
    assert version == 3 and info["kind"] == "adapter" and (("key" in info) == (transport == "redis"))
    load_weights(actor, info, streams)
    mine = dict(actor.named_parameters())
    for n, p in learner.named_parameters():
        if "lora_" in n:
            assert torch.equal(p, mine[n]), n
    if transport == "redis":
        assert sorted(k.decode() for k in streams.redis.scan_iter(match="t:weights:v*")) == \
            ["t:weights:v0000002", "t:weights:v0000003"]


async def test_an_actor_whose_weights_fail_to_load_stops_with_the_error(streams):
    """A weight announcement the actor cannot apply ends the actor with that error (it would
    otherwise keep pushing samples of ever older weights)."""
    from ludic.pipeline.actor import Actor
    from ludic.types import SAWBatch

    class Engine:  # test double: only the swap hook matters here
        policy_version = 0

        async def swap_weights(self, load, version):
            load()

    class Source:
        async def next_batch(self):
            await asyncio.sleep(0.05)
            return SAWBatch(items=[item(0)])

    actor = Actor(streams, Source(), Engine(), model=object(), max_unread=1000)
    streams.announce_weights(0, {"kind": "full", "key": "t:weights:v0000000"})  # key absent: KeyError
    with pytest.raises(KeyError, match="gone from Redis"):
        await asyncio.wait_for(actor.run(first_weights_timeout_s=5), 10)  # at the first weights

    async def bad_later():
        await asyncio.sleep(0.5)
        streams.announce_weights(2, {"kind": "full", "key": "t:weights:v0000002"})

    streams.announce_weights(1, {"kind": "server"})  # fine: the engine only takes the version
    actor = Actor(streams, Source(), Engine(), model=object(), max_unread=1000)
    later = asyncio.create_task(bad_later())
    with pytest.raises(KeyError, match="gone from Redis"):  # from the follower, mid-run
        await asyncio.wait_for(actor.run(first_weights_timeout_s=5), 10)
    await later
    assert actor.pushed > 0


def test_local_redis_is_loopback_and_protected(tmp_path):
    from ludic.pipeline.redis_server import RedisServer

    with RedisServer(tmp_path / "r") as server:
        import redis

        c = redis.Redis(host="127.0.0.1", port=server.port)
        assert c.config_get("bind")["bind"] == "127.0.0.1" and c.config_get("protected-mode")["protected-mode"] == "yes"


def test_a_redis_beyond_loopback_needs_a_password_never_on_the_command_line(tmp_path, monkeypatch):
    import redis

    from ludic.pipeline.redis_server import RedisServer
    from ludic.pipeline.streams import PipelineStreams

    monkeypatch.delenv("LUDIC_REDIS_PASSWORD", raising=False)
    monkeypatch.delenv("LUDIC_REDIS_PASSWORD_FILE", raising=False)
    with pytest.raises(ValueError, match="LUDIC_REDIS_PASSWORD"):
        RedisServer(tmp_path / "r", host="0.0.0.0")
    secret = tmp_path / "pw"
    secret.write_text("s3cret-pass\n")
    monkeypatch.setenv("LUDIC_REDIS_PASSWORD_FILE", str(secret))
    with RedisServer(tmp_path / "r", host="0.0.0.0") as server:
        argv = open(f"/proc/{server.proc.pid}/cmdline", "rb").read().decode(errors="replace")
        assert "s3cret-pass" not in argv
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(host="127.0.0.1", port=server.port).ping()
        streams = PipelineStreams(server.url, prefix="pw")  # the client reads the same variable
        streams.ensure_group()
        assert streams.redis.ping() and "s3cret" not in server.url


def test_the_pipeline_learner_refuses_several_ranks(streams, monkeypatch):
    """Its consumer name and acknowledgements assume one learner process: under torchrun it says so."""
    from ludic.pipeline.actor import make_learner

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(RuntimeError, match="one learner process"):
        make_learner(None, None, None, None, streams, "/nonexistent", batch_size=4)


def test_an_in_process_actor_waiting_for_room_stops_when_asked(streams):
    """``ActorThread.stop`` ends an actor that waits for the learner to make room (the learner has
    finished, so room never comes): the wait gives up on cancel instead of holding the executor
    shutdown, and the process, forever (it hung ``--overlap`` at its end)."""
    import time

    from ludic.pipeline.actor import Actor, ActorThread
    from ludic.types import SAWBatch

    class Engine:  # test double: only the version and the swap hook matter here
        policy_version = 0

        async def swap_weights(self, load, version):
            load()

    class Source:
        async def next_batch(self):
            return SAWBatch(items=[item(0)])

    streams.announce_weights(0, {"kind": "server"})
    actor = Actor(streams, Source(), Engine(), model=object(), max_unread=2)
    thread = ActorThread(lambda: actor.run(first_weights_timeout_s=5)).start()
    deadline = time.time() + 20
    while streams.unread() < 2 and time.time() < deadline:  # full: the actor now waits for room
        time.sleep(0.05)
    assert streams.unread() == 2
    time.sleep(0.3)
    t0 = time.time()
    thread.stop(timeout_s=10)
    assert time.time() - t0 < 10 and actor.pushed == 2
