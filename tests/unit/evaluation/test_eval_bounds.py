"""Confidence bounds against published / closed-form values."""

from __future__ import annotations

import math

import pytest

from components.evaluation.bounds import bootstrap_interval, wilson_interval


def test_wilson_matches_the_textbook_interval() -> None:
    # 8/10 at 95% two-sided (= 97.5% one-sided each side): the Wilson interval is [0.4902, 0.9433].
    lo, hi = wilson_interval(8, 10, 0.975)
    assert lo == pytest.approx(0.4902, abs=1e-4)
    assert hi == pytest.approx(0.9433, abs=1e-4)


def test_wilson_edges_stay_in_unit_interval_and_shrink_with_n() -> None:
    assert wilson_interval(0, 20, 0.95)[0] == 0.0
    assert wilson_interval(20, 20, 0.95)[1] == pytest.approx(1.0)
    narrow = wilson_interval(480, 800, 0.95)
    wide = wilson_interval(6, 10, 0.95)
    assert narrow[1] - narrow[0] < wide[1] - wide[0]
    with pytest.raises(ValueError):
        wilson_interval(11, 10, 0.95)
    with pytest.raises(ValueError):
        wilson_interval(1, 10, 1.0)


def test_bootstrap_of_constant_values_is_that_value() -> None:
    assert bootstrap_interval([0.25] * 30, 0.95, 500, seed=0) == (0.25, 0.25)


def test_bootstrap_is_close_to_the_normal_bound_and_deterministic() -> None:
    values = [0.0, 1.0] * 50  # mean 0.5, sd 0.5, n 100 -> one-sided 95% half width 1.645 * 0.05
    lo, hi = bootstrap_interval(values, 0.95, 4000, seed=1)
    assert hi == pytest.approx(0.5 + 1.645 * 0.05, abs=0.02)
    assert lo == pytest.approx(0.5 - 1.645 * 0.05, abs=0.02)
    assert (lo, hi) == bootstrap_interval(values, 0.95, 4000, seed=1)
    assert not math.isclose(hi, lo)
