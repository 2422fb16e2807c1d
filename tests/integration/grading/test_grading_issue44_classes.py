"""The classes of issue 44, each with pairs written for the project, credited and refused, through the whole
grader (fast path, then the pool: ``relations``, math-verify, ``symbolic``); and the two answer conventions
it decided, the same for the reward and the evaluation purposes."""

from __future__ import annotations

import pytest

from components.grading.config import GradingConfig
from components.grading.equivalence import grade_many_verdicts
from components.grading.judge import judge_many

# (class, gold, pred)
CREDITED = [
    # equations without a variable: statements, read by truth value and sides
    ("variable_free_relation", "7", "3+4=7"),
    ("variable_free_relation", "3+4=7", "5+2=7"),  # two true computations of one value
    ("variable_free_relation", "2=3+4", "3+4=2"),  # a false statement is only itself
    ("variable_free_relation", "23^{1.5}=110.304", "110.304=23^{1.5}"),  # a decimal side is its rounding
    # relations: both sides, never the right-hand side alone
    ("relation", "x=y", "y=x"),
    ("relation", "x=1.69", "x=1.3^2"),  # decimals inside an equation are the numbers they write
    ("relation", "y=\\sin x", "y=\\sin(x+2\\pi)"),  # an identity inside an equation
    ("relation", "y = 2x - 5", "2y = 4x - 10"),
    ("relation", "w(12.5-w)=25", "2w+50/w=25"),  # a ratio undefined only where the equation is
    ("relation", "x^2 = 4", "x = 2 \\text{ or } x = -2"),
    ("relation", "y == x**2", "y = x^2"),  # Python's == and ** inside a relation
    ("relation", "x > 1", "2 < 2x"),
    ("relation", "x \\ge 1", "1 \\le x"),
    ("relation", "x = 1", "x \\ge 1 \\text{ and } x \\le 1"),
    # reciprocal, hyperbolic and inverse functions, factorials, powers of functions, degrees
    ("function", "\\arccos(1/x)", "\\operatorname{arcsec}(x)"),
    ("function", "\\arcsin(1/x)", "arccsc(x)"),
    ("function", "\\arctan(1/x)", "arccot x"),
    ("function", "\\frac{1}{\\sinh x}", "\\csch x"),
    ("function", "\\frac{1}{\\cosh x}", "\\operatorname{sech}(x)"),
    ("function", "\\frac{\\cosh x}{\\sinh x}", "coth(x)"),
    ("function", "(n+1)!", "(n+1)*factorial(n)"),
    ("function", "\\sin(x)^2", "sin^2(x)"),
    ("function", "1", "sin^2 x + cos^2 x"),
    ("function", "\\cos x", "\\sin(90^\\circ - x)"),
    ("function", "\\arccos x", "cos^(-1)(x)"),
    # an expression whose variables cancel
    ("simplification", "0", "x^2-x^2"),
    ("simplification", "1", "x/x"),
    ("simplification", "2", "\\frac{2x}{x}"),
    ("simplification", "0", "0 \\cdot y"),
    # units on the gold
    ("units", "10\\text{ cm}^2", "10"),
    ("units", "10 cm^2", "10"),
    ("units", "5 m/s", "5"),
    ("units", "10 weeks", "10"),
    ("units", "9.8 \\mathrm{m/s^2}", "9.8"),
    # solution sets with several variables: sets of points
    ("several_variables", "p=5, q=2; p=7, q=2", "p=7, q=2; p=5, q=2"),
    ("several_variables", "a=1, b=2, c=3", "[3a+b-c=2, a-b+2c=5, b+c=5]"),
    ("several_variables", "x=1, y=2", "y=2, x=1"),
]
REFUSED = [
    ("variable_free_relation", "5=7+4", "2=3+4"),  # false credit before issue 44
    ("variable_free_relation", "x=1", "1=1"),  # says nothing about x
    ("variable_free_relation", "1=x", "1=1"),
    ("variable_free_relation", "7", "2=3+4"),  # a false statement is no answer
    ("variable_free_relation", "1=4", "2=3"),
    ("relation", "y=2x-5", "yz=2xz-5z"),  # divided by a variable: also holds on z = 0
    ("relation", "x^2=4", "x=2"),
    ("relation", "x=2", "(x-2)^2=0"),
    ("relation", "x>y", "y>x"),
    ("relation", "x>1", "x \\ge 1"),
    ("relation", "x=1.69", "x=1.3^3"),
    ("relation", "y=\\sin x", "y=\\cos x"),
    ("relation", "y == x**2", "y = x^3"),
    ("function", "\\frac{1}{\\sinh x}", "\\csch(2x)"),
    ("function", "\\arccos(1/x)", "\\operatorname{arccsc}(x)"),
    ("function", "\\cos x", "\\sin(45^\\circ - x)"),
    ("function", "\\sin(x)^2", "sin(x^2)"),
    ("function", "n!", "factorial(n+1)"),
    ("function", "\\frac{1}{\\tanh x}", "\\coth(x) + 1"),
    ("simplification", "1", "x^2+1"),
    ("simplification", "0", "x^2-x"),
    ("simplification", "1", "x/y"),
    ("simplification", "2", "x+x"),
    ("units", "10\\text{ cm}^2", "12"),
    ("units", "5 m/s", "5.5"),
    ("units", "10 weeks", "7"),
    ("units", "0.64N", "0.64"),  # a one-letter unit glued to its number may be a variable
    ("several_variables", "p=5, q=2; p=7, q=2", "p=5, q=2"),  # a solution missing
    ("several_variables", "p=5, q=2; p=7, q=2", "p=5, q=7; p=2, q=2"),
    ("several_variables", "a=1, b=2, c=3", "[3a+b-c=2, a-b+2c=5, b+c=6]"),
]


@pytest.mark.parametrize(
    ("cls", "gold", "pred", "expected"),
    [(c, g, p, True) for c, g, p in CREDITED] + [(c, g, p, False) for c, g, p in REFUSED],
)
def test_issue_44_classes(cls: str, gold: str, pred: str, expected: bool, pool_cfg: GradingConfig) -> None:
    verdict = grade_many_verdicts([(pred, gold)], pool_cfg)[0]
    assert verdict.equal is expected, (cls, verdict)
    assert verdict.reason is None


def test_every_class_has_credited_and_refused_pairs() -> None:
    classes = {c for c, _, _ in CREDITED}
    assert classes == {c for c, _, _ in REFUSED}
    assert len(classes) == 6


# The two conventions issue 44 decided (docs/architecture.md, "Grading API"): (gold, response, credited).
CONVENTIONS = [
    # no box and no answer label: not an answer, for any purpose
    ("5", "Adding the two parts, the result is 5.", False),
    ("5", "It is 5.", False),
    # several boxes: the last run; boxes joined only by connectors are one answer listing values
    ("5", "First I got \\boxed{3}. Checking again, the final count is \\boxed{5}.", True),
    ("1, -2", "The roots are \\boxed{1} and \\boxed{-2}.", True),
    ("2", "\\boxed{1} \\boxed{2}", False),  # two values for one: hedging earns nothing
    ("5", "So $\\boxed{5}$, that is $\\boxed{5}$.", True),  # the same value twice is one answer
    ("3", "First I got \\boxed{3}. Checking again, the final count is \\boxed{5}.", False),
]


@pytest.mark.parametrize(("gold", "response", "credited"), CONVENTIONS)
def test_reward_and_evaluation_follow_the_same_conventions(
    gold: str, response: str, credited: bool, pool_cfg: GradingConfig
) -> None:
    for purpose in ("reward", "evaluation"):
        judgement = judge_many([response], [gold], "npr", pool_cfg, purpose=purpose, finish_reasons=["stop"])[
            0
        ]
        assert judgement.correct is credited, (purpose, judgement)
