"""Equations and relations are graded as relations (issue 28): both sides, or the solved quantity when the
gold is an assignment ``var = value``; never the right-hand side alone."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest

from components.grading.cli_ops import grade_jsonl
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
    # a computation without variables, judged whole in the pool (the fast path no longer reduces it)
    ("3", "$\\begin{vmatrix} 2 & 1 \\\\ 1 & 2 \\end{vmatrix} = 3$"),
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


# The issue's examples, through `npr grade --jsonl` (cli_ops.grade_jsonl): (gold, pred, verdict).
ISSUE_EXAMPLES = [
    ("x=2", "y=2", False),
    ("\\tan t = 2", "\\cot t = 2", False),
    ("x=2", "2=x", True),
    ("42", "<answer>42</answer>", True),
    ("2x+3", "<think>...</think> <answer>2x+3</answer>", True),
    ("C", "<think>I guess \\boxed{B}, no wait</think> Final: \\boxed{C}", True),
    ("1", "\\sin^2 t+\\cos^2 t", True),
    ("\\sin^2 t+\\cos^2 t", "1", True),
    ("(1+i)^2", "2i", True),
    ("2i", "(1+i)^2", True),
    ("3*cos(2*t)-1", "3\\cos(2t)-1", True),
    ("3**20", "3^{20}", True),
    ("(a^3)**2", "a^6", True),
    ("12", "Réponse : 12", True),
    ("12", "答案：12", True),
    ("12", "Antwort: 12", True),
    # neighbours that were right before and must stay right
    ("2|x|", "\\sqrt{4x^2}", True),
    ("1", "\\tan(\\pi/4)", True),
    ("y \\ne 2", "y != 2", True),
]


def test_the_issue_examples_through_npr_grade_jsonl(tmp_path: Path, pool_cfg: GradingConfig) -> None:
    path = tmp_path / "pairs.jsonl"
    path.write_text(
        "".join(json.dumps({"gold": g, "pred": p}, ensure_ascii=False) + "\n" for g, p, _ in ISSUE_EXAMPLES),
        encoding="utf-8",
    )
    out = io.StringIO()
    counts = grade_jsonl(path, out, pool_cfg)
    assert counts["grade_failures"] == 0
    rows = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [(r["gold"], r["pred"], r["equal"]) for r in rows] == ISSUE_EXAMPLES
