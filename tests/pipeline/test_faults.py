"""Pipeline RL fault tests against real processes: a redis-server, actor and learner processes
(``ludic actor tictactoe`` / ``ludic learner tictactoe`` on the tiny model), kill -9.

Every test checks the ids from independent sources: the actors' logs, Redis (XRANGE, XPENDING,
the group's undelivered entries) and the learner's ledger (written with its checkpoints):
produced = trained in checkpointed steps + stale + malformed + pending + undelivered, no id
trained twice, none missing.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from ludic.pipeline.source import read_ledger
from ludic.pipeline.streams import PipelineStreams, SampleWriter
from ludic.pipeline.wire import decode_item
from ludic.tictactoe.train import TrainTicTacToeConfig
from ludic.tictactoe.pipeline import cli_args, spawn_actor
from ludic.training.config import TrainerConfig

pytestmark = pytest.mark.timeout(600)


def config(tiny_model_dir: Path, redis_url: str, run_dir: Path, steps: int) -> TrainTicTacToeConfig:
    return TrainTicTacToeConfig(
        model=str(tiny_model_dir), redis_url=redis_url, stream_prefix="f", run_dir=str(run_dir), train_steps=steps,
        group_size=2, rollouts_per_update=4, max_completion_tokens=6, concurrency=8, logger="none", dtype="float32",
        max_unread=12, batch_timeout_s=240, eval_episodes=0, behavior_is="token_truncate",
        # the tiny random model never plays a legal move: every reward is the same, which the trainer would
        # (rightly) stop on after max_no_signal_steps; these tests exercise the plumbing, not learning
        trainer=TrainerConfig(lr=1e-4, checkpoint_every=2, max_lag=3, max_to_keep=2, max_no_signal_steps=0))


def spawn_learner(cfg: TrainTicTacToeConfig, env: dict[str, str] | None = None) -> subprocess.Popen:
    run_dir = Path(cfg.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    log = open(run_dir / "learner.log", "ab")
    return subprocess.Popen([sys.executable, "-m", "ludic", "learner", "tictactoe", *cli_args(cfg)],
                            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **(env or {})})


def wait_for(cond, timeout_s: float, what: str, procs: list[subprocess.Popen] = ()) -> None:
    t0 = time.monotonic()
    while not cond():
        for p in procs:
            if p.poll() not in (None, 0):  # a capped actor may end normally
                raise AssertionError(f"{what}: process {p.args[3:5]} exited with {p.returncode}")
        if time.monotonic() - t0 > timeout_s:
            raise TimeoutError(f"{what} not within {timeout_s}s")
        time.sleep(0.2)


def ledger_commits(run_dir: Path) -> int:
    path = run_dir / "checkpoints" / "pipeline_ledger.jsonl"
    return len(path.read_text().splitlines()) if path.exists() else 0


def actor_logged_ids(root: Path) -> set[str]:
    out: set[str] = set()
    for log in root.rglob("actor-*.jsonl"):
        for line in log.read_text().splitlines():
            try:
                out.update(json.loads(line)["ids"])
            except ValueError:
                pass  # a line torn by kill -9
    return out


def audit(streams: PipelineStreams, run_dir: Path, actors_root: Path, malformed: set[str]) -> dict[str, set[str]]:
    """The accounting every fault test asserts; returns the sets."""
    produced = streams.all_ids()
    assert len(produced) == len(set(produced))
    produced_set = set(produced)
    ledger = read_ledger(run_dir / "checkpoints" / "pipeline_ledger.jsonl")
    trained_list = []
    for line in (run_dir / "checkpoints" / "pipeline_ledger.jsonl").read_text().splitlines():
        trained_list += [i for b in json.loads(line)["batches"] for i in b]
    assert len(trained_list) == len(set(trained_list)), "an id was trained twice"
    pending = set(streams.pending_ids())
    info = {_s(g["name"]): g for g in streams.redis.xinfo_groups(streams.samples)}[streams.group]
    last = _s(info["last-delivered-id"])
    undelivered = {i for i in produced if _key(i) > _key(last)}
    parts = [ledger["trained"], ledger["stale"], ledger["malformed"], pending, undelivered]
    assert sum(len(p) for p in parts) == len(set().union(*parts)), "an id is in two places"
    assert set().union(*parts) == produced_set, (
        f"missing {produced_set - set().union(*parts)}, unknown {set().union(*parts) - produced_set}")
    assert ledger["malformed"] == malformed and not (pending & malformed)
    logged = actor_logged_ids(actors_root)
    assert logged <= produced_set, "an actor logged an id Redis does not have"
    for i in produced_set - logged - malformed:  # pushed by an actor killed before its log line
        _, fields = streams.redis.xrange(streams.samples, min=i, max=i)[0]
        assert decode_item(fields).meta["actor"] == "a0"
    print(f"[audit] produced {len(produced_set)} = trained {len(ledger['trained'])} + stale {len(ledger['stale'])} + "
          f"malformed {len(ledger['malformed'])} + pending {len(pending)} + undelivered {len(undelivered)}; "
          f"trained twice: {len(trained_list) - len(set(trained_list))}")
    return {"produced": produced_set, "trained": ledger["trained"], "stale": ledger["stale"], "pending": pending,
            "undelivered": undelivered}


def _s(x):
    return x.decode() if isinstance(x, bytes) else x


def _key(entry_id: str) -> tuple[int, int]:
    ms, seq = entry_id.split("-")
    return int(ms), int(seq)


def test_actor_kill_9_mid_run_and_a_malformed_entry(redis_server, tiny_model_dir, tmp_path):
    """kill -9 one of two actors while it rolls out: the learner keeps training on the other; the
    restarted actor loads the newest weights and pushes again; a malformed entry is skipped,
    counted and logged with its id."""
    cfg = config(tiny_model_dir, redis_server.url, tmp_path / "learner", steps=12)
    streams = PipelineStreams(redis_server.url, prefix="f")
    learner = spawn_learner(cfg)
    # a1 stops after 2 batches (8 items). By the kill (after the first checkpoint, 8 trained) at most
    # 8 + 12 unread + a batch in flight per actor exist, so the learner's 48 need the restarted a0
    actors = {"a0": spawn_actor(cfg, "a0", tmp_path / "actors" / "a0"),
              "a1": spawn_actor(cfg, "a1", tmp_path / "actors" / "a1", batches=2)}
    bad = SampleWriter(streams).push_raw({b"schema": b"ludic.saw/1", b"head": b"{oops"})
    try:
        wait_for(lambda: ledger_commits(Path(cfg.run_dir)) >= 1, 300, "first checkpoint",
                 [learner, *actors.values()])
        actors["a0"].send_signal(signal.SIGKILL)
        actors["a0"].wait()
        killed_at = streams.latest_weights()[0]
        restart_t = time.time()
        actors["a0"] = spawn_actor(cfg, "a0", tmp_path / "actors" / "a0")
        learner.wait(timeout=400)
    finally:
        for p in actors.values():
            p.kill()
        learner.kill()
    log = (Path(cfg.run_dir) / "learner.log").read_text()
    assert learner.returncode == 0, log[-3000:]
    assert bad in log and "malformed" in log
    sets = audit(streams, Path(cfg.run_dir), tmp_path / "actors", {bad})
    assert len(sets["trained"]) == 12 * 4
    # the restarted a0 followed the weights: its pushes after the restart carry newer versions
    lines = [json.loads(x) for x in (tmp_path / "actors" / "a0" / "actor-a0.jsonl").read_text().splitlines()
             if x.strip().endswith("}")]
    restarted = [ln for ln in lines if ln["t"] > restart_t]
    assert restarted and all(min(ln["versions"]) >= killed_at for ln in restarted), lines


def crash_and_resume(cfg: TrainTicTacToeConfig, tmp_path: Path, fault_step: int, at_crash=None,
                     env: dict[str, str] | None = None) -> tuple[str, Any]:
    """One actor; a learner that dies (os._exit, exit 86) writing step ``fault_step``'s checkpoint, with
    ``env`` (more fault hooks); ``at_crash()`` (checks on the state the crash left; its result is
    returned); a second learner that resumes and finishes with exit 0, the actor still alive. Returns
    the learner log and what ``at_crash`` returned."""
    actor = spawn_actor(cfg, "a0", tmp_path / "actors" / "a0")
    try:
        first = spawn_learner(cfg, env={"LUDIC_FAULT_AT": "tmp_written", "LUDIC_FAULT_STEP": str(fault_step),
                                        **(env or {})})
        first.wait(timeout=400)
        assert first.returncode == 86, (Path(cfg.run_dir) / "learner.log").read_text()[-3000:]
        seen = at_crash() if at_crash is not None else None
        second = spawn_learner(cfg)
        second.wait(timeout=400)
        assert actor.poll() is None, "the actor exited"
    finally:
        actor.kill()
    log = (Path(cfg.run_dir) / "learner.log").read_text()
    assert second.returncode == 0, log[-3000:]
    return log, seen


def test_learner_kill_9_between_step_and_checkpoint(redis_server, tiny_model_dir, tmp_path):
    """The learner dies (kill -9 equivalent: os._exit) after step 4's optimizer step, with the
    checkpoint half written. Restarted, it resumes at step 2; the entries of steps 3-4 come back
    from the pending list; nothing acknowledged is trained twice, nothing is lost."""
    cfg = config(tiny_model_dir, redis_server.url, tmp_path / "learner", steps=6)
    streams = PipelineStreams(redis_server.url, prefix="f")

    def at_crash():
        assert ledger_commits(Path(cfg.run_dir)) == 1  # step 2's checkpoint
        pending = set(streams.pending_ids())
        assert len(pending) >= 8  # steps 3 and 4 were read, trained, never checkpointed
        return pending

    log, pending_after_crash = crash_and_resume(cfg, tmp_path, 4, at_crash)
    assert "resumed from step 2" in log, log[-3000:]
    sets = audit(streams, Path(cfg.run_dir), tmp_path / "actors", set())
    assert pending_after_crash <= sets["trained"] | sets["stale"]  # every one came back and was used
    assert len(sets["trained"]) == 6 * 4
    ckpt = json.loads((Path(cfg.run_dir) / "checkpoints" / "latest.json").read_text())
    assert "step_000006" in json.dumps(ckpt)


def test_learner_resumed_from_further_back_than_the_kept_weights(redis_server, tiny_model_dir, tmp_path):
    """The learner checkpoints every 5 steps and dies writing step 10's checkpoint: versions 6-10 were
    announced after the checkpoint it resumes from, more than the 3 weight keys Redis keeps. The
    resumed learner's weights must reach the actors (a key it just wrote was once deleted at once as
    the "oldest": the actors exited and the learner waited forever), and it must never reuse the
    numbers 6-10 for its own weights: items sampled by the dead learner's versions 6-10 are dropped as
    stale, not trained as if the new weights had made them."""
    cfg = config(tiny_model_dir, redis_server.url, tmp_path / "learner", steps=12)
    cfg = replace(cfg, batch_timeout_s=120, trainer=replace(cfg.trainer, checkpoint_every=5, max_lag=None))
    streams = PipelineStreams(redis_server.url, prefix="f")

    def at_crash():
        assert ledger_commits(Path(cfg.run_dir)) == 1
        return streams.latest_weights()[0]

    log, dead = crash_and_resume(cfg, tmp_path, 10, at_crash)
    assert dead == 10 and "resumed from step 5" in log, log[-3000:]
    versions = [json.loads(x)["policy_version"] for x in (Path(cfg.run_dir) / "metrics.jsonl").read_text().splitlines()
                if '"policy_version"' in x]
    assert versions[-7:] == list(range(dead + 2, dead + 9))  # steps 6-12 of the resumed run: 12..18, none reused
    sets = audit(streams, Path(cfg.run_dir), tmp_path / "actors", set())
    assert len(sets["trained"]) == 12 * 4
    for i in sets["trained"]:  # nothing the dead learner's versions 6-10 sampled was trained
        _, fields = streams.redis.xrange(streams.samples, min=i, max=i)[0]
        assert not set(decode_item(fields).policy_versions) & set(range(6, dead + 1)), i


def test_a_lost_xack_of_an_earlier_checkpoint_trains_nothing_twice(redis_server, tiny_model_dir, tmp_path):
    """The XACK of step 2's checkpoint is lost (``LUDIC_FAULT_DROP_ACK=1``: the ledger records the commit,
    Redis never hears of it), then the learner dies writing step 6's checkpoint. Resumed from step 4,
    its pending list still holds step 1-2's entries, which the ledger says were trained: they are
    acknowledged on resume, not trained again."""
    cfg = config(tiny_model_dir, redis_server.url, tmp_path / "learner", steps=8)
    cfg = replace(cfg, trainer=replace(cfg.trainer, max_lag=None))
    streams = PipelineStreams(redis_server.url, prefix="f")

    def at_crash():
        ledger = read_ledger(Path(cfg.run_dir) / "checkpoints" / "pipeline_ledger.jsonl")
        assert ledger["trained"] & set(streams.pending_ids()), "the fault hook dropped no XACK"

    log, _ = crash_and_resume(cfg, tmp_path, 6, at_crash, env={"LUDIC_FAULT_DROP_ACK": "1"})
    assert "resumed from step 4" in log, log[-3000:]
    sets = audit(streams, Path(cfg.run_dir), tmp_path / "actors", set())  # asserts no id trained twice
    assert len(sets["trained"]) == 8 * 4


def test_local_topology_command(redis_server, tiny_model_dir, tmp_path):
    """``ludic train tictactoe --pipeline 1`` runs Redis (here: the test's), an actor process and
    the learner, and stops the actor at the end."""
    cfg = replace(config(tiny_model_dir, redis_server.url, tmp_path / "run", steps=2), pipeline=1)
    out = subprocess.run([sys.executable, "-m", "ludic", "train", "tictactoe", *cli_args(cfg)],
                         capture_output=True, text=True, timeout=400)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    assert json.loads(out.stdout[out.stdout.index("{"):])["step"] == 2
    logged = [json.loads(x) for x in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    for key in ("pipeline_stale_share", "pipeline_lag_max", "zero_var_group_share", "filtered_action_tokens", "sampler_kl", "sampler_tokens", "is_weight_mean",
                "is_clip_frac", "policy_version"):
        assert all(key in m for m in logged), (key, logged[-1])
    # the in-process sampler and the learner score the same weights: their log-probs agree
    assert all(m["sampler_kl"] < 1e-3 for m in logged if m["sampler_tokens"] > 0), [m["sampler_kl"] for m in logged]
    assert (tmp_path / "run" / "actors" / "a0" / "actor-a0.jsonl").exists()


def test_overlap_in_one_process(redis_server, tiny_model_dir, tmp_path):
    """``--overlap``: the pipeline with max_lag 1 in one process. An actor thread (its own copy of the
    model) samples batch k+1 while the learner trains on batch k; every id is accounted for, the
    trained items are at most one version old, and the thread is gone at the end."""
    import threading

    from ludic.tictactoe.pipeline import run_local

    run_dir = tmp_path / "run"
    cfg = replace(config(tiny_model_dir, redis_server.url, run_dir, steps=3), overlap=True, stream_prefix="ov",
                  trainer=TrainerConfig(lr=1e-4, checkpoint_every=1, max_to_keep=2, max_no_signal_steps=0))
    out = run_local(cfg)
    assert out["step"] == 3
    assert not [t for t in threading.enumerate() if t.name == "ludic-overlap-actor"], "the actor thread outlived the run"
    logged = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [m["pipeline_lag_max"] for m in logged][0] == 0  # the first batch: the starting weights
    assert all(m["pipeline_lag_max"] <= 1 for m in logged)  # (whether a batch is 0 or 1 behind is a race)
    streams = PipelineStreams(redis_server.url, prefix="ov")
    sets = audit(streams, run_dir, run_dir / "actors", set())
    assert sets["trained"] and not sets["stale"]
    # one batch ahead at most: what the learner has not trained is at most one batch (+ one in flight)
    assert len(sets["pending"] | sets["undelivered"]) <= 2 * cfg.rollouts_per_update * 9


def test_a_failed_overlap_actor_stops_the_learner_with_its_error(redis_server):
    """The learner waiting for a batch does not hang on a dead actor thread: it raises the actor's error."""
    import asyncio

    from ludic.pipeline.actor import ActorThread
    from ludic.pipeline.source import PipelineBatchSource
    from ludic.pipeline.streams import SampleReader

    async def broken() -> None:
        await asyncio.sleep(0.1)
        raise ValueError("boom: the actor's model did not load")

    thread = ActorThread(broken).start()
    streams = PipelineStreams(redis_server.url, prefix="ov-dead")
    source = PipelineBatchSource(SampleReader(streams), 2, block_ms=100, health_fn=thread.check)
    with pytest.raises(RuntimeError, match="in-process actor failed.*boom"):
        asyncio.run(source.next_batch())
    thread.stop()


def test_redis_kill_9_mid_run(redis_server, tiny_model_dir, tmp_path):
    """kill -9 Redis while an actor and the learner run; restart it on the same AOF (appendfsync
    always): both wait for it (client retries) and go on; nothing acknowledged or pending is lost."""
    cfg = config(tiny_model_dir, redis_server.url, tmp_path / "learner", steps=8)
    streams = PipelineStreams(redis_server.url, prefix="f")
    learner = spawn_learner(cfg)
    actor = spawn_actor(cfg, "a0", tmp_path / "actors" / "a0")
    try:
        wait_for(lambda: ledger_commits(Path(cfg.run_dir)) >= 1, 300, "first checkpoint", [learner, actor])
        before = set(streams.all_ids())
        pending = set(streams.pending_ids())
        redis_server.kill()
        time.sleep(2.0)  # both processes now retry against a dead Redis
        redis_server.start()
        after = set(streams.all_ids())
        assert before <= after and pending <= set(streams.pending_ids()) | set(read_ledger(
            Path(cfg.run_dir) / "checkpoints" / "pipeline_ledger.jsonl")["trained"])
        learner.wait(timeout=400)
    finally:
        actor.kill()
        learner.kill()
    assert learner.returncode == 0, (Path(cfg.run_dir) / "learner.log").read_text()[-3000:]
    sets = audit(streams, Path(cfg.run_dir), tmp_path / "actors", set())
    assert len(sets["trained"]) == 8 * 4


class _Namespaces:
    """Two network namespaces, each joined to the host by its own veth pair and subnet; the host
    (Redis) is 10.<n>.1.1 for the actors' namespace and 10.<n>.2.1 for the learner's."""

    def __init__(self) -> None:
        tag = f"{os.getpid() % 10000}"
        self.n = 200 + os.getpid() % 50
        self.names = {"actor": f"ludic-a{tag}", "learner": f"ludic-l{tag}"}
        self.made: list[list[str]] = []

    def sh(self, *cmd: str) -> None:
        subprocess.run(cmd, check=True, capture_output=True, text=True)

    def __enter__(self) -> "_Namespaces":
        for k, (role, ns) in enumerate(self.names.items(), start=1):
            host, inner = f"vh{role[0]}{os.getpid() % 10000}", f"vn{role[0]}{os.getpid() % 10000}"
            self.sh("ip", "netns", "add", ns)
            self.made.append(["ip", "netns", "del", ns])
            self.sh("ip", "link", "add", host, "type", "veth", "peer", "name", inner)
            self.made.append(["ip", "link", "del", host])
            self.sh("ip", "link", "set", inner, "netns", ns)
            self.sh("ip", "addr", "add", f"10.{self.n}.{k}.1/24", "dev", host)
            self.sh("ip", "link", "set", host, "up")
            self.sh("ip", "netns", "exec", ns, "ip", "addr", "add", f"10.{self.n}.{k}.2/24", "dev", inner)
            self.sh("ip", "netns", "exec", ns, "ip", "link", "set", inner, "up")
            self.sh("ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up")
        return self

    def host_ip(self, role: str) -> str:
        return f"10.{self.n}.{1 if role == 'actor' else 2}.1"

    def prefix(self, role: str) -> list[str]:
        return ["ip", "netns", "exec", self.names[role]]

    def __exit__(self, *exc: object) -> None:
        for cmd in reversed(self.made):
            subprocess.run(cmd, capture_output=True)


def _can_make_namespaces() -> str | None:
    if os.geteuid() != 0:
        return "needs root (ip netns, veth)"
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"ip netns unavailable: {e}"
    return None


def test_actor_and_learner_in_separate_network_namespaces(tiny_model_dir, tmp_path, monkeypatch):
    """Multi-host as far as one machine shows it: the actor and the learner each run in their own
    network namespace (own veth pair and subnet, made here), with Redis on the host. They share
    no address and no folder they use: samples and weights go through Redis only."""
    from ludic.pipeline.redis_server import RedisServer

    why = _can_make_namespaces()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the namespace test must run in CI: {why}")
        pytest.skip(why)
    secret = tmp_path / "redis-password"  # beyond loopback Redis needs one; actor and learner inherit the variable
    secret.write_text(f"pw-{os.getpid()}")
    monkeypatch.setenv("LUDIC_REDIS_PASSWORD_FILE", str(secret))
    with _Namespaces() as ns:
        server = RedisServer(tmp_path / "redis", host="0.0.0.0").start()
        try:
            urls = {r: f"redis://{ns.host_ip(r)}:{server.port}/0" for r in ("actor", "learner")}
            cfg = config(tiny_model_dir, urls["learner"], tmp_path / "learner", steps=4)
            learner_cmd = ns.prefix("learner") + [sys.executable, "-m", "ludic", "learner", "tictactoe",
                                                  *cli_args(cfg)]
            actor_cfg = replace(cfg, redis_url=urls["actor"], run_dir=str(tmp_path / "actor"), actor_id="a0",
                                logger="none")
            actor_cmd = ns.prefix("actor") + [sys.executable, "-m", "ludic", "actor", "tictactoe", *cli_args(actor_cfg)]
            (tmp_path / "actor").mkdir()
            with open(tmp_path / "learner.log", "wb") as llog, open(tmp_path / "actor.log", "wb") as alog:
                learner = subprocess.Popen(learner_cmd, stdout=llog, stderr=subprocess.STDOUT)
                actor = subprocess.Popen(actor_cmd, stdout=alog, stderr=subprocess.STDOUT)
                try:
                    learner.wait(timeout=400)
                finally:
                    actor.kill()
                    learner.kill()
            assert learner.returncode == 0, (tmp_path / "learner.log").read_text()[-3000:]
            # the namespaces really are apart: the learner's cannot reach the actor's subnet
            probe = subprocess.run(ns.prefix("learner") + ["ip", "route", "get", f"10.{ns.n}.1.2"],
                                   capture_output=True, text=True)
            assert probe.returncode != 0 and "unreachable" in probe.stderr, (probe.stdout, probe.stderr)
            streams = PipelineStreams(server.url, prefix="f")
            sets = audit(streams, Path(cfg.run_dir), tmp_path / "actor", set())
            assert len(sets["trained"]) == 4 * 4
            version, info, _ = streams.latest_weights()
            assert version == 4 and "key" in info  # the weights went through Redis
        finally:
            server.kill()


def test_example_scripts_are_the_cli(redis_server, tiny_model_dir, tmp_path):
    """examples/pipeline_rl/run_actor.py and run_trainer.py run the same parts as the CLI."""
    root = Path(__file__).resolve().parents[2] / "examples" / "pipeline_rl"
    cfg = config(tiny_model_dir, redis_server.url, tmp_path / "learner", steps=1)
    actor_cfg = replace(cfg, run_dir=str(tmp_path / "actor"), actor_id="ex", actor_batches=2)
    actor = subprocess.Popen([sys.executable, str(root / "run_actor.py"), *cli_args(actor_cfg)],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    learner = subprocess.run([sys.executable, str(root / "run_trainer.py"), *cli_args(cfg)],
                             capture_output=True, text=True, timeout=300)
    out, _ = actor.communicate(timeout=300)
    assert learner.returncode == 0, learner.stdout[-2000:] + learner.stderr[-2000:]
    assert json.loads(learner.stdout[learner.stdout.index("{"):])["step"] == 1
    assert actor.returncode == 0 and "[actor ex] pushed 8 items" in out, out[-2000:]


def test_policies_load_from_two_threads_of_a_fresh_process(tiny_model_dir):
    """``--overlap`` loads the learner's and the actor's policies on two threads. In a process that had
    not imported transformers yet, its lazy import raced ("cannot import name 'AutoTokenizer'"), 4 times
    in 5; the benchmark's overlap run died of it. Three fresh processes, four loading threads each."""
    code = (
        "import sys, threading\n"
        "from ludic.training.lora import LoraSettings, load_policy\n"
        "errs = []\n"
        "def go(i):\n"
        "    try:\n"
        "        load_policy(sys.argv[1], lora=LoraSettings(rank=4, alpha=8) if i % 2 else None, dtype='float32')\n"
        "    except Exception as e:\n"
        "        errs.append(repr(e))\n"
        "ts = [threading.Thread(target=go, args=(i,)) for i in range(4)]\n"
        "[t.start() for t in ts]; [t.join() for t in ts]\n"
        "print(errs)\n")
    for _ in range(3):
        out = subprocess.run([sys.executable, "-c", code, str(tiny_model_dir)], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0 and out.stdout.strip().splitlines()[-1] == "[]", out.stdout[-2000:] + out.stderr[-2000:]
