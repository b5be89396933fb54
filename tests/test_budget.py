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
