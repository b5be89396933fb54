"""Small statistics for evaluation reports."""

from __future__ import annotations

import math

Z95 = 1.959963984540054
"""Two-sided 95% quantile of the standard normal."""


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
    return max(0.0, centre - half), min(1.0, centre + half)
