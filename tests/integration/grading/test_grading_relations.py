"""Equations and relations are graded as relations (issue 28): both sides, or the solved quantity when the
gold is an assignment ``var = value``; never the right-hand side alone."""

from __future__ import annotations

import pytest

from components.grading.config import GradingConfig
from components.grading.equivalence import grade_many_verdicts

# (gold, pred): credited
CREDITED = [
    ("x=2", "x=2"),
    ("x=2", "2"),  # the value of the solved variable
    ("x=2", "2=x"),  # the same assignment written the other way round
    ("x=2", "x = 2.0"),
    ("x = \\frac{1}{2}", "x=0.5"),
    ("\\tan t = 2", "\\tan(t)=2"),
    ("y=2x+1", "2x+1"),
    ("2x+1", "y=2x+1"),
    ("f(x) = x^2", "f(x)=x^{2}"),
    ("x=2, y=3", "y=3, x=2"),  # each quantity its value, in any order
    ("x=2, y=3", "2, 3"),  # unlabelled: in the gold's order
    ("2x+y=1", "y=1-2x"),  # an equation between expressions: both sides (math-verify)
    ("y \\ne 2", "y != 2"),
]
# (gold, pred): refused
REFUSED = [
    ("x=2", "y=2"),
    ("\\tan t = 2", "\\cot t = 2"),
    ("a=5", "b=5"),
    ("f(x)=2x", "g(x)=2x"),
    ("x=2", "x=3"),
    ("x=2", "x=2, y=3"),
    ("x=2, y=3", "x=3, y=2"),
    ("x=2, y=3", "3, 2"),
    ("x=2, y=3", "x=2, z=3"),
    ("x^2=4", "x=2"),  # an equation is not one of its roots
    ("2x+y=1", "y=1+2x"),
]


@pytest.mark.parametrize(
    ("gold", "pred", "expected"), [(g, p, True) for g, p in CREDITED] + [(g, p, False) for g, p in REFUSED]
)
def test_relations_are_graded_as_relations(
    gold: str, pred: str, expected: bool, pool_cfg: GradingConfig
) -> None:
    verdict = grade_many_verdicts([(pred, gold)], pool_cfg)[0]
    assert verdict.equal is expected, verdict
    assert verdict.reason is None


def test_assignments_to_different_quantities_are_refused_without_the_pool() -> None:
    from components.grading.equivalence import fast_verdict

    for gold, pred in [("x=2", "y=2"), ("\\tan t = 2", "\\cot t = 2"), ("x=2, y=3", "x=3, y=2")]:
        verdict = fast_verdict(pred, gold, 1e-6)
        assert verdict is not None and not verdict.equal
