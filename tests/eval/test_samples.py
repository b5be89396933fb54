"""Several samples per problem (ludic.eval.samples): pass@k averaged over problems, majority vote, the shared summary
of env evaluations (recipes.env_setup.summarize) and QA evaluations (recipes.qa.qa_metrics), all hand-computed."""

import pytest

from ludic.eval.samples import SampleOutcome, expand_samples, majority_vote, outcome_of, sample_summary
from ludic.eval.stats import wilson_interval
from ludic.recipes.env_setup import summarize
from ludic.recipes.qa import qa_metrics
from ludic.types import EnvSpec, Rollout, RolloutRequest, Step


def _o(problem, sample, success, answer=None, reward=None):
    return SampleOutcome(problem, sample, bool(success), float(success) if reward is None else reward, answer)


def test_majority_vote_takes_the_most_common_answer_and_the_envs_score_for_it():
    votes = [_o("p", 0, 1, "7"), _o("p", 1, 0, "8"), _o("p", 2, 1, "7"), _o("p", 3, 0, None)]
    assert majority_vote(votes) == ("7", True)
    wrong = [_o("p", 0, 1, "3"), _o("p", 1, 0, "5"), _o("p", 2, 0, "5")]
    assert majority_vote(wrong) == ("5", False)  # the right answer was sampled, but the vote picks the common one
    tie = [_o("p", 1, 1, "7"), _o("p", 0, 0, "8")]
    assert majority_vote(tie) == ("8", False)  # a tie: the answer sampled first
    assert majority_vote([_o("p", 0, 0), _o("p", 1, 0)]) is None  # no answers: nothing to vote on


def test_summary_of_two_problems_with_four_samples_each_by_hand():
    a = [_o("A", 0, 1, "3"), _o("A", 1, 0, "5"), _o("A", 2, 0, "5"), _o("A", 3, 0, "5")]  # 1 of 4; vote: 5, wrong
    b = [_o("B", 0, 1, "2"), _o("B", 1, 1, "2"), _o("B", 2, 0, "9"), _o("B", 3, 0, None)]  # 2 of 4; vote: 2, right
    m = sample_summary(a + b)
    assert m["problems"] == 2 and m["samples"] == 4
    assert m["success_rate"] == pytest.approx((0.25 + 0.5) / 2)
    assert m["pass@1"] == pytest.approx(0.375)
    assert m["pass@2"] == pytest.approx(((1 - 3 / 6) + (1 - 1 / 6)) / 2)  # 1 - C(3,2)/C(4,2), 1 - C(2,2)/C(4,2)
    assert m["pass@4"] == 1.0 and "pass@3" not in m
    assert m["cons@4"] == 0.5 and (m["cons@4_ci95_low"], m["cons@4_ci95_high"]) == wilson_interval(1, 2)
    assert m["ci95_method"] == {"success_rate": "bootstrap", "pass@1": "bootstrap", "pass@2": "bootstrap",
                                "pass@4": "wilson", "cons@4": "wilson", "mixed@4": "wilson", "reward_mean": "normal"}
    assert m["success_ci95_low"] <= m["success_rate"] <= m["success_ci95_high"]
    assert sample_summary(a + b, seed=1)["pass@2"] == m["pass@2"]
    assert all(m[f"pass@{k}"] <= m[f"pass@{2 * k}"] for k in (1, 2))


def test_mixed_at_k_is_the_share_of_instances_whose_samples_disagree():
    """mixed@K: the instances where some of the K samples succeeded and some failed, the ones a GRPO group of K
    samples learns from under a success reward (all alike: every advantage 0). It tells how much signal a sampling
    temperature gives where pass@1 and pass@K do not: pass@K counts an instance solved 8 times of 8 too."""
    right = [_o("A", i, 1) for i in range(4)]  # 4 of 4: no signal
    wrong = [_o("B", i, 0) for i in range(4)]  # 0 of 4: no signal
    mixed = [_o("C", i, int(i == 2)) for i in range(4)]  # 1 of 4: signal
    m = sample_summary(right + wrong + mixed)
    assert m["mixed@4"] == pytest.approx(1 / 3) and (m["mixed@4_ci95_low"], m["mixed@4_ci95_high"]) == wilson_interval(1, 3)
    assert m["pass@4"] == pytest.approx(2 / 3)
    assert "mixed@1" not in sample_summary([_o("A", 0, 1), _o("B", 0, 0)])  # one sample: nothing to disagree


def test_summary_without_answers_has_no_vote_and_uneven_problems_report_the_fewest_samples():
    m = sample_summary([_o("A", 0, 1), _o("A", 1, 0), _o("A", 2, 1), _o("B", 0, 0), _o("B", 1, 1)])
    assert m["samples"] == 2 and "cons@2" not in m and list(k for k in m if k.startswith("pass@") and "_" not in k) == [
        "pass@1", "pass@2"]
    assert sample_summary([_o("A", 0, 1)], ks=[1, 4])["pass@1"] == 1.0  # pass@4 needs 4 samples: left out


def _rollout(success, answer=None, reward=None, **meta):
    info = {"success": float(success), **({"answer": answer} if answer is not None else {})}
    step = Step(0, "q", f"<answer>{answer}</answer>", answer, None, float(success) if reward is None else reward,
                terminated=True, info=info)
    return Rollout(steps=[step], meta=meta)


def test_env_summary_of_one_episode_per_problem_keeps_the_wilson_interval():
    rollouts = [_rollout(1), _rollout(0), _rollout(1), _rollout(0), Rollout(meta={"failed": True}),
                _rollout(1, trainable=False)]  # a frozen opponent's seat: not the policy's
    m = summarize(rollouts)
    assert m["episodes"] == 5 and m["success_rate"] == 0.4 and m["failed_rate"] == 0.2
    assert (m["success_ci95_low"], m["success_ci95_high"]) == wilson_interval(2, 5)
    assert m["reward_mean"] == 0.5  # over the episodes that did not fail
    assert m["pass@1"] == 0.4 and "cons@1" not in m


def test_env_summary_groups_samples_by_problem():
    rollouts = [_rollout(s, a, problem=p, sample=j) for p, j, s, a in
                [(0, 0, 1, "4"), (0, 1, 0, "6"), (0, 2, 1, "4"), (1, 0, 0, "1"), (1, 1, 0, "1"), (1, 2, 0, "2")]]
    m = summarize(rollouts)
    assert m["episodes"] == 6 and m["problems"] == 2 and m["samples"] == 3
    assert m["pass@2"] == pytest.approx((1 - 0 / 3) / 2)  # problem 0: 1 - C(1,2)/C(3,2) = 1; problem 1: 0
    assert m["cons@3"] == 0.5


def test_outcome_reads_the_answer_and_skips_hedged_ones():
    assert outcome_of(_rollout(1, "12", problem=3)).answer == "12"
    hedged = Rollout(steps=[Step(0, "q", "3 or 4", "3", None, 0.0, True, info={"answer": "3", "hedged": True})])
    assert outcome_of(hedged).answer is None and outcome_of(hedged).success is False
    qa = Rollout(steps=[Step(0, "q", "7", "7", None, 1.0, True, info={"predicted": " 7 ", "correct": True})])
    assert outcome_of(qa).answer == "7" and outcome_of(qa).success


def test_qa_metrics_uses_the_shared_summary():
    outcomes = [{"id": r, "correct": c, "parsed": p, "failed": False, "parse_error": p is None, "tool_calls": 0}
                for r, c, p in [("a", True, "5"), ("a", False, "6"), ("b", False, "1"), ("b", False, "1")]]
    m = qa_metrics(outcomes, samples=2, ks=[1, 2, 4])
    assert m["records"] == 2 and m["accuracy"] == 0.25 and m["pass@1"] == 0.25
    assert m["pass@2"] == 0.5 and "pass@4" not in m and m["cons@2"] == 0.5  # a: a tie, 5 sampled first
    assert m["ci95_method"]["accuracy"] == "bootstrap"
    one = qa_metrics(outcomes[::2], samples=1, ks=[1])  # one sample a record: Wilson over records, as before
    assert (one["accuracy_ci95_low"], one["accuracy_ci95_high"]) == wilson_interval(1, 2)


def test_expand_samples_gives_each_sample_its_own_seed_and_its_problem():
    reqs = [RolloutRequest(EnvSpec("x"), env_seed=10 + i, sampling_seed=i, meta={"k": i}) for i in range(3)]
    out = expand_samples(reqs, 4)
    assert [r.env_seed for r in out] == [10] * 4 + [11] * 4 + [12] * 4
    assert [(r.meta["problem"], r.meta["sample"]) for r in out][:5] == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 0)]
    assert len({r.sampling_seed for r in out}) == 12 and out[5].meta["k"] == 1
    assert [r.sampling_seed for r in expand_samples(reqs, 1)] == [0, 1, 2]  # one sample: the request's own seed


def test_a_summary_names_the_best_constant_answer_and_a_policy_that_always_gives_one():
    """Found in the held-out study: on letter_counting (3-5 words) 45 of 64 test questions have the answer 1, and
    a trained policy that answers 1 to everything scored 70.3%. The summary now says what the best constant answer
    scores on these test instances and how many distinct answers the policy gave, and the console line says so."""
    from ludic.recipes.env_setup import format_summary

    def rollout(problem, answer, reference):
        ok = answer == reference.strip()
        info = {"answer": answer, "reference": reference, "success": float(ok)}
        return Rollout(steps=[Step(0, "q", answer, answer, None, float(ok), True, info=info)],
                       meta={"problem": problem, "sample": 0})

    refs = ["1"] * 7 + ["2", "3", "1 "]  # the references' most common answer is "1" (8 of 10, whitespace normalised)
    collapsed = summarize([rollout(i, "1", r) for i, r in enumerate(refs)])
    assert collapsed["success_rate"] == 0.8
    assert collapsed["constant_answer_rate"] == 0.8 and collapsed["constant_answer"] == "1"
    assert collapsed["distinct_answers"] == 1 and collapsed["top_answer_share"] == 1.0
    line = format_summary("[env] trained", collapsed)
    assert "the best constant answer ('1') scores 80.0%" in line and "always '1'" in line
    varied = summarize([rollout(i, r.strip(), r) for i, r in enumerate(refs)])
    assert varied["distinct_answers"] == 3 and varied["top_answer_share"] == 0.8
    assert "always" not in format_summary("[env] trained", varied)
    no_refs = summarize([_rollout(1, "4"), _rollout(0, "5")])  # an env that names no reference
    assert "constant_answer_rate" not in no_refs and "best constant answer" not in format_summary("x", no_refs)


def test_a_start_that_a_constant_answer_matches_is_named_before_rl():
    """Found in the held-out study: the two tasks whose best constant answer scored at least what the start of RL
    scored on the test instances (gcd 2-99: '3' 20.3% against 20.3%; letter_counting: '1' 70.3% against 15.6%)
    collapsed onto one answer under GRPO; the three whose constant answer scored less (chain_sum, basic_arithmetic,
    products: 6.2% against 12.5%) learned. The start's summary now warns before RL, and names nothing otherwise."""
    from ludic.eval.samples import constant_answer_warning

    gcd = {"success_rate": 0.203125, "constant_answer": "3", "constant_answer_rate": 0.203125, "problems": 64}
    text = constant_answer_warning(gcd)
    assert "'3'" in text and "20.3%" in text and "distinct answers" in text
    assert constant_answer_warning({**gcd, "success_rate": 0.125, "constant_answer_rate": 0.0625}) == ""
    assert constant_answer_warning({"success_rate": 0.0, "problems": 64}) == ""  # no references: nothing to say
    assert constant_answer_warning({**gcd, "success_rate": 0.0, "constant_answer_rate": 0.0}) == ""


def test_a_summary_names_the_constant_answer_once_and_warns_when_it_matches_the_policy():
    """Found reading `ludic eval env`'s console: with the start's warning the best constant answer's score was
    printed twice, once in the summary and again in the warning line under it. The summary now carries the
    warning in place of the plain score, and only when the constant answer scores at least the policy."""
    from ludic.recipes.env_setup import format_summary

    base = {"success_rate": 0.203125, "success_ci95_low": 0.1, "success_ci95_high": 0.3, "reward_mean": 0.2,
            "reward_ci95_low": 0.1, "reward_ci95_high": 0.3, "episodes": 64, "turns_mean": 1.0, "failed_rate": 0.0,
            "problems": 64, "constant_answer": "3", "constant_answer_rate": 0.203125}
    warned = format_summary("gcd", base)
    assert warned.count("best constant answer") == 1 and "WARNING" in warned and "distinct answers" in warned
    plain = format_summary("gcd", {**base, "success_rate": 0.5})
    assert plain.count("best constant answer") == 1 and "WARNING" not in plain
