"""Confidence bounds for accuracy-like metrics, used by the nightly gate to tell noise from regressions.

Both bounds are one-sided at ``confidence``: the gate asks "is the true value surely below the threshold?",
which is the upper bound falling below it.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from statistics import NormalDist


def _z(confidence: float) -> float:
    if not 0 < confidence < 1:
        raise ValueError(f"confidence must lie in (0, 1), got {confidence}")
    return NormalDist().inv_cdf(confidence)


def wilson_interval(successes: float, n: int, confidence: float) -> tuple[float, float]:
    """One-sided Wilson score bounds ``(lower, upper)`` of a proportion, each at ``confidence``.

    ``successes`` may be fractional (avg@n times n samples) so pass@k-style means can use it too.
    """
    if n < 1:
        raise ValueError(f"Wilson bound needs n >= 1, got {n}")
    if not 0 <= successes <= n:
        raise ValueError(f"successes {successes} must lie in [0, n={n}]")
    z = _z(confidence)
    p = successes / n
    denom = 1 + z * z / n
    center = (p + z * z / (2 * n)) / denom
    half = z / denom * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return max(0.0, center - half), min(1.0, center + half)


def bootstrap_interval(
    per_problem: Sequence[float], confidence: float, n_resamples: int, seed: int
) -> tuple[float, float]:
    """One-sided percentile bootstrap bounds ``(lower, upper)`` of the mean over problems.

    Resamples problems (not samples), so the k samples of one problem stay together: they are correlated,
    and a bound that treats them as independent is too narrow.
    """
    values = [float(v) for v in per_problem]
    if not values:
        raise ValueError("bootstrap needs at least one problem")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    _z(confidence)
    rng = random.Random(seed)
    n = len(values)
    means = sorted(sum(rng.choices(values, k=n)) / n for _ in range(n_resamples))
    lo_idx = math.floor((1 - confidence) * (n_resamples - 1))
    hi_idx = math.ceil(confidence * (n_resamples - 1))
    return means[lo_idx], means[hi_idx]


def paired_bootstrap_difference(
    per_problem_a: Sequence[float],
    per_problem_b: Sequence[float],
    confidence: float,
    n_resamples: int,
    seed: int,
) -> tuple[float, float, float]:
    """``(mean(a) - mean(b), lower, upper)``: a two-sided percentile bootstrap interval of a paired difference.

    ``a[i]`` and ``b[i]`` are two checkpoints' scores on the same problem ``i`` (e.g. each problem's fraction
    of correct samples). Each resample draws problems with replacement and takes the same problems for both
    checkpoints, so what the two share (a problem is easy for both) cancels and the interval is as narrow
    as the data allow; two independent intervals would be far wider. ``confidence`` is the two-sided level.
    """
    a, b = [float(v) for v in per_problem_a], [float(v) for v in per_problem_b]
    if len(a) != len(b):
        raise ValueError(f"paired bootstrap needs the same problems on both sides ({len(a)} vs {len(b)})")
    if not a:
        raise ValueError("paired bootstrap needs at least one problem")
    if n_resamples < 1:
        raise ValueError(f"n_resamples must be >= 1, got {n_resamples}")
    _z(confidence)
    diffs = [x - y for x, y in zip(a, b, strict=True)]
    n = len(diffs)
    rng = random.Random(seed)
    means = sorted(sum(rng.choices(diffs, k=n)) / n for _ in range(n_resamples))
    tail = (1 - confidence) / 2
    lo_idx = math.floor(tail * (n_resamples - 1))
    hi_idx = math.ceil((1 - tail) * (n_resamples - 1))
    return sum(diffs) / n, means[lo_idx], means[hi_idx]


def bootstrap_ratio_interval(
    numerators: Sequence[float], denominators: Sequence[float], confidence: float, n_resamples: int, seed: int
) -> tuple[float, float, float]:
    """``(sum(num) / sum(den), lower, upper)``, two-sided, resampling items (e.g. problems) with replacement.

    For ratio-of-sums statistics such as the ideal speedup (total / critical-path tokens over a set of traces).
    """
    num, den = [float(v) for v in numerators], [float(v) for v in denominators]
    if len(num) != len(den) or not num:
        raise ValueError("ratio bootstrap needs the same, non-zero number of numerators and denominators")
    if sum(den) <= 0:
        raise ValueError("ratio bootstrap needs a positive denominator sum")
    _z(confidence)
    rng = random.Random(seed)
    n = len(num)
    ratios = []
    for _ in range(n_resamples):
        idx = rng.choices(range(n), k=n)
        d = sum(den[i] for i in idx)
        ratios.append(sum(num[i] for i in idx) / d if d > 0 else math.inf)
    ratios.sort()
    tail = (1 - confidence) / 2
    return (
        sum(num) / sum(den),
        ratios[math.floor(tail * (n_resamples - 1))],
        ratios[math.ceil((1 - tail) * (n_resamples - 1))],
    )
