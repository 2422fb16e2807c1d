"""The fast path of equivalence (normalisation, numbers, list golds): decided without the process pool."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest

from components.grading import verify_pool
from components.grading.config import GradingConfig
from components.grading.equivalence import Verdict, fast_verdict, grade_many_verdicts
from components.grading.normalize import (
    gold_candidates,
    has_free_symbols,
    normalize_answer,
    numbers_equal,
    read_number,
)


@pytest.fixture()
def no_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail loudly if anything tries to reach math-verify: these pairs must be decided on the fast path."""

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the fast path sent a pair to the math-verify pool")

    monkeypatch.setattr(verify_pool, "get_pool", refuse)


@pytest.mark.parametrize(
    ("raw", "normalized"),
    [
        ("$\\dfrac{1}{2}$", "\\frac{1}{2}"),
        ("\\tfrac12", "\\frac{1}{2}"),
        ("\\left( 1, 2 \\right]", "(1,2]"),
        ("995\\text{ dollars}", "995"),
        ("5\\,\\mbox{cm}", "5"),
        ("\\text{(C)}", "C"),
        ("(b)", "B"),
        ("36^\\circ", "36"),
        ("36^{\\circ}", "36"),
        ("50\\%", "50"),
        ("x = 3", "3"),
        ("a_n = 2^n", "2^n"),
        ("x = y = 3", "3"),  # a chain: its last right-hand side
        ("x = 5+5+1 = 7 =11", "11"),
        ("x \\approx 11", "11"),
        ("x = 1/3 \\approx 0.33", "1/3"),  # the exact value wins over the approximation
        ("f(x) = 1", "1"),
        ("|AB| = 1", "1"),
        ("(p,q) = (3,2)", "(3,2)"),
        ("S_{MBCN}:S = 7:32", "7:32"),
        ("I_{\\max } = \\frac{q}{2}", "\\frac{q}{2}"),
        ("2x + 4y - 3 = 0", "2x+4y-3=0"),  # not a label: the equation stays
        ("7 = 11a+c", "7=11a+c"),
        ("x \\in [-2, 7]", "[-2,7]"),
        ("14{,}916", "14916"),
        ("16,\\!386.20", "16386.20"),
        ("11,\\! 111,\\! 111,\\! 100", "11111111100"),
        ("32, 349", "32,349"),  # a comma and a space: a list, not a thousands separator
        ("\\$1,000.99", "1000.99"),
        ("$1,000.99", "1000.99"),  # a lone dollar is currency
        ("1,000.99€", "1000.99"),
        ("36 dollars", "36"),
        ("$125$ miles", "125"),
        ("28 pct", "28"),
        ("\\textbf{(211) }", "211"),
        ("\\\\frac{1}{2}", "\\frac{1}{2}"),  # a doubled backslash before a command
        ("6 \\text{ and } 8", "6,8"),
        ("19, 46, and 82", "19,46,82"),
        ("\\boxed{\\sqrt 2}", "\\sqrt{2}"),
        ("1,000,000", "1000000"),
        ("(1,234)", "(1,234)"),
        ("7.", "7"),
        ("\u22123", "-3"),
        ("\\begin{pmatrix} -1 & 0 \\\\ 0 & -1 \\end{pmatrix}", "\\begin{pmatrix}-1&0\\\\0&-1\\end{pmatrix}"),
        ("\\text{Evelyn}", "Evelyn"),
        ("2 \\pi c", "2\\pi{}c"),  # not the command `\\pic`
        ("5.4 \\text{ cents}\\text{ units}", "5.4"),
        ("$k=3$\\text{ units}", "3"),
    ],
)
def test_normalize_answer(raw: str, normalized: str) -> None:
    assert normalize_answer(raw) == normalized


@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("27", Fraction(27)),
        ("27.0", Fraction(27)),
        ("033", Fraction(33)),
        ("-0.5", Fraction(-1, 2)),
        ("3.3e12", Fraction(3_300_000_000_000)),
        ("1/2", Fraction(1, 2)),
        ("-\\frac{3}{4}", Fraction(-3, 4)),
        ("2.26\\times10^{-10}", Fraction(226, 10**12)),
        ("10^{5}", Fraction(10**5)),
        ("\\frac{1}{0}", None),
        ("\\sqrt{2}", None),
        ("1e99999999", None),  # exponent too long to read: left to math-verify, never computed here
        ("x", None),
    ],
)
def test_read_number(text: str, value: Fraction | None) -> None:
    assert read_number(text) == value


def test_integers_compare_exactly_and_decimals_with_tolerance() -> None:
    assert not numbers_equal(Fraction(1_000_000), Fraction(1_000_001), rel_tol=1e-3)
    assert numbers_equal(Fraction(1, 3), Fraction(333_333_333, 10**9), rel_tol=1e-6)
    assert not numbers_equal(Fraction(1, 3), Fraction(333, 1000), rel_tol=1e-6)


def test_gold_candidates_handle_every_benchmark_type() -> None:
    assert gold_candidates(27.0) == ("27",)
    assert gold_candidates(0.25) == ("0.25",)
    assert gold_candidates(7) == ("7",)
    assert gold_candidates(" \\frac{3}{2} ") == ("\\frac{3}{2}",)
    assert gold_candidates(["3.89e-10\n", "3.89e-10"]) == ("3.89e-10",)
    assert gold_candidates(np.array(["1", "2"], dtype=object)) == ("1", "2")
    # a gold written as a solution text stands for the answer it states
    assert gold_candidates("The correct result is \\boxed{42}") == ("42",)
    assert gold_candidates("answer is 0.25 + 3") == ("0.25 + 3",)
    solution = (
        "Adding the two cases gives the total, and nothing else is possible. " * 2 + "So it is $\\boxed{7}$."
    )
    assert gold_candidates(solution) == ("7",)
    for bad in (None, [], "  ", [None], True, float("nan"), {"a": 1}):
        with pytest.raises(ValueError):
            gold_candidates(bad)


@pytest.mark.parametrize(
    ("pred", "gold", "verdict"),
    [
        ("0.5", "\\frac{1}{2}", Verdict(True, "numeric")),
        ("1/2", "0.5", Verdict(True, "numeric")),
        ("27", "27.0", Verdict(True, "numeric")),
        ("33", "033", Verdict(True, "numeric")),
        ("\\dfrac{1}{2}", "\\frac{1}{2}", Verdict(True, "exact")),
        ("[1, 2)", "[1,2)", Verdict(True, "exact")),
        ("995", "995\\text{ dollars}", Verdict(True, "exact")),
        ("336", "336^\\circ", Verdict(True, "exact")),
        ("26", "27", Verdict(False, "numeric")),
        ("0.1", "10\\%", Verdict(True, "numeric")),  # a percent also reads as its value over 100
        ("10", "10\\%", Verdict(True, "exact")),  # MATH's convention: the sign may be left out
        ("60\\%", "0.6", Verdict(True, "numeric")),
        ("0.2", "10\\%", Verdict(False, "numeric")),
        ("1000,99", "1000.99", Verdict(True, "numeric")),  # a decimal comma
        ("0.111", "0,111", Verdict(True, "numeric")),
        ("1,000", "1", Verdict(False, "numeric")),  # a group of three digits is a thousands separator
        ("-2, 1", "1,-2", Verdict(True, "list")),  # "all solutions": a set
        ("\\{-2, 1\\}", "1,-2", Verdict(True, "list")),
        ("1, -2, 3", "1,-2", Verdict(False, "list")),
        ("(1,-2)", "(-2,1)", Verdict(False, "list")),  # an ordered pair in the wrong order
        ("(-1,31,6)", "(6,31,-1)", Verdict(False, "list")),
        ("6, 31, -1", "(6,31,-1)", Verdict(True, "list")),  # boxes joined in order read as the tuple
        ("(4,3]", "(3,4]", Verdict(False, "list")),  # an interval reversed
        ("x=-5, p=\\frac{14}{3}", "-5, \\frac{14}{3}", Verdict(True, "list")),
        # a computation without variables is a statement, judged by its truth in the pool, not by its last
        # side here (tests/integration/grading/test_grading_relations.py)
        ("$\\begin{vmatrix} 2 & 1 \\\\ 1 & 2 \\end{vmatrix} = 3$", "3", None),
        ("  ", "3", Verdict(False, "no_answer")),
        ("12", "(-\\frac{1}{2}, \\frac{7}{2})", Verdict(False, "number_vs_expression")),
        ("81", "\\frac{2 \\pi c^{2}}{\\lambda^{5}}", Verdict(False, "number_vs_expression")),
        ("y = 2x + 3", "3", Verdict(False, "number_vs_expression")),
        ("4 apples", "4", Verdict(False, "number_vs_expression")),
    ],
)
def test_fast_verdicts(pred: str, gold: str, verdict: Verdict) -> None:
    assert fast_verdict(pred, gold, rel_tol=1e-6) == verdict


def test_undecidable_pairs_are_left_to_math_verify() -> None:
    assert fast_verdict("\\sqrt{8}", "2\\sqrt{2}", rel_tol=1e-6) is None
    assert fast_verdict("5", "\\sqrt{25}", rel_tol=1e-6) is None
    assert fast_verdict("7.389", "e^{2}", rel_tol=1e-6) is None  # e and i are constants, not variables
    # a function of a free variable may be an identity: the symbolic fallback decides (issue 28) ...
    assert fast_verdict("1", "\\sin^2 x + \\cos^2 x", rel_tol=1e-6) is None
    # ... a polynomial in a free variable equals no number
    assert fast_verdict("1", "x^2 + 1", rel_tol=1e-6) == Verdict(False, "number_vs_expression")


@pytest.mark.parametrize(
    ("normalized", "free"),
    [
        ("2\\sqrt{3}", False),
        ("e^{i\\pi}", False),
        ("sqrt(2)", False),
        ("3x+1", True),
        ("C_{1}e^{t}", True),
        ("(C)", True),
    ],
)
def test_has_free_symbols(normalized: str, free: bool) -> None:
    assert has_free_symbols(normalized) is free


def test_grade_many_fast_pairs_never_touch_the_pool(no_pool: None) -> None:
    pairs = [
        ("27", 27.0),  # AMC float gold
        ("3.89e-10", ["3.89e-10\n", "3.89e-10"]),  # Minerva list gold
        ("12", ["11", "12"]),  # any-of: the second alternative matches
        ("13", ["11", "12"]),
        (None, "5"),
        ("", "5"),
        ("\\frac{2}{3}", ["$\\frac{2}{3}$"]),  # OlympiadBench list with $ delimiters
    ]
    assert [v.equal for v in grade_many_verdicts(pairs, GradingConfig())] == [
        True,
        True,
        True,
        False,
        False,
        False,
        True,
    ]


def test_grade_many_names_the_bad_pair() -> None:
    with pytest.raises(ValueError, match="pair 1: gold None holds no answer"):
        grade_many_verdicts([("1", "1"), ("1", None)])
    with pytest.raises(ValueError, match="pair 0: pred must be a str"):
        grade_many_verdicts([(3, "3")])  # type: ignore[list-item]


def test_a_computation_in_parentheses_is_its_result() -> None:
    # `réponse est (35 + 70 = 105).` (lighteval's French case): the computation's last right-hand side
    assert normalize_answer("(35 + 70 = 105)") == "105"
    assert normalize_answer("(p,q)=(3,2)") == "(3,2)"
    assert normalize_answer("(x+1)") == "(x+1)"
