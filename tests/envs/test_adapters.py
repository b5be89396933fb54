"""The ecosystem adapters against the real packages (TextArena, reasoning-gym, GEM): scripted players
through Ludic's own agents and protocols, the packages' own rewards and rules, errors as failed rollouts."""

import asyncio
import re

import pytest
from conftest import require

from ludic.agents.agent import Agent
from ludic.context import make_context
from ludic.envs.registry import make_env
from ludic.inference.client import FunctionClient
from ludic.interaction import MultiAgentProtocol, SingleAgentProtocol
from ludic.rollouts.engine import RolloutEngine
from ludic.types import EnvSpec, RolloutRequest


def bisect(pattern, wrap):
    """A guess-the-number player: bisects on the game's higher/lower hints (read from the whole dialog)."""

    def reply(messages):
        text = "\n".join(m["content"] for m in messages if m["role"] != "system")
        lo, hi = map(int, re.search(pattern, text).groups())
        for guess, hint in re.findall(r"(\d+)\D{0,60}?\b(higher|lower)\b", text):
            if hint == "higher":
                lo = max(lo, int(guess) + 1)
            else:
                hi = min(hi, int(guess) - 1)
        return wrap((lo + hi) // 2)

    return reply


def run(engine, reqs):
    return asyncio.run(engine.generate_rollouts(reqs))


def test_textarena_single_player_game_through_the_protocol(tokenizer):
    require("textarena")
    client = FunctionClient(tokenizer, bisect(r"between (\d+) and (\d+)", lambda g: f"My guess: [{g}]"))
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(Agent(client, make_context("last")))})
    (r,) = run(engine, [RolloutRequest(EnvSpec("textarena:GuessTheNumber-v0", {"seats": "seed"}), env_seed=5)])
    assert not r.meta.get("failed"), r.meta
    last = r.steps[-1]
    assert last.terminated and last.reward == 1.0 and last.info["outcome"] == "win" and last.info["success"] == 1.0
    assert 1 <= len(r.steps) <= 5  # bisection over 1..20
    assert "[GAME]" in r.steps[0].prev_obs and "Guess The Number" in r.steps[0].prev_obs


def test_textarena_new_observations_make_an_episode_one_training_sequence(tokenizer):
    """observations="new": after the first turn an agent sees only what the game added since its last
    turn, in a growing dialog, so every turn's prompt extends the previous one token for token and the
    episode trains as one sequence (the whole history read once), where TextArena's whole-game text
    (observations="full", the default) gives one item per turn, each carrying the history again."""
    require("textarena")
    from ludic.rollouts.batch import build_saw_items
    from ludic.rollouts.credit import MonteCarloReturn

    def play(observations, context):
        client = FunctionClient(tokenizer, bisect(r"between (\d+) and (\d+)", lambda g: f"[{g}]"))
        env = make_env(EnvSpec("textarena:GuessTheNumber-v0", {"observations": observations}))
        assert env.preferred_context == context
        engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(Agent(client, make_context(context)))})
        (r,) = run(engine, [RolloutRequest(EnvSpec("textarena:GuessTheNumber-v0", {"observations": observations}),
                                           env_seed=7)])
        return r

    full, new = play("full", "last"), play("new", "full")
    assert len(new.steps) == len(full.steps) >= 3 and new.total_reward == full.total_reward == 1.0
    assert "Guess The Number" in new.steps[0].prev_obs and "Guess The Number" not in new.steps[1].prev_obs
    assert new.steps[1].prev_obs in full.steps[1].prev_obs and re.search(r"higher|lower", new.steps[1].prev_obs)
    [item] = build_saw_items([new], MonteCarloReturn())
    assert item.meta["turns"] == len(new.steps)
    per_turn = build_saw_items([full], MonteCarloReturn())
    assert len(per_turn) == len(full.steps)
    assert item.num_tokens < sum(it.num_tokens for it in per_turn)
    with pytest.raises(ValueError, match="observations must be 'full' or 'new'"):
        make_env(EnvSpec("textarena:GuessTheNumber-v0", {"observations": "delta"}))


def test_textarena_new_observations_are_per_player_in_a_two_player_game():
    """Each player's dialog gets what the game added since that player's own last turn: the rules
    once, and every line of the whole-game text it would have seen (the opponent's moves included)."""
    require("textarena")
    from ludic.envs.textarena_env import TextArenaEnv

    def play(observations):
        env = TextArenaEnv("KuhnPoker-v0", observations=observations, max_rounds=2)
        env.reset(seed=3)
        seen = {}
        while env.active_agents:
            (a,) = env.active_agents
            seen.setdefault(a, []).append(env.observe(a))
            text = seen[a][-1].rsplit("available actions", 1)[-1]
            env.step({a: "[bet]" if "'[bet]'" in text else "[call]"})
        return seen

    new, full = play("new"), play("full")
    assert new.keys() == full.keys() == {"player_0", "player_1"}
    for a, obs in new.items():
        assert len(obs) == len(full[a]) >= 2 and obs[0] == full[a][0]
        assert "Game Rules" in obs[0] and all("Game Rules" not in o for o in obs[1:])
        assert set(full[a][-1].splitlines()) <= set("\n".join(obs).splitlines())
        assert sum(map(len, obs)) < sum(map(len, full[a]))


def test_textarena_two_player_game_keeps_its_rules_and_rewards(tokenizer):
    """Tic-tac-toe, both seats scripted: player 0 takes cells in order, player 1 repeats an occupied cell
    (TextArena's own rule: an invalid move loses), so player 0 gets +1 and player 1 gets -1."""
    require("textarena")

    def first_free(messages):
        board = messages[-1]["content"].rsplit("Available Moves:", 1)[-1]
        cell = re.findall(r"\[(\d)\]", board)[0]
        return f"[{cell}]"

    agents = {"player_0": Agent(FunctionClient(tokenizer, first_free), make_context("last")),
              "player_1": Agent(FunctionClient(tokenizer, lambda m: "[0]"), make_context("last"))}
    engine = RolloutEngine({"two": lambda: MultiAgentProtocol(agents, frozen={"player_1"})})
    rollouts = run(engine, [RolloutRequest(EnvSpec("textarena:TicTacToe-v0"), protocol="two", env_seed=1)])
    by = {r.meta["agent_id"]: r for r in rollouts}
    assert by["player_0"].total_reward == 1.0 and by["player_1"].total_reward == -1.0
    assert by["player_1"].steps[-1].info["invalid_move"] is True and by["player_0"].steps[-1].info["outcome"] == "win"
    assert by["player_1"].meta["trainable"] is False


def test_a_seat_whose_game_ends_before_its_first_turn_keeps_the_outcome(tokenizer):
    """Was: Kuhn poker where player 1 moves first and forfeits by two invalid answers ended before player 0's
    first turn, and player 0's rollout had no step, reward 0 and truncation "max_steps": a win recorded as a
    0 (12 of the trained seat's 64 held-out games against the base model on the dialog view). Now its
    rollout has one step with no turn (no tokens, nothing to train) carrying the game's reward and outcome."""
    require("textarena")
    from ludic.rollouts.batch import build_saw_items
    from ludic.rollouts.credit import MonteCarloReturn

    agents = {"player_0": Agent(FunctionClient(tokenizer, lambda m: "[check]"), make_context("full")),
              "player_1": Agent(FunctionClient(tokenizer, lambda m: "no idea"), make_context("full"))}
    engine = RolloutEngine({"two": lambda: MultiAgentProtocol(agents, frozen={"player_1"})})
    spec = EnvSpec("textarena:KuhnPoker-v0", {"max_rounds": 1})
    seed = next(s for s in range(50) if _first_to_move(spec, s) == "player_1")
    by = {r.meta["agent_id"]: r for r in run(engine, [RolloutRequest(spec, protocol="two", env_seed=seed)])}
    loser, winner = by["player_1"], by["player_0"]
    assert loser.total_reward == -1.0 and loser.steps[-1].info["invalid_move"]
    (step,) = winner.steps
    assert winner.total_reward == 1.0 and step.terminated and step.trace is None and step.info["outcome"] == "win"
    assert step.info["no_turn"] and winner.meta["truncation_reason"] is None
    assert build_saw_items([winner], MonteCarloReturn()) == []


@pytest.mark.parametrize("seats", [[0], "seed"])
@pytest.mark.parametrize("protocol", ["single", "multi"])
def test_a_game_the_opponent_ends_before_the_agents_first_turn_keeps_the_outcome(tokenizer, seats, protocol):
    """Was: with ``seats=[k]`` or ``"seed"`` and an ``opponent``, ``reset`` dropped what ``_advance`` returned, so
    a Kuhn poker game the opponent forfeits (two invalid answers) before the agent's first turn gave a rollout
    with no step, reward 0 and truncation "max_steps". Now reset carries the outcome (``ended_at_reset``) and
    either protocol records it as one no-turn step: the win, its reward and info, nothing to train."""
    require("textarena")
    from ludic.envs.registry import register_env
    from ludic.envs.textarena_env import TextArenaEnv

    def make():
        return TextArenaEnv("KuhnPoker-v0", seats=seats, opponent=lambda player, obs: "no idea", max_rounds=1)

    aid = make().agent_ids[0]
    seed = next(s for s in range(50) if not _reset_active(make(), s))  # the opponent moves first and forfeits
    register_env("test_ta_forfeit", make)
    client = FunctionClient(tokenizer, lambda m: "[check]")
    build = {"single": lambda: SingleAgentProtocol(Agent(client, make_context("full"))),
             "multi": lambda: MultiAgentProtocol({aid: Agent(client, make_context("full"))})}[protocol]
    (r,) = run(RolloutEngine({"p": build}), [RolloutRequest(EnvSpec("test_ta_forfeit"), protocol="p", env_seed=seed)])
    assert not r.meta.get("failed"), r.meta
    (step,) = r.steps
    assert step.no_turn and step.terminated and step.trace is None and r.total_reward == 1.0
    assert step.info["outcome"] == "win" and step.info["success"] == 1.0 and r.meta["truncation_reason"] is None


def _reset_active(env, seed):
    env.reset(seed=seed)
    return env.active_agents


def _first_to_move(spec, seed):
    env = make_env(spec)
    env.reset(seed=seed)
    return env.active_agents[0]


def test_textarena_errors_are_failed_rollouts_and_bad_ids_are_named(tokenizer):
    require("textarena")
    with pytest.raises(ValueError, match="TextArena has no game 'TicTacToe-v9'.*TicTacToe-v0"):
        make_env(EnvSpec("textarena:TicTacToe-v9"))
    with pytest.raises(ValueError, match="leaves players to an opponent"):
        make_env(EnvSpec("textarena:TicTacToe-v0", {"seats": [0]}))

    def crashing_opponent(player, obs):
        raise RuntimeError("opponent engine down")

    from ludic.envs.registry import register_env
    from ludic.envs.textarena_env import TextArenaEnv

    register_env("test_ta_crash", lambda: TextArenaEnv("TicTacToe-v0", seats="seed", opponent=crashing_opponent))
    client = FunctionClient(tokenizer, lambda m: "[4]")
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(Agent(client, make_context("last")))})
    rollouts = run(engine, [RolloutRequest(EnvSpec("test_ta_crash"), env_seed=s) for s in (0, 1)])
    assert all(r.meta["failed"] and "opponent engine down" in r.meta["error"] for r in rollouts)


def test_reasoning_gym_scores_with_the_datasets_own_grader_on_disjoint_splits(tokenizer):
    require("reasoning_gym")
    train = make_env(EnvSpec("reasoning_gym:leg_counting", {"train_size": 50, "eval_size": 20}))
    held = make_env(EnvSpec("reasoning_gym:leg_counting", {"train_size": 50, "eval_size": 20, "split": "eval"}))
    train_idx = {train.reset(seed=s)["agent_0"][1]["index"] for s in range(200)}
    eval_idx = {held.reset(seed=s)["agent_0"][1]["index"] for s in range(200)}
    assert train_idx == set(range(50)) and eval_idx == set(range(50, 70))

    answers = {}

    def solver(messages):
        return f"Counting... <answer>{answers[messages[-1]['content']]}</answer>"

    env = make_env(EnvSpec("reasoning_gym:leg_counting"))
    obs, _ = env.reset(seed=3)["agent_0"]
    answers[obs] = env.entry["answer"]
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(Agent(FunctionClient(tokenizer, solver)))})
    (r,) = run(engine, [RolloutRequest(EnvSpec("reasoning_gym:leg_counting"), env_seed=3)])
    assert r.total_reward == 1.0 and r.steps[-1].info["success"] == 1.0 and len(r.steps) == 1

    out = env.step({"agent_0": "about twenty legs"})["agent_0"]
    assert out.reward == 0.0 and out.info["no_answer"] is True
    env.reset(seed=3)  # answer="auto": without a tag, a numeric reference is read as the reply's last number
    assert env.step({"agent_0": f"So 3 + 4 ... the total is {answers[obs]}."})["agent_0"].reward == 1.0
    tag_only = make_env(EnvSpec("reasoning_gym:leg_counting", {"answer": "tag"}))
    tag_only.reset(seed=3)
    assert tag_only.step({"agent_0": f"the total is {answers[obs]}"})["agent_0"].info["no_answer"] is True
    with pytest.raises(ValueError, match="no dataset 'leg_countin'"):
        make_env(EnvSpec("reasoning_gym:leg_countin"))


def test_reasoning_gym_takes_a_list_valued_config_from_env_kwargs():
    """Was: ``--env-kwargs '{"config": {"operators": ["+"]}}'`` raised ``TypeError: unhashable type: 'list'``
    in the dataset cache (its key held the config's values). Now the key is the config's canonical JSON:
    the dataset gets the list, and an equal config (keys in another order) reuses the cached dataset."""
    require("reasoning_gym")
    config = {"operators": ["+"], "min_terms": 2, "max_terms": 3}
    env = make_env(EnvSpec("reasoning_gym:basic_arithmetic", {"config": config, "train_size": 20, "eval_size": 4}))
    assert env.dataset.config.operators == ["+"]
    sums = [env.reset(seed=s)["agent_0"][0].splitlines()[0] for s in range(20)]  # "Calculate 5 + 3."
    assert all("+" in q and not set("*/") & set(q) for q in sums), sums  # "-" also writes a negative term
    env.reset(seed=3)
    assert env.step({"agent_0": f"<answer>{env.entry['answer']}</answer>"})["agent_0"].reward == 1.0
    again = make_env(EnvSpec("reasoning_gym:basic_arithmetic",
                             {"config": dict(reversed(config.items())), "train_size": 20, "eval_size": 4}))
    assert again.dataset is env.dataset


def test_gem_env_through_the_generic_gymnasium_wrapper(tokenizer):
    require("gem")
    client = FunctionClient(tokenizer, bisect(r"between (\d+) and (\d+)", lambda g: f"\\boxed{{{g}}}"))
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(Agent(client, make_context("full")))})
    (r,) = run(engine, [RolloutRequest(EnvSpec("gem:game:GuessTheNumber-v0-easy"), env_seed=7)])
    assert not r.meta.get("failed"), r.meta
    assert r.steps[-1].terminated and r.steps[-1].reward == 1.0 and r.steps[-1].info["success"] == 1.0
    assert r.meta["truncation_reason"] is None


def test_a_gem_game_pays_success_only_when_asked(tokenizer):
    """GEM's guess-the-number pays a last guess by its distance to the secret (``1 - distance / range``), so a
    policy that repeats one middle guess every turn earned about 0.75 an episode, as much as guessing at random
    and more than most losses: the study's GEM runs learned to repeat. ``{"reward": "success"}`` pays the win
    only (1 or 0, the env's own reward kept in the step's info as ``env_reward``); the default stays the env's."""
    require("gem")

    def repeat(messages):
        lo, hi = map(int, re.search(r"between (\d+) and (\d+)", next(
            m["content"] for m in messages if m["role"] == "user")).groups())
        return f"\\boxed{{{(lo + hi) // 2}}}"

    def play(kwargs, reply):
        engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(
            Agent(FunctionClient(tokenizer, reply), make_context("full")))})
        reqs = [RolloutRequest(EnvSpec("gem:game:GuessTheNumber-v0-random", kwargs), env_seed=s) for s in range(12)]
        return run(engine, reqs)

    shaped, plain = play({}, repeat), play({"reward": "success"}, repeat)
    lost = [i for i, r in enumerate(plain) if r.steps[-1].info["success"] == 0.0]
    assert lost and all(shaped[i].total_reward > 0 for i in lost)  # the env's default: a loss pays
    assert all(plain[i].total_reward == 0.0 and plain[i].steps[-1].info["env_reward"] > 0 for i in lost)
    assert all(r.total_reward == r.steps[-1].info["success"] for r in plain)
    won = play({"reward": "success"}, bisect(r"between (\d+) and (\d+)", lambda g: f"\\boxed{{{g}}}"))
    assert all(r.total_reward == 1.0 and r.steps[-1].info["success"] == 1.0 for r in won)
    with pytest.raises(ValueError, match="reward must be 'env' or 'success'"):
        make_env(EnvSpec("gem:game:GuessTheNumber-v0-random", {"reward": "win"}))


def test_an_env_from_an_import_path_and_a_gymnasium_env_that_raises(tokenizer):
    from ludic.envs.gym_text import GymTextEnv

    env = make_env(EnvSpec("conftest:VowelEnv"))
    assert env.reset(seed=0)["agent_0"][0] == "Say something."

    class Broken:  # a Gymnasium-API env whose step fails
        def reset(self, seed=None):
            return "start", {}

        def step(self, action):
            raise ValueError("simulator crashed")

    from ludic.envs.registry import register_env

    register_env("test_broken_gym", lambda: GymTextEnv(Broken))
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(
        Agent(FunctionClient(tokenizer, lambda m: "go")))})
    (r,) = run(engine, [RolloutRequest(EnvSpec("test_broken_gym"))])
    assert r.meta["failed"] and "simulator crashed" in r.meta["error"] and r.meta["error_stage"] == "env.step"
    with pytest.raises(TypeError, match="Gymnasium-style env with reset"):
        GymTextEnv(object())


def test_textarena_game_options_reach_the_game_and_a_bad_reward_names_the_game(tokenizer):
    """``--env-kwargs '{"max_rounds": 1}'`` is a game option (it reached the adapter's constructor and
    raised a TypeError); ThreeCardMonte-v0's invalid move hands its reason over as the reward (the game
    swaps set_invalid_move's arguments): a failed rollout whose error says which game gave what."""
    require("textarena")
    env = make_env(EnvSpec("textarena:KuhnPoker-v0", {"max_rounds": 1}))
    assert env.env_kwargs == {"max_rounds": 1}
    env.reset(seed=3)
    assert env.env.max_rounds == 1
    both = make_env(EnvSpec("textarena:KuhnPoker-v0", {"max_rounds": 2, "env_kwargs": {"max_rounds": 5}}))
    assert both.env_kwargs == {"max_rounds": 2}

    client = FunctionClient(tokenizer, lambda m: "no idea")
    engine = RolloutEngine({"single_agent": lambda: SingleAgentProtocol(Agent(client, make_context("last")))})
    (r,) = run(engine, [RolloutRequest(EnvSpec("textarena:ThreeCardMonte-v0"), env_seed=0)])
    assert r.meta["failed"]
    assert "ThreeCardMonte-v0" in r.meta["error"] and "non-numeric reward" in r.meta["error"]
