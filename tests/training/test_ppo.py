"""PPO with a value head: GAE by hand, the clipped value loss by hand, and real PPO steps of the
tiny model on an OpenSpiel game (value pass, value loss, adaptive KL, checkpoint round trip)."""

import math
import asyncio

import pytest
from conftest import python_nash_conv, require
import torch

from ludic.rollouts.batch import build_saw_items
from ludic.rollouts.credit import GAE, MMDTarget
from ludic.training.losses import LossConfig, LossInputs, compute_loss
from ludic.types import Rollout, Step, TokenTrace


def _rollout(rewards):
    steps = [Step(i, "o", "a", "a", None, r, trace=TokenTrace((1, i), (2, 3), (-1.0, -2.0), (0, 0)))
             for i, r in enumerate(rewards)]
    return Rollout(steps=steps, meta={"agent_id": "a"})


def test_gae_by_hand():
    r = _rollout([0.0, 0.5, 1.0])
    v = {(r.id, 0): 0.2, (r.id, 1): 0.4, (r.id, 2): 0.8}
    gae = GAE(lambda rs: v, gamma=0.9, lam=0.5, normalize=False)
    w = gae.compute([r])
    d2 = 1.0 - 0.8                       # terminal: V_3 = 0
    d1 = 0.5 + 0.9 * 0.8 - 0.4
    d0 = 0.0 + 0.9 * 0.4 - 0.2
    a2, a1 = d2, d1 + 0.45 * d2
    a0 = d0 + 0.45 * a1
    assert [w[(r.id, i)] for i in range(3)] == pytest.approx([a0, a1, a2])
    assert gae.step_extras[(r.id, 1)] == pytest.approx({"value_old": 0.4, "value_target": a1 + 0.4})
    # lam = 1, gamma = 1: advantages are reward-to-go minus the value
    w1 = GAE(lambda rs: v, gamma=1.0, lam=1.0, normalize=False).compute([r])
    assert [w1[(r.id, i)] for i in range(3)] == pytest.approx([1.5 - 0.2, 1.5 - 0.4, 1.0 - 0.8])
    items = build_saw_items([r], gae, merge_turns=False)
    assert [it.meta["value_target"] for it in items] == pytest.approx([a0 + 0.2, a1 + 0.4, a2 + 0.8])
    with pytest.raises(ValueError, match="merge_turns=False"):
        build_saw_items([r], gae)
    with pytest.raises(ValueError, match="no value function"):
        GAE().compute([r])


def _turn(prompt, reward):
    """A one-turn rollout whose state is ``prompt`` (token ids)."""
    step = Step(0, "o", "a", "a", None, reward, trace=TokenTrace(tuple(prompt), (2, 3), (-1.0, -2.0), (0, 0)))
    return Rollout(steps=[step], meta={"agent_id": "a"})


def test_gae_state_baseline_is_the_leave_one_out_mean_of_the_same_state():
    """baseline="state": a turn's baseline is the mean return-to-go of the batch's other turns from the
    same prompt (information state), not the critic; a state seen once falls back to the critic."""
    a1, a2, a3 = _turn((1, 7), 1.0), _turn((1, 7), 0.0), _turn((1, 7), 0.5)
    b1, b2 = _turn((1, 8), 0.25), _turn((1, 8), 0.75)
    c = _turn((1, 9), 1.0)
    rs = [a1, a2, a3, b1, b2, c]
    v = {(r.id, 0): 0.4 for r in rs}
    gae = GAE(lambda rs: v, gamma=1.0, lam=0.95, normalize=False, baseline="state")
    w = gae.compute(rs)
    assert [w[(r.id, 0)] for r in rs] == pytest.approx(
        [1.0 - 0.25, 0.0 - 0.75, 0.5 - 0.5, 0.25 - 0.75, 0.75 - 0.25, 1.0 - 0.4])
    # the critic still learns the return: value targets are the returns, value_old the critic's
    assert gae.step_extras[(a2.id, 0)] == pytest.approx({"value_old": 0.4, "value_target": 0.0})
    # multi-turn: the return-to-go of each turn (gamma), each turn against its own state's others
    m1 = Rollout(steps=[Step(0, "o", "a", "a", None, 0.0, trace=TokenTrace((5,), (2,), (-1.0,), (0,))),
                        Step(1, "o", "a", "a", None, 1.0, trace=TokenTrace((6,), (2,), (-1.0,), (0,)))],
                 meta={"agent_id": "a"})
    m2 = Rollout(steps=[Step(0, "o", "a", "a", None, 0.0, trace=TokenTrace((5,), (2,), (-1.0,), (0,)))],
                 meta={"agent_id": "a"})
    vm = {(m1.id, 0): 0.1, (m1.id, 1): 0.2, (m2.id, 0): 0.3}
    wm = GAE(lambda rs: vm, gamma=0.5, normalize=False, baseline="state").compute([m1, m2])
    assert wm[(m1.id, 0)] == pytest.approx(0.5 - 0.0)    # G = 0 + 0.5 * 1, baseline: m2's G = 0
    assert wm[(m2.id, 0)] == pytest.approx(0.0 - 0.5)
    assert wm[(m1.id, 1)] == pytest.approx(1.0 - 0.2)    # alone in its state: the critic
    with pytest.raises(ValueError, match="baseline"):
        GAE(lambda rs: v, baseline="group")


def _played(prompt, action, reward, answer=(2, 3), logps=(-0.5, -0.1), parse_error=False):
    info = {"parse_error": True} if parse_error else {}
    step = Step(0, "o", action, None if parse_error else action, None, reward,
                trace=TokenTrace(tuple(prompt), answer, logps, (0,) * len(answer)), info=info)
    return Rollout(steps=[step], meta={"agent_id": "a"})


def test_mmd_target_by_hand():
    """q(a|s) ∝ exp((log pi_old(a|s) + eta Q(s,a)) / (1 + alpha eta)) per state; the whole q(a|s) goes
    to one turn with the action's most common answer, so every state weighs 1 in all."""
    odd = _played((1, 7), "1", 0.5, (5, 9), (-3.0, -0.1))  # a rarer spelling of "1": Q counts it, no weight
    bet = [odd, _played((1, 7), "1", 1.0, (5, 3), (-0.2, -0.1)), _played((1, 7), "1", 0.5, (5, 3), (-0.2, -0.1))]
    fold = [_played((1, 7), "0", 0.25, (4, 3), (-1.5, -0.1))]
    lone = [_played((1, 8), "1", 1.0)]                      # one action only: nothing to compare
    bad = [_played((1, 7), "x", 0.0, parse_error=True)]
    rs = bet + fold + lone + bad
    mmd = MMDTarget(eta=4.0, alpha=0.25)
    w = mmd.compute(rs)
    logpi1 = math.log(math.exp(-0.3) + math.exp(-3.1))  # both spellings of "1"
    z1 = (logpi1 + 4.0 * (2.0 / 3.0)) / 2.0           # Q = mean(0.5, 1.0, 0.5)
    z0 = (-1.6 + 4.0 * 0.25) / 2.0
    q1 = math.exp(z1) / (math.exp(z1) + math.exp(z0))
    assert [w[(r.id, 0)] for r in bet] == pytest.approx([0.0, q1, 0.0])
    assert w[(fold[0].id, 0)] == pytest.approx(1 - q1)
    assert w[(lone[0].id, 0)] == 0.0 and w[(bad[0].id, 0)] == 0.0
    assert mmd.last_stats["mmd_state_share"] == pytest.approx(0.5)
    # alpha = 0, equal returns: the target is pi_old itself (renormalised over the played actions)
    w0 = MMDTarget(eta=4.0, alpha=0.0).compute([_played((1,), "1", 0.5, (5,), (math.log(0.6),)),
                                                 _played((1,), "0", 0.5, (4,), (math.log(0.2),))])
    assert sorted(w0.values()) == pytest.approx([0.25, 0.75])
    # multi-turn: the first turn's Q is its return-to-go (the reward comes at the end)
    m = Rollout(steps=[Step(0, "o", "1", "1", None, 0.0, trace=TokenTrace((9,), (5,), (-0.7,), (0,))),
                       Step(1, "o", "1", "1", None, 1.0, trace=TokenTrace((6,), (5,), (-0.7,), (0,)))],
                meta={"agent_id": "a"})
    o = _played((9,), "0", 0.0, (4,), (-0.7,))
    wm = MMDTarget(eta=2.0, alpha=0.0).compute([m, o])
    assert wm[(m.id, 0)] == pytest.approx(math.exp(2.0) / (math.exp(2.0) + 1.0))
    with pytest.raises(ValueError):
        MMDTarget(eta=0.0)


def test_clipped_value_loss_by_hand():
    logp = torch.tensor([-1.0, -1.0], requires_grad=True)
    v = torch.tensor([0.5, 1.0], requires_grad=True)
    inp = LossInputs(logp=logp, adv=torch.tensor([1.0, -1.0]), seg=torch.tensor([0, 1]), total_tokens=2,
                     total_segments=2, old_logp=torch.tensor([-1.0, -1.0]), values=v,
                     value_old=torch.tensor([0.0, 1.0]), value_target=torch.tensor([1.0, 0.0]))
    loss, stats = compute_loss(inp, LossConfig(kind="ppo", vf_coef=0.5, value_clip=0.2))
    # segment 0: err (0.5-1)^2 = 0.25, clipped V = 0.2 -> (0.2-1)^2 = 0.64: max 0.64
    # segment 1: err (1-0)^2 = 1, clipped = 1 -> 1
    assert float(stats["value_loss"]) == pytest.approx(0.5 * 0.5 * (0.64 + 1.0) / 2)
    loss.backward()
    assert v.grad[0] == 0.0 and v.grad[1] != 0.0  # the clipped error of segment 0 carries no gradient to V
    with pytest.raises(ValueError, match="vf_coef"):
        compute_loss(LossInputs(logp=logp, adv=torch.tensor([1.0, -1.0]), seg=torch.tensor([0, 1]),
                                total_tokens=2, total_segments=2, old_logp=torch.tensor([-1.0, -1.0])),
                     LossConfig(kind="ppo", vf_coef=0.5))


def test_ppo_steps_on_kuhn_poker_train_the_value_head_and_adapt_kl(tiny_model_dir, tmp_path):
    require("pyspiel")
    from ludic.agents.agent import Agent
    from ludic.context import make_context
    from ludic.inference.client import SamplingParams
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.interaction.single_agent import SingleAgentProtocol
    from ludic.parsers import identity_parser
    from ludic.rollouts.batch import RolloutBatchSource
    from ludic.rollouts.engine import RolloutEngine
    from ludic.training.algorithms import make_ppo
    from ludic.training.config import TrainerConfig
    from ludic.training.lora import LoraSettings, load_policy
    from ludic.training.trainer import Trainer
    from ludic.training.value import ValueFunction, attach_value_head, value_head
    from ludic.types import EnvSpec, RolloutRequest

    model, tok = load_policy(tiny_model_dir, dtype="float32", lora=LoraSettings(rank=4, alpha=8))
    head = attach_value_head(model)
    engine = TransformersEngine(model, tok)

    def protocol():
        return SingleAgentProtocol(Agent(engine, make_context("last"), identity_parser,
                                         SamplingParams(temperature=1.0, max_tokens=3)))


    requests = [RolloutRequest(EnvSpec("openspiel", {"game": "kuhn_poker", "invalid_reward": -0.1}),
                               env_seed=s, max_steps=6) for s in range(6)]
    algo = make_ppo(ValueFunction(model, tok.pad_token_id), vf_coef=0.5, kl_coef=0.1)
    source = RolloutBatchSource(RolloutEngine({"single_agent": protocol}), lambda: requests, algo.credit,
                                merge_turns=False)
    trainer = Trainer(model, algo, source, TrainerConfig(lr=1e-2, kl_target=0.01, kl_horizon=10, ppo_epochs=2,
                                                         num_minibatches=2),
                      checkpoint_dir=tmp_path / "ckpt", pad_token_id=tok.pad_token_id, tokenizer=tok)
    before = head.proj.weight.detach().clone()
    m = asyncio.run(trainer.train_step())
    assert "value_loss" in m and m["value_loss"] > 0
    assert m["kl_coef"] != 0.1  # the controller moved it
    assert not torch.equal(head.proj.weight, before)
    trainer.save()
    saved = head.proj.weight.detach().clone()
    with torch.no_grad():
        head.proj.weight.zero_()
    assert trainer.resume()
    assert torch.equal(value_head(model).proj.weight, saved)
    assert trainer.algorithm.loss.kl_coef == pytest.approx(m["kl_coef"])


def _assert_curve_is_the_logged_policies(out, run_dir):
    """Each point of the NashConv curve is the exact NashConv (OpenSpiel's Python best responses, an
    independent implementation) of the policy table logged at that step; returns the tables by step."""
    import json

    import pyspiel

    game = pyspiel.load_game("kuhn_poker")
    logged = [json.loads(x) for x in (run_dir / "policy_tables.jsonl").read_text().splitlines()]
    tables = {rec["step"]: rec["tables"]["kuhn_poker"] for rec in logged}
    for point in out["exploitability"]:
        want = python_nash_conv(game, tables[point["step"]])
        assert point["nash_conv/kuhn_poker"] == pytest.approx(want, abs=1e-6), point
    return tables


def test_train_games_logs_a_nash_conv_curve_and_eval_games_reports_intervals(tiny_model_dir, tmp_path):
    require("pyspiel")
    from ludic.recipes.games import EvalGamesConfig, TrainGamesConfig, eval_games, train_games

    out = train_games(TrainGamesConfig(model=str(tiny_model_dir), games="kuhn_poker", train_steps=2, eval_every=1,
                                       episodes_per_update=4, run_dir=str(tmp_path / "run"), logger="none",
                                       dtype="float32"))
    assert [p["step"] for p in out["exploitability"]] == [0, 1, 2]
    _assert_curve_is_the_logged_policies(out, tmp_path / "run")
    assert "value_loss" in out and "score" in out and "kuhn_poker/invalid_answer_rate" in out
    assert (tmp_path / "run" / "checkpoints" / "latest.json").exists()
    res = eval_games(EvalGamesConfig(model=str(tiny_model_dir), games="kuhn_poker,tic_tac_toe", episodes=4,
                                     exploitability=True, dtype="float32"))
    kuhn, ttt = res["kuhn_poker"], res["tic_tac_toe"]
    assert kuhn["episodes"] == 4 and 0 <= kuhn["success_rate_ci95"][0] <= kuhn["success_rate_ci95"][1] <= 1
    from ludic.envs.openspiel import OpenSpielEnv
    from ludic.eval.games import policy_table
    from ludic.training.lora import load_policy

    model, tok = load_policy(str(tiny_model_dir), dtype="float32")  # the evaluated model, its table by hand
    env = OpenSpielEnv(game="kuhn_poker")
    assert kuhn["nash_conv"] == pytest.approx(python_nash_conv(env.game, policy_table(env, model, tok)), abs=1e-6)
    assert ttt["states"] == 4520


def test_train_games_keep_best_ends_on_the_lowest_nash_conv_it_measured(tiny_model_dir, tmp_path):
    require("pyspiel")
    from ludic.envs.openspiel import OpenSpielEnv
    from ludic.eval.games import nash_conv, policy_table
    from ludic.recipes.games import TrainGamesConfig, train_games

    cfg = TrainGamesConfig(model=str(tiny_model_dir), games="kuhn_poker", opponent="self", algorithm="mmd",
                           train_steps=3, eval_every=1, episodes_per_update=8, max_completion_tokens=2, kl_coef=0.0,
                           keep_best=True, run_dir=str(tmp_path / "run"), logger="none", dtype="float32")
    out = train_games(cfg)
    curve = {p["step"]: p["nash_conv/kuhn_poker"] for p in out["exploitability"]}
    assert sorted(curve) == [0, 1, 2, 3]
    kept = out["kept"]
    assert kept["nash_conv"] == min(curve.values()) == curve[kept["step"]]  # the start (step 0) is a candidate
    assert kept["last_step"] == 3 and kept["last_nash_conv"] == curve[3]
    from ludic.training.lora import load_policy

    saved = tmp_path / "run" / "checkpoints" / "step_000003" / "model"
    model, tok = load_policy(str(tiny_model_dir), adapter=str(saved), dtype="float32")
    env = OpenSpielEnv(game="kuhn_poker")  # the saved final weights are the kept step's
    assert nash_conv(env.game, policy_table(env, model, tok, temperature=cfg.temperature)) == pytest.approx(
        kept["nash_conv"], abs=1e-5)
    with pytest.raises(ValueError, match="--keep-best keeps the lowest NashConv"):
        train_games(TrainGamesConfig(model=str(tiny_model_dir), games="tic_tac_toe", keep_best=True,
                                     run_dir=str(tmp_path / "ttt"), logger="none", dtype="float32"))


def test_train_games_with_the_mmd_step_needs_no_critic_and_logs_its_targets(tiny_model_dir, tmp_path):
    require("pyspiel")
    from ludic.recipes.games import TrainGamesConfig, train_games

    cfg = TrainGamesConfig(model=str(tiny_model_dir), games="kuhn_poker", opponent="self", algorithm="mmd",
                           train_steps=2, eval_every=1, episodes_per_update=8, max_completion_tokens=2,
                           kl_coef=0.0, run_dir=str(tmp_path / "run"), logger="none", dtype="float32")
    out = train_games(cfg)
    assert [p["step"] for p in out["exploitability"]] == [0, 1, 2]
    tables = _assert_curve_is_the_logged_policies(out, tmp_path / "run")
    assert tables[2] != tables[0], "two MMD steps did not move the policy"
    # a state visited with more than one action gets a target: the last batch had some
    assert "value_loss" not in out and out["mmd_state_share"] > 0 and out["mmd_target_entropy"] > 0
    assert out["num_items_filtered"] > 0  # zero-weight turns (one per state and action is kept) are not trained
    with pytest.raises(ValueError, match="--algorithm"):
        train_games(TrainGamesConfig(model=str(tiny_model_dir), algorithm="grpo", run_dir=str(tmp_path / "x")))


def test_exploitability_reads_the_prompt_the_agent_is_sampled_from(tiny_model_dir):
    """The policy table must score the exact prompt the trained agent sees (ctx last)."""
    require("pyspiel")
    from ludic.data.offline import sft_item
    from ludic.envs.openspiel import OpenSpielEnv
    from ludic.eval.games import turn_messages
    from ludic.inference.transformers_engine import TransformersEngine
    from ludic.recipes.games import TrainGamesConfig
    from ludic.recipes.games_setup import protocols
    from ludic.training.lora import load_policy

    model, tok = load_policy(tiny_model_dir, dtype="float32")
    proto = protocols(TransformersEngine(model, tok), TrainGamesConfig(), 1.0)["single_agent"]()
    env = OpenSpielEnv(game="kuhn_poker")
    [r] = asyncio.run(proto.run(env, max_steps=1, env_seed=0, sampling_seed=0))
    env2 = OpenSpielEnv(game="kuhn_poker")
    env2.reset(seed=0)
    seat = env2.seat_of["agent_0"]
    want = sft_item({"messages": turn_messages(env2, env2.state, seat), "completion": "0"}, tok).prompt_ids
    assert r.steps[0].trace.prompt_ids == want


def test_the_original_json_configs_map_onto_flags_with_warnings_and_unknown_fields_fail():
    import json
    from pathlib import Path

    from ludic.config import parse_config
    from ludic.recipes.games import TrainGamesConfig
    from ludic.recipes.games_setup import parse_games
    from ludic.recipes.games_config import original_config_argv

    root = Path(__file__).resolve().parents[2] / "configs" / "games"
    warned = []
    argv = original_config_argv(json.loads((root / "train_config.json").read_text()),
                                json.loads((root / "env_config.json").read_text()), warn=warned.append)
    cfg = parse_config(TrainGamesConfig, argv + ["--train-steps", "3"])
    assert cfg.trainer.lr == 1e-5 and cfg.trainer.ppo_epochs == 2 and cfg.kl_coef == 0.2
    assert cfg.trainer.num_minibatches == 4 and cfg.lora_rank == 16 and cfg.lora_alpha_mult == 2.0
    assert cfg.trainer.kl_target == pytest.approx(6.0 / 8) and cfg.train_steps == 3  # the command line wins
    assert cfg.opponent == "random" and parse_games(cfg.games) == [{"index": 0}, {"index": 1}, {"index": 2}]
    assert any("'use_4bit'" in w for w in warned) and any("'env_mode'" in w for w in warned)
    assert any("'vllm_base_url'" in w for w in warned)
    trace = original_config_argv(None, json.loads((root / "trace_config.json").read_text()), warn=warned.append)
    assert parse_games(parse_config(TrainGamesConfig, trace).games) == [{"trace": True}]
    with pytest.raises(ValueError, match="unknown field 'learning_rat'"):
        original_config_argv({"learning_rat": 1e-5})
    with pytest.raises(ValueError, match="unknown field 'docker_image'"):
        original_config_argv(None, {"docker_image": "x"})


def test_train_games_against_a_league_of_frozen_snapshots(tiny_model_dir, tmp_path):
    require("pyspiel")
    import json

    from ludic.recipes.games import TrainGamesConfig, train_games

    run = tmp_path / "league-run"
    train_games(TrainGamesConfig(model=str(tiny_model_dir), games="kuhn_poker", opponent="league", league_every=1,
                                 train_steps=2, eval_every=0, episodes_per_update=4, run_dir=str(run),
                                 logger="none", dtype="float32"))
    league = json.loads((run / "league" / "league.json").read_text())
    assert [s["step"] for s in league["snapshots"]] == [0, 1, 2]
    rollouts = [json.loads(line) for line in (run / "rollouts.jsonl").read_text().splitlines()]
    frozen = [r for r in rollouts if r["meta"].get("trainable") is False]
    assert frozen and len(frozen) == len(rollouts) // 2  # one frozen seat per game
    assert all(r["meta"]["opponent"] == "league" for r in rollouts)
    with pytest.raises(ValueError, match="two-player games"):
        train_games(TrainGamesConfig(model=str(tiny_model_dir), games="hearts", opponent="league",
                                     run_dir=str(tmp_path / "x"), logger="none"))


def test_format_demos_answer_a_uniform_legal_id_through_the_real_agent_prompt(tiny_model_dir):
    """The format cold start teaches bare legal ids on exactly the prompts PPO samples from, and no game:
    each legal id about equally often."""
    require("pyspiel")
    from collections import Counter

    from ludic.data.offline import sft_item
    from ludic.eval.games import turn_messages
    from ludic.recipes.games import TrainGamesConfig, format_demo_items
    from ludic.training.lora import load_policy

    _, tok = load_policy(tiny_model_dir, dtype="float32")
    items = asyncio.run(format_demo_items(TrainGamesConfig(games="kuhn_poker", opponent="self"), tok, 60, seed=0))
    assert len(items) >= 60 * 2  # every seat of every self-play game, at least one turn each
    answers = Counter(tok.decode(i.completion_ids, skip_special_tokens=True) for i in items)
    assert set(answers) == {"0", "1"} and min(answers.values()) > 0.35 * len(items)
    assert all(i.completion_ids[-1] == tok.eos_token_id for i in items)
    want = {tuple(sft_item({"messages": turn_messages(e, e.state, 0), "completion": "0"}, tok).prompt_ids)
            for e in _kuhn_openings()}  # player 0's first turn, for each of its cards
    opening = {tuple(i.prompt_ids) for i in items if "Actions so far: none" in tok.decode(i.prompt_ids)}
    assert opening == want
    with pytest.raises(ValueError, match="only the trace task"):
        asyncio.run(format_demo_items(TrainGamesConfig(games="trace"), tok, 2, seed=0))


def _kuhn_openings():
    from ludic.envs.openspiel import OpenSpielEnv

    out = []
    for card in range(3):
        env = OpenSpielEnv(game="kuhn_poker")
        env.reset(seed=0)
        state = env.game.new_initial_state()
        state.apply_action(card)
        state.apply_action((card + 1) % 3)
        env.state = state
        out.append(env)
    return out


def test_train_games_format_demos_merge_into_the_ppo_start_and_are_not_rerun_on_resume(tiny_model_dir, tmp_path):
    require("pyspiel")
    from ludic.recipes.games import TrainGamesConfig, train_games

    run = tmp_path / "fmt"
    cfg = dict(model=str(tiny_model_dir), games="kuhn_poker", opponent="self", format_demos=2, train_steps=1,
               eval_every=0, episodes_per_update=4, run_dir=str(run), logger="none", dtype="float32",
               max_completion_tokens=3)
    out = train_games(TrainGamesConfig(**cfg))
    base, start, end = out["exploitability"]
    assert base["stage"] == "base" and "stage" not in start and (start["step"], end["step"]) == (0, 1)
    assert base["nash_conv/kuhn_poker"] != start["nash_conv/kuhn_poker"]  # the demos moved the policy
    assert (run / "format_sft" / "model.safetensors").exists() and not (run / "format_sft.tmp").exists()
    stamp = (run / "format_sft" / "model.safetensors").stat().st_mtime_ns
    out2 = train_games(TrainGamesConfig(**{**cfg, "train_steps": 2}))
    assert [p["step"] for p in out2["exploitability"]] == [1, 2]  # resumed: no second base measure or demos
    assert (run / "format_sft" / "model.safetensors").stat().st_mtime_ns == stamp
    train_games(TrainGamesConfig(**{**cfg, "resume": False, "train_steps": 0}))  # a fresh run in the same folder
    assert (run / "format_sft" / "model.safetensors").stat().st_mtime_ns != stamp


def test_mmd_loss_weighs_a_turn_by_its_target_alone_not_by_its_episode_share():
    """MMD's per-state targets are already balanced: a turn's loss weight is q(a|s), whether it was
    drawn from a one-turn or a two-turn episode. Per-turn items carry ``episode_share = 1/n``, and
    the "sum" aggregation used to multiply it in, halving q for every turn of a two-turn episode.
    Checked at the loss, through the trainer's own collate and objective inputs."""
    from ludic.training.algorithms import make_mmd
    from ludic.training.microbatch import collate
    from ludic.training.losses import LossInputs, compute_loss
    from ludic.types import SAWItem

    q = 0.6
    items = [SAWItem(prompt_ids=(1, 2), completion_ids=(5, 6), weight=q, episode_share=1.0),  # one-turn episode
             SAWItem(prompt_ids=(1, 3), completion_ids=(7, 8), weight=q, episode_share=0.5),  # turn 1 of 2
             SAWItem(prompt_ids=(1, 3, 7, 8, 4), completion_ids=(9, 9), weight=0.0, episode_share=0.5)]  # turn 2
    mb = collate(items, pad_id=0)
    logp = torch.full((mb.seg.numel(),), -1.0, requires_grad=True)
    inp = LossInputs(logp=logp, adv=mb.adv, seg=mb.seg, total_tokens=6.0,
                     total_segments=sum(it.episode_share for it in items), seg_weight=mb.seg_weight)
    loss, _ = compute_loss(inp, make_mmd().loss)
    loss.backward()
    g = logp.grad
    per_item = [g[mb.seg == i].sum().item() for i in range(3)]
    assert per_item[0] == pytest.approx(per_item[1]) and per_item[0] < 0, per_item  # same q, same pull
    assert per_item[2] == 0.0
