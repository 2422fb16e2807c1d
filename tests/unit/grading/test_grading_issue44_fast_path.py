"""Issue 44 on the fast path (no pool): what it now decides, and what it must leave to the pool."""

from __future__ import annotations

import pytest

from components.grading.equivalence import Verdict, fast_verdict
from components.grading.normalize import clean_answer, variable_free_relation


@pytest.mark.parametrize(
    ("pred", "gold", "verdict"),
    [
        # units on the gold: unit expressions with powers, quotients and long names
        ("10", "10 cm^2", Verdict(True, "exact")),
        ("10", "10\\text{ cm}^{2}", Verdict(True, "exact")),
        ("5", "5 m/s", Verdict(True, "exact")),
        ("10", "10 weeks", Verdict(True, "exact")),
        ("12", "10 cm^2", Verdict(False, "numeric")),
        # a mixed number is not the digits glued together
        ("1.5", "1 1/2", Verdict(True, "numeric")),
        ("11/2", "1 1/2", Verdict(False, "numeric")),
        # a time of day, when seconds or a half-day mark say it is one
        ("20:34:00", "20:34", Verdict(True, "numeric")),
        ("08:34 \\text{P.M.}", "20:34", Verdict(True, "numeric")),
        ("08:34 \\text{A.M.}", "20:34", Verdict(False, "numeric")),
        # the same letters in another case are other variables
        ("X^2+1", "x^2+1", Verdict(False, "variables")),
        ("X", "x", Verdict(False, "variables")),
        # a statement without variables says nothing about the gold's variables
        ("1=1", "x=1", Verdict(False, "relation")),
        ("1=1", "1=x", Verdict(False, "relation")),
        # a power of ten with its exponent in parentheses is a number
        ("10^(-30)", "2*10^(-30)", Verdict(False, "numeric")),
        # Python's `==` is the equation sign
        ("x==2", "2", Verdict(True, "exact")),
        # a polynomial whose variables are written once each never equals a number
        ("x^2+1", "1", Verdict(False, "number_vs_expression")),
        ("4 apples", "4", Verdict(False, "number_vs_expression")),
    ],
)
def test_decided_on_the_fast_path(pred: str, gold: str, verdict: Verdict) -> None:
    assert fast_verdict(pred, gold, rel_tol=1e-6) == verdict


@pytest.mark.parametrize(
    ("pred", "gold"),
    [
        ("2=3+4", "7"),  # a statement: its truth is checked in the pool (relations)
        ("3+4=7", "7"),
        ("x/x", "1"),  # variables written twice may cancel
        ("x^2-x^2", "0"),
        ("0\\cdot y", "0"),
        ("binom(8,3)", "56"),  # a comma between a function's arguments is no list
        ("1/3p-3=114", "p=351"),  # an equation is not an expression: compared whole
        ("sin^2 x + cos^2 x", "1"),  # a power of a function may be an identity
        ("3:4", "6:8"),  # without seconds or a half-day mark, not a time
    ],
)
def test_left_to_the_pool(pred: str, gold: str) -> None:
    assert fast_verdict(pred, gold, rel_tol=1e-6) is None


@pytest.mark.parametrize(
    ("answer", "cleaned"),
    [
        ("0.64N", "0.64N"),  # a one-letter unit alone may be a variable: kept
        ("0.64 N", "0.64 N"),
        ("2 m + 1", "2 m + 1"),  # a unit only after the number that is the whole answer
        ("x m", "x m"),
        ("9.8 \\mathrm{m/s^2}", "9.8"),
        ("$15\\mbox{ cm}^2$", "15"),
    ],
)
def test_unit_expressions(answer: str, cleaned: str) -> None:
    assert clean_answer(answer) == cleaned


def test_statements_are_recognised() -> None:
    assert variable_free_relation("2=3+4") and variable_free_relation("1=1")
    assert not variable_free_relation("x=1") and not variable_free_relation("x = 5+6 = 11")
    assert not variable_free_relation("1, 2") and not variable_free_relation("7")
