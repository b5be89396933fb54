"""Small statistics for evaluation reports: intervals and pass@k.

- ``wilson_interval(successes, n)``: the 95% Wilson score interval of a binomial proportion.
- ``pass_at_k(n, c, k)``: the unbiased pass@k of one problem from ``n`` samples with ``c`` correct (Chen et al.
  2021), ``pass_ks(K)`` the k values a K-sample evaluation reports (1, 2, 4, ..., K).
- ``difference_interval(p1, lo1, hi1, p2, lo2, hi2)``: the 95% interval of a gain ``p2 - p1`` from the two
  proportions' own intervals (Newcombe's hybrid score interval).
- ``bootstrap_interval(values)``: a seeded percentile bootstrap of a mean over problems.
- ``mean_interval(values)``: the interval every evaluation summary uses for a mean over problems of per-problem
  values in [0, 1] (``eval.samples.sample_summary``): Wilson when every value is 0 or 1 (one sample per problem, a
  majority vote, or all of a problem's samples alike: the binomial case, sensible at 0% and 100%), else the bootstrap
  over problems (the samples of one problem are not independent draws, so an interval over samples is too narrow).
"""

from __future__ import annotations

import math
from typing import Sequence

Z95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal."""
BOOTSTRAP_RESAMPLES = 2000
"""Resamples of ``bootstrap_interval`` (its percentile ends move by about 0.1 point between seeds at 64 problems)."""


def wilson_interval(successes: int, n: int, z: float = Z95) -> tuple[float, float]:
    """Wilson score interval for a binomial proportion (95% by default).

    Unlike the normal approximation it stays inside [0, 1] and is sensible at
    0 or ``n`` successes. ``n == 0`` gives the uninformative ``(0.0, 1.0)``.
    """
    if not 0 <= successes <= n:
        raise ValueError(f"need 0 <= successes <= n, got {successes} of {n}")
    if n == 0:
        return 0.0, 1.0
    p, z2 = successes / n, z * z
    denom = 1 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    return (0.0 if successes == 0 else max(0.0, centre - half)), (1.0 if successes == n else min(1.0, centre + half))


def difference_interval(p1: float, lo1: float, hi1: float, p2: float, lo2: float, hi2: float) -> tuple[float, float]:
    """95% interval of ``p2 - p1`` from each proportion's Wilson interval (Newcombe 1998, method 10): the
    usual test of a gain between two independent evaluations (it excludes 0 when the gain is significant)."""
    d = p2 - p1
    return d - math.sqrt((p2 - lo2) ** 2 + (hi1 - p1) ** 2), d + math.sqrt((hi2 - p2) ** 2 + (p1 - lo1) ** 2)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem from ``n`` samples of which ``c`` are correct (Chen et al. 2021):
    ``1 - C(n - c, k) / C(n, k)``, the chance that ``k`` of the ``n`` samples drawn without replacement hold a correct
    one. Averaged over problems it estimates pass@k without the bias of ``1 - (1 - c/n)^k``."""
    if not (0 <= c <= n and 1 <= k <= n):
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def pass_ks(k_max: int) -> list[int]:
    """The k of pass@k a ``k_max``-sample evaluation reports: the powers of two up to ``k_max``, and ``k_max``."""
    if k_max < 1:
        return []
    ks = [1 << i for i in range(k_max.bit_length()) if 1 << i <= k_max]
    return ks if ks[-1] == k_max else ks + [k_max]


def bootstrap_interval(values: Sequence[float], *, resamples: int = BOOTSTRAP_RESAMPLES, seed: int = 0,
                       level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of ``values`` (one per problem): the problems resampled with
    replacement ``resamples`` times from a generator seeded with ``seed`` (the same values give the same interval).
    No values: ``(0.0, 1.0)``."""
    import numpy as np

    if len(values) == 0:
        return 0.0, 1.0
    x = np.asarray(values, dtype=np.float64)
    idx = np.random.default_rng(seed).integers(0, len(x), size=(resamples, len(x)))
    means = x[idx].mean(axis=1)
    tail = (1.0 - level) / 2 * 100
    lo, hi = np.percentile(means, [tail, 100 - tail])
    return float(lo), float(hi)


def mean_interval(values: Sequence[float], seed: int = 0) -> tuple[float, float, str]:
    """``(low, high, method)``: the 95% interval of the mean of per-problem ``values`` in [0, 1]: ``"wilson"`` when
    every value is 0 or 1, else ``"bootstrap"`` over problems (module docstring)."""
    if all(v in (0.0, 1.0) for v in values):
        return (*wilson_interval(int(sum(values)), len(values)), "wilson")
    return (*bootstrap_interval(values, seed=seed), "bootstrap")
