"""Intervals and pass@k (ludic.eval.stats) against hand-computed values."""

import math

import pytest

from ludic.eval.stats import bootstrap_interval, mean_interval, pass_at_k, pass_ks, wilson_interval


@pytest.mark.parametrize("k, n, lo, hi", [
    (5, 10, 0.2366, 0.7634),   # symmetric around 1/2
    (0, 10, 0.0, 0.2775),      # z^2 / (n + z^2) = 3.8415 / 13.8415
    (10, 10, 0.7225, 1.0),
    (50, 100, 0.4038, 0.5962),
    (1, 3, 0.0615, 0.7923),
])
def test_wilson_interval_matches_hand_computed_values(k, n, lo, hi):
    got = wilson_interval(k, n)
    assert got == pytest.approx((lo, hi), abs=1e-4)


def test_wilson_interval_edges():
    assert wilson_interval(0, 0) == (0.0, 1.0)
    lo, hi = wilson_interval(0, 10)
    assert lo == 0.0 and math.isclose(hi, 1.959963984540054 ** 2 / (10 + 1.959963984540054 ** 2))
    with pytest.raises(ValueError):
        wilson_interval(3, 2)


@pytest.mark.parametrize("n, c, k, want", [
    (4, 0, 1, 0.0),
    (4, 4, 1, 1.0),
    (4, 1, 1, 0.25),                # c / n
    (4, 1, 2, 1 - 3 / 6),           # 1 - C(3,2)/C(4,2)
    (4, 2, 2, 1 - 1 / 6),           # 1 - C(2,2)/C(4,2)
    (4, 3, 2, 1.0),                 # n - c < k: every pair holds a correct one
    (5, 2, 3, 1 - 1 / 10),          # 1 - C(3,3)/C(5,3)
    (10, 3, 4, 1 - 35 / 210),       # 1 - C(7,4)/C(10,4)
])
def test_pass_at_k_matches_the_binomial_formula(n, c, k, want):
    assert pass_at_k(n, c, k) == pytest.approx(want)
    assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k))


def test_pass_at_k_refuses_k_above_the_samples():
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)


def test_pass_ks_are_the_powers_of_two_and_k():
    assert pass_ks(1) == [1] and pass_ks(4) == [1, 2, 4] and pass_ks(6) == [1, 2, 4, 6] and pass_ks(8) == [1, 2, 4, 8]
    assert pass_ks(0) == []


def test_bootstrap_is_seeded_and_mean_interval_picks_wilson_for_binary_values():
    values = [0.0, 0.25, 0.5, 1.0, 0.75, 0.25, 0.0, 0.5]
    lo, hi = bootstrap_interval(values, seed=3)
    assert (lo, hi) == bootstrap_interval(values, seed=3) and lo < sum(values) / len(values) < hi
    assert bootstrap_interval([0.5] * 5) == (0.5, 0.5)
    assert mean_interval([1.0, 0.0, 0.0, 1.0, 1.0]) == (*wilson_interval(3, 5), "wilson")
    assert mean_interval(values, seed=3) == (lo, hi, "bootstrap")
    assert mean_interval([]) == (0.0, 1.0, "wilson")
