"""Exact evaluation of an LLM policy on small OpenSpiel games: its action probabilities at every
information state, the exploitability (NashConv) of that policy, and for small solved
perfect-information games the share of value-preserving moves.

The policy is read from the model, not sampled: at each information state the prompt is what
``OpenSpielEnv`` shows that seat (the rules as system prompt, then the turn text: a history-free
view, which for kuhn_poker and leduc_poker is the whole information state), and the probability
of legal action ``a`` is the model's probability of answering ``"a"`` and ending its turn,
renormalised over the legal actions (mass on other answers is dropped). ``temperature``
divides the logits as the sampler would.

    env = OpenSpielEnv(game="kuhn_poker")
    table = policy_table(env, model, tokenizer)   # {info_state: [(action, prob), ...]}
    nash_conv(env.game, table)                     # 0 at a Nash equilibrium
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import torch

from ludic.envs.openspiel import OpenSpielEnv

PolicyTable = dict[str, list[tuple[int, float]]]


def info_state_key(state: Any, player: int) -> str:
    return state.information_state_string(player)


def board_key(state: Any, player: int) -> str:
    """The position itself (``str(state)``): in a perfect-information game whose value and
    prompt depend on the position only (tic_tac_toe), many histories share one."""
    return f"{player}|{state}"


def decision_states(game: Any, limit: int = 400_000, key: Any = info_state_key) -> Iterator[tuple[Any, int]]:
    """One state per ``key`` (default: per information state) of ``game``, depth-first over
    every chance outcome and action, with the player to move. Refuses games with more than
    ``limit`` decision nodes."""
    seen: set[str] = set()
    stack = [game.new_initial_state()]
    visited = 0
    while stack:
        s = stack.pop()
        if s.is_terminal():
            continue
        if s.is_chance_node():
            stack.extend(s.child(a) for a, _ in s.chance_outcomes())
            continue
        if s.is_simultaneous_node():
            raise ValueError("decision_states: simultaneous-move games are not supported")
        visited += 1
        if visited > limit:
            raise ValueError(f"{game} has more than {limit} decision states: too large to evaluate exactly")
        p = s.current_player()
        k = key(s, p)
        if k in seen:
            if key is board_key:
                continue  # the same position: its subtree is walked from the first one
        else:
            seen.add(k)
            yield s, p
        stack.extend(s.child(a) for a in s.legal_actions())


def turn_messages(env: OpenSpielEnv, state: Any, seat: int) -> list[dict[str, str]]:
    """The history-free prompt seat ``seat`` gets at ``state``: the rules, then the turn text."""
    env.state = state
    return [{"role": "system", "content": env.suggested_sysprompt},
            {"role": "user", "content": env.turn_text(seat)}]


@torch.no_grad()
def policy_table(env: OpenSpielEnv, model: Any, tokenizer: Any, *, temperature: float = 1.0,
                 micro_token_budget: int = 8192, key: Any = info_state_key) -> PolicyTable:
    """``{key(state): [(action, probability), ...]}`` of the model over the legal ids, for every
    decision state (default key: the information state, what ``nash_conv`` needs)."""
    from ludic.data.offline import sft_item
    from ludic.training.microbatch import collate, split_by_token_budget
    from ludic.training.scoring import score_actions
    from ludic.training.packed import packable

    states = list(decision_states(env.game, key=key))
    items = []
    for s, p in states:
        msgs = turn_messages(env, s, p)
        k = key(s, p)
        for a in s.legal_actions(p):
            item = sft_item({"messages": msgs, "completion": str(a)}, tokenizer)
            items.append(item.__class__(item.prompt_ids, item.completion_ids, 1.0, temperature=temperature,
                                        meta={"key": k, "action": int(a)}))
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    logp: dict[tuple[str, int], float] = {}
    for group in split_by_token_budget(items, micro_token_budget, flat=packable(model)):
        mb = collate(group, tokenizer.pad_token_id, device)
        lp, _ = score_actions(model, mb)
        per_item = torch.zeros(len(group), dtype=torch.float64).index_add_(0, mb.seg.cpu(), lp.double().cpu())
        for it, v in zip(group, per_item.tolist()):
            logp[(it.meta["key"], it.meta["action"])] = v
    model.train(was_training)
    table: PolicyTable = {}
    for s, p in states:
        k = key(s, p)
        acts = [int(a) for a in s.legal_actions(p)]
        vals = [logp[(k, a)] for a in acts]
        top = max(vals)
        weights = [math.exp(v - top) for v in vals]
        total = sum(weights)
        table[k] = [(a, w / total) for a, w in zip(acts, weights)]
    return table


def nash_conv(game: Any, table: PolicyTable) -> float:
    """Sum over players of what a best response gains against ``table`` (pyspiel, exact)."""
    import pyspiel

    return float(pyspiel.nash_conv(game, pyspiel.TabularPolicy(table)))


def uniform_table(game: Any) -> PolicyTable:
    """The uniformly random policy (a reference point: kuhn_poker's NashConv is 11/12)."""
    return {s.information_state_string(p): [(int(a), 1.0 / len(s.legal_actions(p))) for a in s.legal_actions(p)]
            for s, p in decision_states(game)}


def solved_values(game: Any) -> dict[str, float]:
    """Minimax value (for player 0) of every state of a small two-player zero-sum
    perfect-information game, keyed by ``board_key``."""
    cache: dict[str, float] = {}

    def value(s: Any) -> float:
        key = board_key(s, s.current_player())
        if key in cache:
            return cache[key]
        if s.is_terminal():
            v = float(s.returns()[0])
        elif s.is_chance_node():
            v = sum(pr * value(s.child(a)) for a, pr in s.chance_outcomes())
        else:
            vals = [value(s.child(a)) for a in s.legal_actions()]
            v = max(vals) if s.current_player() == 0 else min(vals)
        cache[key] = v
        return v

    value(game.new_initial_state())
    return cache


def value_preserving_rate(game: Any, table: PolicyTable) -> dict[str, float]:
    """Over every position of a solved perfect-information game (``table`` keyed by
    ``board_key``): the share where the policy's most likely action keeps the position's game
    value, and the expected share under the policy's probabilities."""
    import pyspiel

    if game.get_type().information != pyspiel.GameType.Information.PERFECT_INFORMATION:
        raise ValueError("value_preserving_rate needs a perfect-information game")
    values = solved_values(game)
    greedy = expected = 0.0
    n = 0
    for s, p in decision_states(game, key=board_key):
        best = values[board_key(s, p)]
        probs = dict(table[board_key(s, p)])
        keeps = {a for a in s.legal_actions() if abs(values[_key(s.child(a))] - best) < 1e-9}
        greedy += max(probs, key=probs.get) in keeps
        expected += sum(pr for a, pr in probs.items() if a in keeps)
        n += 1
    return {"value_preserving": greedy / n, "value_preserving_expected": expected / n, "states": n}


def _key(state: Any) -> str:
    return board_key(state, state.current_player())
