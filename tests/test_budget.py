"""``ludic train env --budget-minutes``'s clock (``recipes.common.StepBudget``): validation by the clock must leave
the budget to training. Found in the held-out study: GEM's random guess-the-number (multi-turn episodes, 4.6 minutes
a validation of 32 episodes under a 30-minute budget) validated again right after every step, because the next
validation was due 1/8 of the budget after the last one *started*: the run trained 1 step in 30 minutes."""

import pytest

from ludic.recipes import common
from ludic.recipes.common import StepBudget


class Clock:
    """The test's own monotonic clock (seconds), in place of time.monotonic inside recipes.common."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(common.time, "monotonic", c)
    return c


def test_validation_waits_for_training_time_after_it_ends_and_takes_at_most_a_quarter(clock, tmp_path):
    budget = StepBudget(30, tmp_path / "budget.json", evals=8)  # one validation every 225 s of the budget
    budget.start_training()
    clock.now += 230
    assert budget.eval_due()
    clock.now += 276  # the validation itself: 4.6 minutes
    budget.eval_done(276)
    clock.now += 120  # one step later
    assert not budget.eval_due()  # not again right away: the interval counts from the validation's end
    clock.now += 120
    assert not budget.eval_due()  # a validation this slow gets 3x its time of training first (at most 1/4 of the run)
    clock.now += 3 * 276 - 240
    assert budget.eval_due()


def test_fast_validations_keep_the_budgets_cadence(clock, tmp_path):
    budget = StepBudget(8, tmp_path / "budget.json", evals=8)  # every 60 s
    budget.start_training()
    clock.now += 59
    assert not budget.eval_due()
    clock.now += 1
    assert budget.eval_due()
    budget.eval_done(5)
    clock.now += 59
    assert not budget.eval_due()
    clock.now += 1
    assert budget.eval_due()


def test_the_stop_leaves_room_for_the_end_the_policy_now_needs(clock, tmp_path):
    """Found in the held-out study: the calculator run took 36.9 minutes of a 30-minute budget. The stop reserved
    1.2x the opening test evaluation (the base model: one turn an episode, 0% success), but the trained policy's
    episodes ran 3 turns, and keep-best validated the last step before the closing evaluation besides."""
    budget = StepBudget(30, tmp_path / "budget.json", evals=8)
    budget.plan_closing(opening_s=60.0, opening_evals=1, closing_evals=1, test_per_val=2.0)  # 64 test, 32 val
    budget.start_training()
    clock.now += 1050  # five steps, the last validation among them: 150 s for 32 episodes of the trained policy
    budget.eval_done(150)  # (the opening test evaluation took 60 s for 64 episodes of the base)
    clock.now += 150
    budget.steps = 5  # the sixth ends now: 1200 s spent, 600 s left, 200 s a step
    # the old reserve (1.2 x the opening, 72 s) let a seventh step start; the end the policy needs now is the
    # closing test at the trained policy's pace (2 x 150 s, +20%) and keep-best's validation of the last step
    assert budget.closing() == pytest.approx(1.2 * 300 + 150)
    assert not budget.after_step()


def test_the_closing_estimate_counts_every_closing_evaluation(clock, tmp_path):
    """A two-player run closes with more evaluations than it opened with (the league snapshot's two)."""
    budget = StepBudget(30, tmp_path / "budget.json", evals=8)
    budget.plan_closing(opening_s=100.0, opening_evals=2, closing_evals=4, test_per_val=2.0)
    budget.start_training()
    assert budget.closing() == pytest.approx(1.2 * 50 * 4)  # no validation yet: the opening's 50 s an evaluation
    budget.eval_done(10)  # a fast validation does not lower the estimate below the opening's pace
    assert budget.closing() == pytest.approx(1.2 * 50 * 4 + 10)
