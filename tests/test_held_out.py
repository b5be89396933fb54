"""Held out means instances, not seeds (issue 38): every env names what one instance is, ``ludic train env``
builds its test and validation sets of distinct instances disjoint by content and never trains on them where
the instance space allows, reports how many test instances the run trained on and the space's size, and says
"trained instances" where the space is too small; rewards cannot be gamed by hedging."""

import json

import pytest
from conftest import require

import ludic
from ludic.eval.instances import estimate_space, instance_of

TINY = dict(group_size=2, prompts_per_step=2, logger="none", dtype="float32", max_completion_tokens=6,
            max_no_signal_steps=0)


def _rows(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def _instances(path):
    return {r["meta"]["reset_info"]["instance"] for r in _rows(path)}


def test_the_space_estimate_counts_distinct_instances():
    """Chao1 over probed keys: exact once every key was seen twice, an estimate above the distinct count while
    singletons remain."""
    exact = estimate_space([k % 10 for k in range(200)])
    assert exact == {"probed": 200, "distinct": 10, "estimate": 10, "exact": True}
    rich = estimate_space(list(range(150)) + list(range(50)))
    assert rich["distinct"] == 150 and rich["estimate"] > 150 and not rich["exact"]


def test_adapters_name_their_instances():
    """A reasoning-gym instance is its question; a TextArena or GEM one is the game's hidden state (the secret,
    the deal): their first observations are the same for every secret."""
    require("reasoning_gym")
    require("textarena")
    require("gem")
    from ludic.envs.registry import make_env
    from ludic.types import EnvSpec

    rg = make_env(EnvSpec("reasoning_gym:products", {"config": {"min_digits": 1, "max_digits": 1}}))
    obs, info = rg.reset(3)["agent_0"]
    assert info["instance"] in obs and instance_of(rg.reset(3)) == info["instance"]
    guess = make_env(EnvSpec("textarena:GuessTheNumber-v0"))
    secrets = {instance_of(guess.reset(s)) for s in range(60)}
    firsts = {guess.reset(s)["player_0"][0] for s in range(60)}
    assert len(firsts) == 1 and len(secrets) == 20  # TextArena's 20 secrets, one first observation
    gem_guess = make_env(EnvSpec("gem:game:GuessTheNumber-v0-easy"))
    assert len({instance_of(gem_guess.reset(s)) for s in range(300)}) == 10  # GEM's 10 (its prompts vary)
    kuhn = make_env(EnvSpec("textarena:KuhnPoker-v0", {"max_rounds": 1}))
    assert len({instance_of(kuhn.reset(s)) for s in range(200)}) == 6  # one round: 6 deals


@pytest.mark.slow
def test_a_tiny_instance_space_is_labelled_trained_instances(tiny_model_dir, tmp_path):
    """Was: products with one-digit factors (100 distinct questions) reported its 64 test episodes as held out,
    though every one was a training question. Now the run measures the space and says so, loudly."""
    require("reasoning_gym")
    run = tmp_path / "run"
    out = ludic.train("reasoning_gym:products", model=str(tiny_model_dir), run_dir=str(run), train_steps=1,
                      env_kwargs={"config": {"min_digits": 1, "max_digits": 1}}, eval_episodes=64, val_episodes=32,
                      **TINY)
    inst = out.results["instances"]
    assert inst["space"]["estimate"] == 100 and inst["space"]["exact"]
    assert not inst["held_out"] and inst["label"] == "trained instances" and "too small" in inst["note"]
    assert inst["test_distinct"] == len(_instances(run / "eval_trained.jsonl")) == 64
    summary = json.loads((run / "summary.json").read_text())
    assert summary["instances"] == inst
    # what the run was measured on (docs/study.md says each summary.json has it; it had not)
    assert summary["machine"]["dtype"] in ("float32", "bfloat16") and summary["machine"]["cpus"] >= 1
    assert "kernels" in summary["machine"] and "isa" in summary["machine"]
    # the CPU's model name too: an Intel Xeon limited to AVX2 ran 1.5x the steps of an AMD EPYC with AVX2
    assert "cpu_model" in summary["machine"]
    # and how fast it trained: in the study one machine of one kind trained the same tokens 1.5x slower in one
    # session than in the last (0.68 against 1.03 s per 1,000), and a budgeted run fit 131 steps instead of 210
    assert summary["machine"]["train_s_per_1k_tokens"] > 0


@pytest.mark.slow
def test_validation_and_test_are_disjoint_by_content_and_never_trained_on(tiny_model_dir, tmp_path):
    """Was: the validation seeds and the test seeds of reasoning-gym met once the eval split wrapped
    (``train_size + seed % eval_size``; eval_size 50: the same entries), so keep-best chose on the test. Now
    both sets are distinct instances, disjoint by content, and the training draw skips them."""
    require("reasoning_gym")
    run = tmp_path / "run"
    out = ludic.train("reasoning_gym:chain_sum", model=str(tiny_model_dir), run_dir=str(run), train_steps=3,
                      env_kwargs={"eval_size": 50}, eval_episodes=12, val_episodes=6, eval_every=1, **TINY)
    test, val = _instances(run / "eval_trained.jsonl"), _instances(run / "eval_val.jsonl")
    trained = _instances(run / "rollouts.jsonl")
    assert len(test) == 12 and len(val) == 6 and not test & val and not trained & (test | val)
    inst = out.results["instances"]
    assert inst["held_out"] and inst["label"] == "held out" and inst["test_trained"] == 0
    assert inst["train_distinct"] == len(trained) == 6 and inst["test_distinct"] == 12 and inst["val_distinct"] == 6


def test_a_hedged_reasoning_gym_answer_earns_no_more_than_a_wrong_one():
    """Was: reasoning-gym's ``score_answer`` paid ``len(oracle) / len(answer)`` when the right answer sat inside a
    longer one, so ``<answer>12 14 16</answer>`` earned reward where one wrong number earned 0, and GRPO
    reinforced hedging. Now the reward is success (1/0) unless partial credit is asked for, and several
    candidate answers (in one tag or several) earn what a wrong answer earns, partial credit or not."""
    require("reasoning_gym")
    from ludic.envs.reasoning_gym_env import ReasoningGymEnv

    env = ReasoningGymEnv("products", config={"min_digits": 1, "max_digits": 1})
    env.reset(5)
    right = str(env.entry["answer"])
    wrong = str(int(right) + 1)

    def reward(reply):
        env.reset(5)
        return env.step({"agent_0": reply})["agent_0"]

    assert reward(f"<answer>{right}</answer>").reward == 1.0
    assert reward(f"<answer>{wrong}</answer>").reward == 0.0
    for hedge in (f"<answer>{wrong} {right} {wrong}0</answer>", f"<answer>{wrong}</answer> <answer>{right}</answer>"):
        out = reward(hedge)
        assert out.reward == 0.0 and out.info["hedged"], hedge
    partial = ReasoningGymEnv("products", config={"min_digits": 1, "max_digits": 1}, partial_credit=True)
    for reply, paid in ((f"<answer>{right}</answer>", 1.0), (f"<answer>{wrong} {right}</answer>", 0.0)):
        partial.reset(5)
        assert partial.step({"agent_0": reply})["agent_0"].reward == paid


def test_a_hedged_qa_answer_is_wrong():
    """The QA graders take one answer: several numbers where the reference is one number are wrong."""
    from ludic.envs.qa import QAEnv

    for grader in ("numeric", "math", "exact"):
        env = QAEnv("What is 6 * 7?", "42", grader=grader)
        env.reset()
        assert env.step({"agent_0": "42"})["agent_0"].reward == 1.0
        env.reset()
        out = env.step({"agent_0": "41, 42, 43"})["agent_0"]
        assert out.reward == 0.0 and out.info["hedged"], grader


def _study_table(root):
    """examples/study/table.py, loaded as a module (the examples are scripts, not a package)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("study_table", root / "table.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    return table


def test_the_study_table_is_built_from_the_runs_own_summaries(tmp_path, capsys):
    """examples/study/table.py: every number of docs/study.md's table comes from a run's summary.json, the
    two-player runs with a row per evaluation opponent (wins in play apart from wins by forfeit)."""
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples" / "study"
    table = _study_table(root)
    shutil.copytree(root / "results" / "chain_sum-s0", tmp_path / "chain_sum-s0")
    s = json.loads((tmp_path / "chain_sum-s0" / "summary.json").read_text())
    stage = {**s["base"], "success_rate": 0.5, "play_win_rate": 0.25, "forfeit_win_rate": 0.25}
    s["opponents"] = {"random": {"base": stage, "trained": stage}}
    s["format_demos"] = {**s["base"], "success_rate": 0.25}  # a cold start: RL's start, and the gain's
    (tmp_path / "poker-s1").mkdir()
    (tmp_path / "poker-s1" / "summary.json").write_text(json.dumps(s))
    table.main(tmp_path)
    out = capsys.readouterr().out
    assert ("| chain_sum | 0 | 64 (0) | 13,407 (est.) | 12.5% (6.5%-22.8%) | base | 29.7% (19.9%-41.8%) | "
            "+17.2 (+3.0 to +30.7) | yes | 77 |") in out
    assert "Mean gain over 2 task(s)" in out and "poker seed 1, test deals against each opponent" in out
    assert "| random | 50.0% (6.5%-22.8%); 25.0% / 25.0% |" in out
    # the best constant answer, computed from the kept test episodes (the summary predates it)
    assert "| chain_sum | 0 | '-2': 6.2% | 29.7% | 27 ('1', 28.1%) | 35 ('-3', 9.4%) |" in out


def test_the_study_curves_are_drawn_from_the_runs_own_summaries(tmp_path):
    """``table.py --plot``: one panel per task, each seed's validation curve against minutes, titled with the
    distinct test instances and the most any seed trained on (a run that trained on a test instance shows it)."""
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples" / "study"
    table = _study_table(root)
    for run in ("chain_sum-s0", "chain_sum-s1"):
        shutil.copytree(root / "results" / run, tmp_path / run)
    s = json.loads((tmp_path / "chain_sum-s1" / "summary.json").read_text())
    s["instances"]["test_trained"] = 3
    (tmp_path / "chain_sum-s1" / "summary.json").write_text(json.dumps(s))
    shutil.copytree(root / "results" / "gcd99-s0", tmp_path / "gcd99-s0")
    out = tmp_path / "curves.png"
    titles = table.plot(tmp_path, out)
    assert titles == ["chain_sum: 64 test instances, 3 trained on", "gcd99: 64 test instances, 0 trained on"]
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_task_row_starts_from_the_mean_of_its_seeds_own_cold_starts(tmp_path, capsys):
    """A format cold start is trained per seed, so its test score differs by seed: the per-task row's start of
    RL and gain are the seeds' mean start, not the first seed's (calculator: 81.2% and 95.3%)."""
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples" / "study"
    table = _study_table(root)
    for seed, start, trained in ((0, 0.25, 0.5), (1, 0.75, 0.75)):
        shutil.copytree(root / "results" / "chain_sum-s0", tmp_path / f"demo-s{seed}")
        s = json.loads((tmp_path / f"demo-s{seed}" / "summary.json").read_text())
        s["format_demos"] = {**s["base"], "success_rate": start}
        s["trained"] = {**s["trained"], "success_rate": trained}
        (tmp_path / f"demo-s{seed}" / "summary.json").write_text(json.dumps(s))
    table.main(tmp_path)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| demo | 2 |"))
    # start: mean of 25% and 75% over 64 episodes (Wilson interval of 32/64); trained: mean 62.5%; gain +12.5
    assert row.startswith("| demo | 2 | 50.0% (38.1%-61.9%) | 62.5% ") and "| +12.5 (" in row, row


def test_a_task_that_collapsed_to_one_answer_and_lost_stays_in_the_mean(tmp_path, capsys):
    """Was: any task with a seed that gave one answer to almost every question left the mean gain. That is right
    for letter_counting (the constant answer 1 made its +54.7), wrong for gcd 2-99 (seed 2 answered 2 to every
    question and lost 3.1 points): leaving out a failure raised the mean from +15.5 to +18.4. A collapse is left
    out only when it gained."""
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples" / "study"
    table = _study_table(root)
    for run in ("gcd99-s0", "gcd99-s1", "gcd99-s2", "letter_counting-s0"):
        shutil.copytree(root / "results" / run, tmp_path / run)
    table.main(tmp_path)
    out = capsys.readouterr().out
    assert "Mean gain over 1 task(s)" in out and "-2.1 points" in out, out[-600:]
    assert "left out: letter_counting (" in out and "gcd99 (" not in out.split("left out:")[1]


def test_a_superseded_task_config_stays_in_the_tables_and_leaves_the_mean_to_its_successor(tmp_path, capsys):
    """GEM's guess-the-number was first trained with a teacher that repeated guesses and GEM's distance-paying
    reward (gem_guess_random: 0% on every seed); gem_guess_legal is the same game with both fixed. Counting both
    would count one game twice: the old config's rows stay in every table, marked superseded, and the mean gain
    counts the successor once it has runs (until then, the old config)."""
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples" / "study"
    table = _study_table(root)
    for run in ("chain_sum-s0", "gem_guess_random-s0"):
        shutil.copytree(root / "results" / run, tmp_path / run)
    table.main(tmp_path)
    out = capsys.readouterr().out
    assert "Mean gain over 2 task(s)" in out and "superseded" not in out  # no successor yet: the old config counts
    shutil.copytree(root / "results" / "chain_sum-s0", tmp_path / "gem_guess_legal-s0")
    s = json.loads((tmp_path / "gem_guess_legal-s0" / "summary.json").read_text())
    s["trained"] = {**s["trained"], "success_rate": 0.5}
    (tmp_path / "gem_guess_legal-s0" / "summary.json").write_text(json.dumps(s))
    table.main(tmp_path)
    out = capsys.readouterr().out
    assert "| gem_guess_random (superseded by gem_guess_legal) | 0 |" in out
    assert "Mean gain over 2 task(s)" in out and "+27.3 points" in out  # (17.2 + 37.5) / 2
    assert "superseded: gem_guess_random (" in out


def test_a_two_player_task_is_shown_over_its_seeds_against_every_opponent(tmp_path, capsys):
    """A two-player task's seeds, averaged per opponent (each seed's gain is over its own base: the random player's
    moves differ by seed), and the mean gain again with the task counted against the random player it never
    trained against, beside the one counted against the frozen start it trained against."""
    import json
    import shutil
    from pathlib import Path

    root = Path(__file__).resolve().parents[1] / "examples" / "study"
    table = _study_table(root)
    shutil.copytree(root / "results" / "chain_sum-s0", tmp_path / "chain_sum-s0")  # +17.2
    for seed, (rb, rt) in enumerate(((0.25, 0.5), (0.125, 0.25))):
        shutil.copytree(root / "results" / "chain_sum-s0", tmp_path / f"poker-s{seed}")
        s = json.loads((tmp_path / f"poker-s{seed}" / "summary.json").read_text())
        s["base"] = {**s["base"], "success_rate": 0.5}
        s["trained"] = {**s["trained"], "success_rate": 0.875}  # +37.5 against the frozen start
        s["opponents"] = {"random": {"base": {**s["base"], "success_rate": rb},
                                     "trained": {**s["trained"], "success_rate": rt}},
                          "league": {"trained": {**s["trained"], "success_rate": 0.5}}}  # no base: no row
        (tmp_path / f"poker-s{seed}" / "summary.json").write_text(json.dumps(s))
    table.main(tmp_path)
    out = capsys.readouterr().out
    assert "poker over its 2 seed(s), test deals against each opponent" in out
    assert "| frozen start (trained against) | 50.0% | 87.5% | +37.5 |" in out
    assert "| random | 18.8% | 37.5% | +18.8 |" in out  # gains +25.0 and +12.5
    assert "| league |" not in out.split("over its 2 seed(s)")[1].split("seed 0, test deals")[0]
    assert "Mean gain over 2 task(s)" in out and "+27.3 points" in out  # (17.2 + 37.5) / 2
    assert "counted against the uniformly random legal player it never trained against: +18.0 points" in out


def test_the_study_gem_teacher_guesses_legally_without_strategy(tokenizer):
    """The GEM row's format cold start: its teacher guessed a random number in 1..50 after the first turn (it
    saw only the last observation, which holds no range), so it repeated and left the range, and the policy
    it taught repeated one guess all game. A teacher that takes ``messages`` now gets the dialog: this one
    guesses uniformly among the numbers in range not guessed yet (legal moves, no use of the hints)."""
    require("gem")
    import asyncio
    import importlib.util
    import re
    from pathlib import Path

    from ludic.agents.agent import Agent
    from ludic.context import make_context
    from ludic.inference.client import FunctionClient
    from ludic.interaction import SingleAgentProtocol
    from ludic.recipes.format_demos import demo_teacher
    from ludic.rollouts.engine import RolloutEngine
    from ludic.types import EnvSpec, RolloutRequest

    spec = importlib.util.spec_from_file_location(
        "study_teachers", Path(__file__).parents[1] / "examples" / "study" / "teachers.py")
    teachers = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(teachers)
    teacher = demo_teacher(teachers.gem_guess)
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(
        Agent(FunctionClient(tokenizer, teacher), make_context("full")))})
    reqs = [RolloutRequest(EnvSpec("gem:game:GuessTheNumber-v0-random", {"reward": "success"}), env_seed=s)
            for s in range(40)]
    rollouts = asyncio.run(engine.generate_rollouts(reqs))
    wins = 0
    for r in rollouts:
        state = json.loads(r.meta["reset_info"]["instance"])
        guesses = [int(re.fullmatch(r"\\boxed\{(\d+)\}", s.action).group(1)) for s in r.steps]
        assert len(set(guesses)) == len(guesses), guesses  # never a repeat
        assert all(state["min_number"] <= g <= state["max_number"] for g in guesses), (state, guesses)
        won = r.steps[-1].info["success"] == 1.0
        assert won == (guesses[-1] == state["game_number"]) and (won or len(guesses) == state["max_turns"])
        wins += won
    assert 0 < wins < 30  # chance: turns / range size, about a quarter; a bisecting player wins every game
    seen = []
    demo_teacher(lambda messages: seen.append(len(messages)) or "x")([{"role": "user", "content": "a"}] * 3)
    demo_teacher(lambda obs: seen.append(obs) or "x")([{"role": "user", "content": "a"}] * 3)
    assert seen == [3, "a"]  # a teacher named `messages` gets the dialog, any other the last observation
