"""Credit assignment: rollouts -> one scalar weight per (rollout id, step index).

An algorithm is a credit assigner plus a loss. The weight becomes the SAW
item's ``weight`` (the advantage of that completion).

    MonteCarloReturn(gamma)   G_t = r_t + gamma * G_{t+1}  (reward-to-go)
    GroupNormalizedReturn     A = R - mean(R_group)  [/ std]   or leave-one-out (RLOO)
    PerStepReward             w_t = r_t
    EpisodicReturn            w_t = sum_t r_t for every step
    ConstantCredit            w_t = c  (SFT / behaviour cloning)
    GAE(values, gamma, lam)   A_t = sum_k (gamma lam)^k delta_{t+k}, with a learner-side critic (PPO)
    MMDTarget(eta, alpha)     w = q(a|s) on one turn per (state, action): a per-information-state
                              target policy (magnetic mirror descent) for a weighted NLL (small games)
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence

from ludic.types import Rollout, Step

StepKey = tuple[str, int]


class CreditAssigner(Protocol):
    """Maps rollouts to per-step weights."""

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]: ...


@dataclass(frozen=True)
class MonteCarloReturn:
    """Discounted reward-to-go, including the current step's reward."""

    gamma: float = 1.0

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        out: dict[StepKey, float] = {}
        for r in rollouts:
            g = 0.0
            for s in reversed(r.steps):
                g = s.reward + self.gamma * g
                out[(r.id, s.index)] = g
        return out


@dataclass(frozen=True)
class PerStepReward:
    """Each step is credited with its own reward."""

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        return {(r.id, s.index): s.reward for r in rollouts for s in r.steps}


@dataclass(frozen=True)
class EpisodicReturn:
    """Every step gets the episode's total reward."""

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        return {(r.id, s.index): r.total_reward for r in rollouts for s in r.steps}


@dataclass(frozen=True)
class ConstantCredit:
    """Every step gets the same weight (SFT is offline RL with weight 1)."""

    value: float = 1.0

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        return {(r.id, s.index): self.value for r in rollouts for s in r.steps}


def group_advantages(returns: Sequence[float], mode: str = "mean", eps: float = 1e-6) -> list[float]:
    """Advantages within one group of returns.

    mode: "mean" (R - mean), "mean_std" ((R - mean) / (std + eps), population std),
    or "loo" (leave-one-out baseline: R_i - mean_{j != i} R_j, as in RLOO).
    A group of one, or of equal returns, has advantage exactly 0.
    """
    n = len(returns)
    if n <= 1 or max(returns) == min(returns):  # exactly 0, not rounding noise / eps
        return [0.0] * n
    mean = sum(returns) / n
    if mode == "mean":
        return [x - mean for x in returns]
    if mode == "mean_std":
        std = math.sqrt(sum((x - mean) ** 2 for x in returns) / n)
        return [(x - mean) / (std + eps) for x in returns]
    if mode == "loo":
        total = sum(returns)
        return [x - (total - x) / (n - 1) for x in returns]
    raise ValueError(f"group advantage mode must be 'mean', 'mean_std' or 'loo', got {mode!r}")


@dataclass(frozen=True)
class GroupNormalizedReturn:
    """GRPO / RLOO credit: compare each episode's return with its group's.

    Groups are rollouts sharing ``meta["group_id"]`` and ``meta["agent_id"]``
    (so in self-play each seat is normalised with itself). Groups may have
    any size: a failed episode shrinks its group instead of breaking the batch.
    Every step of a rollout gets the rollout's advantage. A rollout without a
    group id is an error: alone in its group it would get advantage 0, i.e. a
    silent zero gradient (use ``GRPORequestStrategy`` to make groups).

    Args:
        mode: "mean", "mean_std" (GRPO's default scaling) or "loo" (RLOO).
        positive_only: clamp advantages at 0 (train only on better-than-average episodes).
        explored_gains_only: clamp at 0 only the exploring rollouts (``meta["explore"]``: moves the policy did
            not sample, ``GRPORequestStrategy(explore=k)``): one that did better than its group is learned from,
            one that did worse is not pushed down (that would move the policy's mass anywhere, illegal moves included).
    """

    mode: str = "mean_std"
    positive_only: bool = False
    explored_gains_only: bool = False
    eps: float = 1e-6
    last_stats: dict = field(default_factory=dict, compare=False, repr=False)
    """The last batch's ``zero_var_group_share`` (groups whose episodes all scored the same: their
    advantages are 0, they teach nothing) and ``groups`` (the batch source logs them)."""
    needs_groups = True
    """Batch sources check this: rollouts must come in groups (GRPORequestStrategy)."""

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        groups: dict[tuple, list[Rollout]] = defaultdict(list)
        for r in rollouts:
            gid = r.meta.get("group_id")
            if gid is None:
                raise ValueError(
                    f"GroupNormalizedReturn: rollout {r.id} has no group_id, so its advantage would be 0 "
                    "(a silent zero gradient). Expand requests with GRPORequestStrategy(group_size), or give "
                    "RolloutRequests a group_id, or use a credit that needs no groups (mc_return, episodic)."
                )
            groups[(gid, r.meta.get("agent_id"))].append(r)
        out: dict[StepKey, float] = {}
        flat = 0
        for members in groups.values():
            returns = [r.total_reward for r in members]
            flat += max(returns) == min(returns)
            advs = group_advantages(returns, self.mode, self.eps)
            for r, a in zip(members, advs):
                if self.positive_only or (self.explored_gains_only and r.meta.get("explore")):
                    a = max(a, 0.0)
                for s in r.steps:
                    out[(r.id, s.index)] = a
        self.last_stats.clear()
        self.last_stats.update(zero_var_group_share=flat / len(groups) if groups else 0.0, groups=len(groups))
        return out


def returns_to_go(rollouts: Sequence[Rollout], trained: Callable[[StepKey, Step], bool],
                  gamma: float = 1.0) -> dict[StepKey, float]:
    """G_t = r_t + gamma * G_{t+1} of every trained turn (``trained(key, step)``); an untrained turn's
    reward (a retry without tokens, a forfeit) goes to the trained turn before it."""
    out: dict[StepKey, float] = {}
    for r in rollouts:
        g, carried = 0.0, 0.0
        for s in reversed(r.steps):
            key = (r.id, s.index)
            if not trained(key, s):
                carried += s.reward
                continue
            g = s.reward + carried + gamma * g
            carried = 0.0
            out[key] = g
    return out


StepValues = Callable[[Sequence[Rollout]], dict[StepKey, float]]
"""``rollouts -> {(rollout id, step index): V(s_t)}``: the learner's no-grad value pass
(``ludic.training.value.ValueFunction``)."""


class GAE:
    """Generalised advantage estimation (PPO): per-turn credit from rewards and a critic.

    With V_t the value of the state the agent saw at its turn t and r_t that turn's reward
    (intermediate rewards as they come, the final score on the last turn)::

        delta_t = r_t + gamma * V_{t+1} - V_t        (V_T = 0 after the last turn)
        A_t     = delta_t + gamma * lam * A_{t+1}

    The value target of turn t is A_t + V_t. Both (``value_old``: V_t, ``value_target``) reach
    the items' meta through ``step_extras``, for the clipped value loss. A truncated episode
    (max turns) is bootstrapped with 0, as a terminal one.

    ``baseline="state"`` replaces the critic as the baseline where the batch can do better: a
    turn's advantage is its return-to-go G_t minus the mean G of the batch's *other* turns from the
    same prompt (the same information state; leave-one-out, so it does not depend on the turn's own
    action). A state seen once in the batch falls back to G_t - V_t. For small games (kuhn_poker has
    12 information states) this is an exact Monte-Carlo state baseline from the first step, while a
    linear head on the hidden state needs many steps to tell the states apart; the critic still
    trains on G_t. lam plays no part there (the returns are Monte-Carlo).

    Args:
        values: the value pass (``ValueFunction(model, pad_id)``), called once per batch.
        gamma, lam: discount and GAE lambda.
        normalize: scale the batch's advantages to mean 0, std 1 (value targets are not scaled).
        baseline: "value" (the critic, GAE) or "state" (leave-one-out mean return of the same prompt).
    """

    needs_turn_items = True
    """Items must be one per turn (``merge_turns=False``): each has its own value and target."""

    def __init__(self, values: StepValues | None = None, gamma: float = 1.0, lam: float = 0.95,
                 normalize: bool = True, baseline: str = "value") -> None:
        if not (0.0 <= gamma <= 1.0 and 0.0 <= lam <= 1.0):
            raise ValueError(f"GAE needs 0 <= gamma, lam <= 1, got gamma={gamma}, lam={lam}")
        if baseline not in ("value", "state"):
            raise ValueError(f"GAE baseline must be 'value' (the critic) or 'state' (per-prompt mean), got {baseline!r}")
        self.values, self.gamma, self.lam, self.normalize = values, gamma, lam, normalize
        self.baseline = baseline
        self.step_extras: dict[StepKey, dict[str, float]] = {}

    def __repr__(self) -> str:
        return f"GAE(gamma={self.gamma}, lam={self.lam}, normalize={self.normalize}, baseline={self.baseline!r})"

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        if self.values is None:
            raise ValueError("GAE has no value function: pass values=ValueFunction(model, pad_id)")
        v = self.values(rollouts)
        out: dict[StepKey, float] = {}
        self.step_extras = {}
        for r in rollouts:
            adv, nxt, carried = 0.0, 0.0, 0.0
            for s in reversed(r.steps):
                key = (r.id, s.index)
                if key not in v:  # no sampled tokens (nothing to train): its reward goes to the turn before
                    out[key] = 0.0
                    carried += s.reward
                    continue
                delta = s.reward + carried + self.gamma * nxt - v[key]
                carried = 0.0
                adv = delta + self.gamma * self.lam * adv
                out[key] = adv
                self.step_extras[key] = {"value_old": v[key], "value_target": adv + v[key]}
                nxt = v[key]
        if self.baseline == "state":
            self._state_baseline(rollouts, v, out)
        if self.normalize and self.step_extras:
            xs = [out[k] for k in self.step_extras]
            mean = sum(xs) / len(xs)
            std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
            for k in self.step_extras:
                out[k] = (out[k] - mean) / (std + 1e-8)
        return out

    def _state_baseline(self, rollouts: Sequence[Rollout], v: dict[StepKey, float], out: dict[StepKey, float]) -> None:
        """Overwrite ``out`` (and the value targets) with G_t - (leave-one-out mean G of the same prompt)."""
        ret = returns_to_go(rollouts, lambda key, s: key in self.step_extras, self.gamma)
        states: dict[tuple, list[StepKey]] = defaultdict(list)
        for r in rollouts:
            for s in r.steps:
                if (r.id, s.index) in ret:
                    states[tuple(s.trace.prompt_ids)].append((r.id, s.index))
        for keys in states.values():
            advs = group_advantages([ret[k] for k in keys], "loo") if len(keys) > 1 else [ret[keys[0]] - v[keys[0]]]
            for k, a in zip(keys, advs):
                out[k] = a
                self.step_extras[k] = {"value_old": v[k], "value_target": ret[k]}


class MMDTarget:
    """Magnetic mirror descent (Sokota et al., 2023) as per-state targets for a weighted NLL.

    For each information state s the batch visited (its prompt), with Q(s, a) the mean return-to-go of
    the batch's turns at s that played action a (the parsed action) and pi_old(a|s) the sampler's
    probability of that answer (from the sampled log-probs), the target policy is

        q(a|s)  ∝  exp((log pi_old(a|s) + eta * Q(s, a)) / (1 + alpha * eta))

    over the actions played at s: a mirror-descent step of size eta from pi_old, pulled toward the
    uniform magnet with strength alpha (alpha = 0: the plain exponentiated-Q step; its fixed point is
    a quantal response equilibrium at temperature alpha in two-player zero-sum games). One turn per
    (state, action), the one with the action's most common answer, gets weight q(a|s); the others get
    0 (the same answer from the same prompt has the same log-prob, so the loss is unchanged, at 1/n of
    the compute). With loss kind "sft" the objective is sum_s sum_a q(a|s) * -log pi(a|s): the
    cross-entropy to q at every visited state, one balanced term per state, however often the batch
    visited it.

    Why not a policy gradient: on kuhn_poker, PPO's per-turn advantages move the answer bias shared
    by every state and leave the card-dependent direction untouched (see the README's kuhn study);
    a balanced per-state fit learns it.

    Turns with a parse error, and states where fewer than two distinct actions were played (nothing
    to compare), get weight 0 (``drop_zero_weight`` removes them). ``last_stats`` holds the batch's
    share of states with a target and the mean entropy of the targets.
    """

    needs_turn_items = True
    """Items must be one per turn (``merge_turns=False``): each turn has its own target weight."""

    def __init__(self, eta: float = 10.0, alpha: float = 0.05, gamma: float = 1.0) -> None:
        if not (eta > 0 and alpha >= 0 and 0.0 <= gamma <= 1.0):
            raise ValueError(f"MMDTarget needs eta > 0, alpha >= 0, 0 <= gamma <= 1, got {eta}, {alpha}, {gamma}")
        self.eta, self.alpha, self.gamma = eta, alpha, gamma
        self.last_stats: dict[str, float] = {}

    def __repr__(self) -> str:
        return f"MMDTarget(eta={self.eta}, alpha={self.alpha}, gamma={self.gamma})"

    def compute(self, rollouts: Sequence[Rollout]) -> dict[StepKey, float]:
        ret = returns_to_go(rollouts, lambda key, s: s.trace is not None and len(s.trace.completion_ids) > 0, self.gamma)
        out = {(r.id, s.index): 0.0 for r in rollouts for s in r.steps}
        states: dict[tuple, dict[str, list[StepKey]]] = defaultdict(lambda: defaultdict(list))
        answers: dict[tuple, dict[str, dict[tuple, float]]] = defaultdict(lambda: defaultdict(dict))
        spelled: dict[StepKey, tuple] = {}
        for r in rollouts:
            for s in r.steps:
                key = (r.id, s.index)
                if key not in ret or s.parse_error or s.parsed_action is None:
                    continue
                t = s.trace
                states[tuple(t.prompt_ids)][s.parsed_action].append(key)
                spelled[key] = tuple(t.completion_ids)
                if t.logprobs:
                    answers[tuple(t.prompt_ids)][s.parsed_action][tuple(t.completion_ids)] = sum(t.logprobs)
        entropies = []
        for state, acts in states.items():
            if len(acts) < 2:
                continue
            names = sorted(acts)
            n = sum(len(acts[a]) for a in names)
            z = []
            for a in names:
                q_sa = sum(ret[k] for k in acts[a]) / len(acts[a])
                seen = answers[state][a]  # every spelling of a sampled at s: log sum of their probabilities
                logpi = _logsumexp(list(seen.values())) if seen else math.log(len(acts[a]) / n)
                z.append((logpi + self.eta * q_sa) / (1.0 + self.alpha * self.eta))
            top = max(z)
            e = [math.exp(x - top) for x in z]
            q = [x / sum(e) for x in e]
            entropies.append(-sum(p * math.log(p) for p in q if p > 0))
            for a, p in zip(names, q):
                counts = Counter(spelled[k] for k in acts[a])
                common = max(counts, key=lambda c: counts[c])
                out[next(k for k in acts[a] if spelled[k] == common)] = p
        self.last_stats = {"mmd_state_share": len(entropies) / max(1, len(states)),
                           "mmd_target_entropy": sum(entropies) / max(1, len(entropies))}
        return out


def _logsumexp(xs: Sequence[float]) -> float:
    top = max(xs)
    return top + math.log(sum(math.exp(x - top) for x in xs))


def make_credit(name: str, **kwargs) -> CreditAssigner:
    """Build a credit assigner by name (for configs and the CLI)."""
    table = {
        "mc_return": MonteCarloReturn,
        "group": GroupNormalizedReturn,
        "per_step": PerStepReward,
        "episodic": EpisodicReturn,
        "constant": ConstantCredit,
        "gae": GAE,
        "mmd": MMDTarget,
    }
    if name not in table:
        raise ValueError(f"unknown credit assigner {name!r}; choose from {sorted(table)}")
    return table[name](**kwargs)
