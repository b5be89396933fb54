"""``ludic actor env`` / ``ludic learner env``: the generic pipeline commands take the same environment spec
as ``ludic train env``; a real redis-server carries the samples and the weights between two processes."""

import json
import subprocess
import sys

import pytest

from ludic.config import parse_config


def _cmd(role, tiny_model_dir, url, run_dir, *extra):
    return [sys.executable, "-m", "ludic", role, "env", "--env", "tictactoe", "--env-kwargs", '{"opponent": "random"}',
            "--model", str(tiny_model_dir), "--redis-url", url, "--stream-prefix", "envp", "--run-dir", str(run_dir),
            "--group-size", "2", "--prompts-per-step", "2", "--max-completion-tokens", "8", "--max-turns", "3",
            "--max-no-signal-steps", "0", "--logger", "none", "--dtype", "float32", *extra]


@pytest.mark.slow
def test_actor_and_learner_env_train_on_any_env_through_redis(redis_server, tiny_model_dir, tmp_path):
    learner_dir, actor_dir = tmp_path / "learner", tmp_path / "actor"
    learner = subprocess.Popen(_cmd("learner", tiny_model_dir, redis_server.url, learner_dir, "--train-steps", "2",
                                    "--checkpoint-every", "1", "--batch-timeout-s", "600"),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    actor = subprocess.Popen(_cmd("actor", tiny_model_dir, redis_server.url, actor_dir, "--actor-id", "a1",
                                  "--seed", "1"),
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        out, _ = learner.communicate(timeout=900)
    finally:
        actor.kill()
    actor_out = actor.communicate()[0]
    assert learner.returncode == 0, out[-3000:] + "\n--- actor ---\n" + actor_out[-3000:]
    result = json.loads(out[out.index("{"):])
    assert result["step"] == 2 and result["totals"]["trained"] > 0, result
    assert (learner_dir / "checkpoints" / "step_000002").is_dir()
    assert json.loads((learner_dir / "config.json").read_text())["env"]["env"] == "tictactoe"
    pushed = [json.loads(x) for x in (actor_dir / "actor-a1.jsonl").read_text().splitlines() if x.strip()]
    assert pushed and max(max(p["versions"]) for p in pushed) >= 1  # the actor followed the learner's weights


def test_env_pipeline_flags_are_train_envs_plus_the_pipelines():
    from ludic.recipes.env import TrainEnvConfig
    from ludic.recipes.env_pipeline import EnvPipelineConfig

    cfg = parse_config(EnvPipelineConfig, ["--env", "reasoning_gym:gcd", "--redis-url", "redis://h:1/0",
                                           "--group-size", "4", "--actor-batches", "3"])
    assert (cfg.env.env, cfg.redis_url, cfg.group_size, cfg.actor_batches) == ("reasoning_gym:gcd", "redis://h:1/0",
                                                                              4, 3)
    assert isinstance(cfg, TrainEnvConfig)


def test_the_pipeline_refuses_the_format_cold_start_with_the_way_to_run_it(tiny_model_dir):
    from ludic.errors import UsageError
    from ludic.recipes.env_pipeline import ENV, EnvPipelineConfig

    with pytest.raises(UsageError, match="ludic train env"):
        ENV.load(EnvPipelineConfig(model=str(tiny_model_dir), format_demos="demos.txt"))
    with pytest.raises(UsageError, match="--keep-best run in `ludic train env` only"):
        ENV.load(EnvPipelineConfig(model=str(tiny_model_dir), keep_best=True, eval_every=5))
    assert not EnvPipelineConfig().keep_best and EnvPipelineConfig().eval_every == 0  # train env's default is off here


def _actor_seeds(cfg, run_dir):
    """Run one ``ludic actor env`` batch in process; the (env seed, sampling seed) of each episode it played."""
    import asyncio

    from ludic.recipes import pipeline
    from ludic.recipes.env_pipeline import ENV

    asyncio.run(pipeline.actor_loop(cfg, ENV))
    lines = (run_dir / "rollouts.jsonl").read_text().splitlines()
    (run_dir / "rollouts.jsonl").unlink()
    return sorted({(r["meta"]["env_seed"], r["meta"]["sampling_seed"]) for r in map(json.loads, lines)})


def test_two_actors_started_alike_draw_different_seeds_and_a_named_one_repeats_its_own(redis_server, tiny_model_dir,
                                                                                       tmp_path):
    """Was: every actor took ``--seed 0`` for its training seeds and its GRPO request strategy, so two actors
    started with the same flags pushed the same episodes. Now each actor's seed is derived from ``--seed`` and
    its actor id (by default ``actor-<n>``, numbered in Redis as actors start): two actors started alike draw
    different env and sampling seeds; one started again with the same ``--actor-id`` and ``--seed`` repeats
    its own."""
    from ludic.pipeline.actor import AnnouncingPublisher
    from ludic.pipeline.streams import PipelineStreams
    from ludic.recipes.env_pipeline import ENV, EnvPipelineConfig

    run_dir = tmp_path / "actor"
    flags = _cmd("actor", tiny_model_dir, redis_server.url, run_dir, "--actor-batches", "1")[5:]
    cfg = parse_config(EnvPipelineConfig, flags)
    model, _ = ENV.load(cfg)
    AnnouncingPublisher(PipelineStreams(redis_server.url, prefix="envp")).publish(model, 0)  # the learner's start

    first, second = _actor_seeds(cfg, run_dir), _actor_seeds(parse_config(EnvPipelineConfig, flags), run_dir)
    assert len(first) == len(second) == 4  # 2 prompts x a group of 2
    assert not set(first) & set(second), (first, second)
    named = parse_config(EnvPipelineConfig, [*flags, "--actor-id", "a7", "--seed", "3"])
    assert _actor_seeds(named, run_dir) == _actor_seeds(named, run_dir)
