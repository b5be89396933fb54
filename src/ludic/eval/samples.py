"""Several samples per problem, and what an evaluation reports from them: the one summary every Ludic evaluation uses.

A *problem* is one test instance (a question, a game's deal); a *sample* is one episode on it, with its own
sampling seed. ``ludic eval env --samples K`` plays K samples of every test instance (``expand_samples``); ``ludic
train env``'s test stages (``recipes.env_setup.summarize``), ``ludic train qa`` / ``ludic eval qa``
(``recipes.qa.qa_metrics``) and ``ludic eval rescore`` all summarise their episodes with ``sample_summary``:

- ``success_rate``: the mean success over all samples (over problems of each problem's rate: the same when every
  problem has as many samples);
- ``pass@k`` for k = 1, 2, 4, ..., K (``eval.stats.pass_ks``), the unbiased estimator of Chen et al. 2021
  (``eval.stats.pass_at_k`` per problem, averaged over problems);
- ``cons@K``, majority vote, where episodes name an answer (the last step's ``info["answer"]``, which reasoning-gym
  sets, else ``info["predicted"]``, which the QA env sets; a hedged reply, ``info["hedged"]``, does not vote): the
  most common answer among a problem's samples (ties: the one sampled first) is scored with what the env scored
  for it (the problem counts as solved when a sample giving that answer succeeded);
- ``mixed@K``: the share of problems whose samples both succeeded and failed, the ones a GRPO group of K samples
  would learn from under a success reward (a group whose samples all agree has every advantage 0): the signal a
  sampling temperature gives, which pass@1 and pass@K do not show;
- ``reward_mean``, over the samples that did not fail, with a normal interval over problems;
- where episodes name their reference answer (``info["reference"]``: reasoning-gym and the QA env), the best
  constant answer's score, ``constant_answer`` and ``constant_answer_rate`` (the share of problems whose reference
  is the most common one: what a policy that gives that answer to everything scores under exact match), and where
  they name their own answer, ``distinct_answers`` and ``top_answer_share`` (the share of samples giving the most
  common one): a policy that learned the answers' base rate rather than the task shows as one answer everywhere;

each with a 95% interval over problems (``eval.stats.mean_interval``: Wilson where every problem's value is 0 or 1,
a seeded bootstrap over problems otherwise; ``ci95_method`` says which each metric got).
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter
from dataclasses import dataclass, replace
from typing import Any, Sequence

from ludic.errors import UsageError
from ludic.eval.stats import Z95, mean_interval, pass_at_k, pass_ks
from ludic.rollouts.engine import episode_success
from ludic.training.signal import COLLAPSED_SHARE
from ludic.types import Rollout, RolloutRequest


@dataclass(frozen=True)
class SampleOutcome:
    """One sample's result, as the summary reads it."""

    problem: Any
    """The problem (test instance) it samples: a hashable key."""
    sample: int
    """Its index among the problem's samples."""
    success: bool
    """Solved (``rollouts.engine.episode_success`` of a full score; a failed episode is not)."""
    reward: float | None = None
    """Its total reward; None for a failed episode (left out of the reward mean)."""
    answer: str | None = None
    """The answer it gave (whitespace normalised), for the majority vote; None: no answer, or a hedged one."""
    reference: str | None = None
    """The problem's reference answer (whitespace normalised) where the env names it (``info["reference"]``)."""


def expand_samples(requests: Sequence[RolloutRequest], k: int) -> list[RolloutRequest]:
    """Each request (one problem) ``k`` times, problem-major, with ``meta["problem"]`` (the request's index) and
    ``meta["sample"]`` (0..k-1), and sampling seed ``base * k + j`` (``base``: the request's own seed, else its
    index): distinct seeds, and with ``k=1`` the request's own."""
    if k < 1:
        raise UsageError(f"samples per problem (--samples) must be at least 1, got {k}")
    out = []
    for i, req in enumerate(requests):
        base = req.sampling_seed if req.sampling_seed is not None else i
        out += [replace(req, sampling_seed=base * k + j, meta={**req.meta, "problem": i, "sample": j})
                for j in range(k)]
    return out


def normalize_answer(answer: Any) -> str | None:
    """The answer as the vote compares it: its text with whitespace collapsed (None stays None)."""
    return None if answer is None else " ".join(str(answer).split())


def problem_key(r: Rollout) -> str:
    """The problem an episode samples: ``meta["problem"]`` (``expand_samples``), else its env, kwargs and seed."""
    if "problem" in r.meta:
        return str(r.meta["problem"])
    return json.dumps([r.meta.get("env_kind"), r.meta.get("env_kwargs"), r.meta.get("env_seed")], sort_keys=True,
                      default=str)


def outcome_of(r: Rollout, problem: Any = None) -> SampleOutcome:
    """A rollout's ``SampleOutcome`` (``problem``: default ``problem_key``)."""
    failed = bool(r.meta.get("failed"))
    info = r.steps[-1].info if r.steps else {}
    answer = None if info.get("hedged") else normalize_answer(info.get("answer", info.get("predicted")))
    return SampleOutcome(problem=problem_key(r) if problem is None else problem, sample=int(r.meta.get("sample", 0)),
                         success=not failed and episode_success(r) >= 1.0,
                         reward=None if failed else r.total_reward, answer=answer,
                         reference=normalize_answer(info.get("reference")))


def majority_vote(outcomes: Sequence[SampleOutcome]) -> tuple[str, bool] | None:
    """``(answer, solved)`` of one problem's samples: the most common answer (ties: the first sampled) and whether a
    sample giving it succeeded; None when no sample gave an answer."""
    ordered = sorted(outcomes, key=lambda o: o.sample)
    votes = Counter(o.answer for o in ordered if o.answer is not None)
    if not votes:
        return None
    answer = max(votes, key=votes.__getitem__)  # the first of the most common, in sample order
    return answer, any(o.success for o in ordered if o.answer == answer)


def _groups(outcomes: Sequence[SampleOutcome]) -> list[list[SampleOutcome]]:
    by: dict[Any, list[SampleOutcome]] = {}
    for o in outcomes:
        by.setdefault(o.problem, []).append(o)
    return list(by.values())


def sample_summary(outcomes: Sequence[SampleOutcome], ks: Sequence[int] | None = None,
                   seed: int = 0) -> dict[str, Any]:
    """The summary of the module docstring. ``ks``: the pass@k to report (default ``pass_ks`` of the fewest samples
    any problem has; a k above that is left out); ``seed``: the bootstrap's."""
    groups = _groups(outcomes)
    k_max = min((len(g) for g in groups), default=0)
    out: dict[str, Any] = {"problems": len(groups), "samples": k_max}
    method: dict[str, str] = {}

    def put(name: str, values: list[float], key: str | None = None) -> None:
        key = key or name
        out[name] = statistics.fmean(values) if values else 0.0
        out[f"{key}_ci95_low"], out[f"{key}_ci95_high"], method[name] = mean_interval(values, seed)

    put("success_rate", [statistics.fmean(o.success for o in g) for g in groups], "success")
    for k in pass_ks(k_max) if ks is None else [k for k in ks if 1 <= k <= k_max]:
        put(f"pass@{k}", [pass_at_k(len(g), sum(o.success for o in g), k) for g in groups])
    if k_max > 1 and any(o.answer is not None for o in outcomes):
        put(f"cons@{k_max}", [float(bool(v and v[1])) for v in map(majority_vote, groups)])
    if k_max > 1:
        put(f"mixed@{k_max}", [float(0 < sum(o.success for o in g) < len(g)) for g in groups])
    rewards = [statistics.fmean(r) for g in groups if (r := [o.reward for o in g if o.reward is not None])] or [0.0]
    mean = statistics.fmean(rewards)
    half = Z95 * statistics.pstdev(rewards) / math.sqrt(len(rewards)) if len(rewards) > 1 else 0.0
    out.update(reward_mean=mean, reward_ci95_low=mean - half, reward_ci95_high=mean + half)
    out["ci95_method"] = {**method, "reward_mean": "normal"}
    out.update(answer_spread(outcomes))
    return out


def answer_spread(outcomes: Sequence[SampleOutcome]) -> dict[str, Any]:
    """The best constant answer's score (from the references) and how many distinct answers the policy gave."""
    out: dict[str, Any] = {}
    groups = _groups(outcomes)
    refs = [next((o.reference for o in g if o.reference is not None), None) for g in groups]
    known = [r for r in refs if r is not None]
    if known:
        constant, count = Counter(known).most_common(1)[0]
        out.update(constant_answer=constant, constant_answer_rate=count / len(groups))
    given = [o.answer for o in outcomes if o.answer is not None]
    if given:
        top, count = Counter(given).most_common(1)[0]
        out.update(distinct_answers=len(set(given)), top_answer=top, top_answer_share=count / len(outcomes))
    return out


def format_answer_spread(m: dict[str, Any]) -> str:
    """The best constant answer's score and a policy that (almost) always gives one answer, as text (or ""). When
    the constant answer scores at least the policy, its score comes as ``constant_answer_warning``'s warning."""
    parts = []
    if warning := constant_answer_warning(m):
        parts.append(warning)
    elif "constant_answer_rate" in m:
        parts.append(f"the best constant answer ({m['constant_answer']!r}) scores {m['constant_answer_rate'] * 100:.1f}%"
                     f" on these {m['problems']} test instances")
    if m.get("top_answer_share", 0.0) >= COLLAPSED_SHARE and m.get("problems", 0) >= 8:
        parts.append(f"the policy answered almost always {m['top_answer']!r} ({m['top_answer_share'] * 100:.0f}% of "
                     "episodes): it may have learned the answers' base rate, not the task")
    return "; ".join(parts)


def constant_answer_warning(m: dict[str, Any]) -> str:
    """A warning (or "") when the best constant answer scores at least what the policy scores on these test
    instances: said of the start of RL, GRPO's nearest way up is that answer to every question, not the task. In the
    held-out study (docs/study.md, fp32) both tasks where this held collapsed onto one answer (gcd 2-99,
    letter_counting) and the three where it did not learned; a warning, not a verdict (gcd 2-99 in bf16 learned past
    the constant answer at seed 2)."""
    rate = m.get("constant_answer_rate", 0.0)
    if rate <= 0 or rate < m.get("success_rate", 0.0):
        return ""
    return (f"WARNING: the best constant answer ({m['constant_answer']!r}) scores {rate * 100:.1f}% on these "
            f"{m.get('problems', '?')} test instances, at least the policy's {m.get('success_rate', 0.0) * 100:.1f}%: "
            "GRPO can raise the reward by giving it to every question (letter_counting did, and gcd 2-99 in "
            "fp32; docs/troubleshooting.md): compare the result with that score and check the trained policy's "
            "distinct answers")


SAMPLE_METRICS = ("pass@", "cons@", "mixed@")
"""The summary's metrics that exist only with several samples per problem (names start with these)."""


def format_sample_metrics(m: dict[str, Any]) -> str:
    """One line of a summary's pass@k, majority vote and mixed@K with their intervals (empty when it has none)."""
    parts = [f"{k} {m[k] * 100:.1f}% ({m[k + '_ci95_low'] * 100:.1f}-{m[k + '_ci95_high'] * 100:.1f}%)"
             for k in m if k.startswith(SAMPLE_METRICS) and not k.endswith(("_low", "_high"))]
    if not parts:
        return ""
    return (f"{m['problems']} problems x {m['samples']} samples: " + ", ".join(parts)
            + f" (95% CI: {', '.join(sorted(set(m.get('ci95_method', {}).values()) - {'normal'}))})")
