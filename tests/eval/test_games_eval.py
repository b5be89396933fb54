"""Exact evaluation on OpenSpiel games: the LLM's policy table, NashConv, value-preserving moves."""

import math

import pytest
from conftest import python_nash_conv, require
import torch

pyspiel = require("pyspiel")

from ludic.envs.openspiel import OpenSpielEnv  # noqa: E402
from ludic.eval.games import (  # noqa: E402
    board_key,
    decision_states,
    nash_conv,
    policy_table,
    turn_messages,
    uniform_table,
    value_preserving_rate,
)


def test_reference_values_of_known_policies():
    kuhn = pyspiel.load_game("kuhn_poker")
    assert nash_conv(kuhn, uniform_table(kuhn)) == pytest.approx(11 / 12)
    # Kuhn's equilibrium family at alpha = 0 (player 0 never bluffs first, ...): NashConv 0
    eq = {}
    for s, p in decision_states(kuhn):
        key, card, hist = s.information_state_string(p), s.information_state_string(p)[0], s.history()[2:]
        bet = {  # probability of action 1 (bet / call)
            ("0", ()): 0.0, ("1", ()): 0.0, ("2", ()): 0.0,
            ("0", (0,)): 1 / 3, ("1", (0,)): 0.0, ("2", (0,)): 1.0,
            ("0", (1,)): 0.0, ("1", (1,)): 1 / 3, ("2", (1,)): 1.0,
            ("0", (0, 1)): 0.0, ("1", (0, 1)): 1 / 3, ("2", (0, 1)): 1.0,
        }[(card, tuple(hist))]
        eq[key] = [(0, 1 - bet), (1, bet)]
    assert nash_conv(kuhn, eq) == pytest.approx(0.0, abs=1e-9)
    assert len(list(decision_states(pyspiel.load_game("leduc_poker")))) == 936


def test_value_preserving_rate_of_the_solver_is_one():
    ttt = pyspiel.load_game("tic_tac_toe")
    from ludic.eval.games import solved_values

    values = solved_values(ttt)
    table = {}
    for s, p in decision_states(ttt, key=board_key):
        sign = 1 if p == 0 else -1
        best = max(s.legal_actions(), key=lambda a: sign * values[board_key(s.child(a), s.child(a).current_player())])
        table[board_key(s, p)] = [(a, float(a == best)) for a in s.legal_actions()]
    out = value_preserving_rate(ttt, table)
    assert out["states"] == 4520 and out["value_preserving"] == 1.0 == out["value_preserving_expected"]
    assert value_preserving_rate(ttt, {k: [(a, 1 / len(v)) for a, _ in v] for k, v in table.items()})[
        "value_preserving_expected"] < 0.8


def test_llm_policy_table_is_the_models_answer_distribution(tiny_model_dir):
    from ludic.training.lora import load_policy

    model, tok = load_policy(tiny_model_dir, dtype="float32")
    env = OpenSpielEnv(game="kuhn_poker")
    table = policy_table(env, model, tok)
    assert len(table) == 12
    for dist in table.values():
        assert [a for a, _ in dist] == [0, 1] and math.isclose(sum(p for _, p in dist), 1.0)
    # the exact NashConv of that table, by OpenSpiel's Python best responses too; uniform play is 11/12
    assert nash_conv(env.game, table) == pytest.approx(python_nash_conv(env.game, table), abs=1e-9)
    assert nash_conv(env.game, table) != pytest.approx(11 / 12)  # the model's own distribution, not uniform
    # one entry against a plain forward pass: P(answer "a" + end of turn), renormalised
    s, p = next(iter(decision_states(env.game)))
    msgs = turn_messages(env, s, p)
    from ludic.data.offline import sft_item

    logps = []
    for a in (0, 1):
        it = sft_item({"messages": msgs, "completion": str(a)}, tok)
        ids = torch.tensor([list(it.prompt_ids) + list(it.completion_ids)])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float().log_softmax(-1)
        P = len(it.prompt_ids)
        logps.append(sum(float(logits[P - 1 + j, t]) for j, t in enumerate(it.completion_ids)))
    want = math.exp(logps[1]) / (math.exp(logps[0]) + math.exp(logps[1]))
    assert dict(table[s.information_state_string(p)])[1] == pytest.approx(want, rel=1e-4)
