"""Wilson score intervals against hand-computed values."""

import math

import pytest

from ludic.eval.stats import wilson_interval


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
