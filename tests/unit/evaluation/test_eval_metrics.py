"""Metric functions against values computed by hand (or by exact binomials, independently of the code)."""

from __future__ import annotations

import math
from fractions import Fraction

import pytest

from components.evaluation.metrics import (
    RECORD_FIELDS,
    achieved_speedup,
    avg_at_n,
    best_at_k,
    ideal_speedup,
    mean_branches_per_block,
    mean_pass_at_k,
    pass_at_k,
    summarize_records,
    tokens_per_second,
)


@pytest.mark.parametrize(
    ("n", "c", "k", "expected"),
    [
        (5, 2, 2, 0.7),  # 1 - C(3,2)/C(5,2) = 1 - 3/10
        (10, 3, 5, 1 - 21 / 252),  # 1 - C(7,5)/C(10,5)
        (4, 1, 1, 0.25),  # k=1 is the fraction correct
        (8, 0, 4, 0.0),  # c=0: never
        (8, 8, 4, 1.0),  # c=n: always
        (6, 3, 4, 1.0),  # n-c < k: every k-subset holds a correct sample
        (4, 2, 4, 1.0),  # k=n: any correct sample counts
    ],
)
def test_pass_at_k_hand_values(n: int, c: int, k: int, expected: float) -> None:
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_stable_for_large_n() -> None:
    exact = 1 - Fraction(math.comb(1997, 1000), math.comb(2000, 1000))
    assert pass_at_k(2000, 3, 1000) == pytest.approx(float(exact), rel=1e-12)


@pytest.mark.parametrize(("n", "c", "k"), [(4, 0, 5), (4, 5, 1), (4, -1, 1), (0, 0, 1), (4, 1, 0)])
def test_pass_at_k_rejects_impossible_arguments(n: int, c: int, k: int) -> None:
    with pytest.raises(ValueError):
        pass_at_k(n, c, k)


def test_best_at_k_is_expected_max_over_subsets() -> None:
    # 2-subsets of {0,1,2,3}: maxima 1,2,3,2,3,3 -> 14/6.
    assert best_at_k([3, 0, 2, 1], 2) == pytest.approx(14 / 6)
    assert best_at_k([-2.0, -0.5, 0.0], 1) == pytest.approx(-2.5 / 3)  # k=1: the mean
    assert best_at_k([-2.0, -0.5, 0.0], 3) == 0.0  # k=n: the max


def test_best_at_k_on_binary_scores_equals_pass_at_k() -> None:
    assert best_at_k([1, 0, 0, 1, 0], 2) == pytest.approx(pass_at_k(5, 2, 2), abs=1e-12)
    with pytest.raises(ValueError):
        best_at_k([1, 0], 3)


def test_avg_at_n_and_mean_pass_at_k() -> None:
    correct = [[True, False, False, False], [True, True, True, True], [False] * 4]
    assert avg_at_n(correct) == pytest.approx((0.25 + 1 + 0) / 3)
    # pass@2: problem 1: 1 - C(3,2)/C(4,2) = 0.5; problem 2: 1; problem 3: 0.
    assert mean_pass_at_k(correct, 2) == pytest.approx(0.5)
    with pytest.raises(ValueError):
        avg_at_n([[True], []])


def test_structure_and_speed_metrics() -> None:
    assert mean_branches_per_block([[2, 3], [], [4]]) == 3.0
    assert mean_branches_per_block([[], []]) == 0.0
    assert ideal_speedup([10, 20], [5, 20]) == pytest.approx(30 / 25)
    assert tokens_per_second(300, 1.5) == 200.0
    assert achieved_speedup(300.0, 100.0) == 3.0
    with pytest.raises(ValueError):
        ideal_speedup([10], [11])
    with pytest.raises(ValueError):
        tokens_per_second(10, 0.0)


def _record(pid: str, idx: int, correct: bool, valid: bool, **kw: object) -> dict:
    rec = {f: None for f in RECORD_FIELDS}
    rec.update(
        problem_id=pid,
        sample_idx=idx,
        correct=correct,
        valid=valid,
        format_score=0.0 if valid else -1.0,
        n_tokens=kw.get("n_tokens", 10),
        critical_path_tokens=kw.get("crit", 10),
        is_parallel=kw.get("par", False),
        is_parallel_any=kw.get("par_any", False),
        branches_per_block=kw.get("branches", []),
        parallel_taken=kw.get("par", False),
        finish_reason=kw.get("finish", "stop"),
    )
    return rec


def test_summarize_records_pins_every_number() -> None:
    records = [
        _record("a", 0, True, True, n_tokens=30, crit=10, par=True, par_any=True, branches=[3]),
        _record("a", 1, False, True, n_tokens=20, crit=10, par=True, par_any=True, branches=[2]),
        _record("b", 0, False, False, n_tokens=10, crit=10, finish="length"),
        _record("b", 1, False, True, n_tokens=20, crit=20, par_any=True, branches=[1]),
    ]
    s = summarize_records(records, k=2, wall_s=2.0)
    assert s["n_problems"] == 2 and s["n_samples"] == 2 and s["k"] == 2
    assert s["accuracy"] == pytest.approx(0.25)  # (1/2 + 0/2) / 2
    assert s["pass@k"] == pytest.approx(0.5)  # problem a: 1 - C(1,2)/C(2,2) = 1; b: 0
    assert s["best_format_score@k"] == pytest.approx(0.0)  # each problem has a valid (score 0) sample
    assert s["mean_format_score"] == pytest.approx(-0.25)
    assert s["format_valid_rate"] == pytest.approx(0.75)
    assert s["correct_and_valid_rate"] == pytest.approx(0.25)
    assert s["parallel_rate"] == pytest.approx(0.5)
    assert s["parallel_rate_any"] == pytest.approx(0.75)
    assert s["mean_branches_per_block"] == pytest.approx(2.0)
    assert s["mean_tokens"] == pytest.approx(20.0)
    assert s["truncation_rate"] == pytest.approx(0.25)
    assert s["ideal_speedup"] == pytest.approx(80 / 50)
    assert s["tokens_per_s"] == pytest.approx(40.0)


def test_summarize_records_rejects_ragged_or_incomplete_input() -> None:
    ragged = [_record("a", 0, True, True), _record("a", 1, True, True), _record("b", 0, True, True)]
    with pytest.raises(ValueError, match="different sample counts"):
        summarize_records(ragged, k=1, wall_s=1.0)
    with pytest.raises(ValueError, match="lack fields"):
        summarize_records([{"problem_id": "a", "correct": True}], k=1, wall_s=1.0)
