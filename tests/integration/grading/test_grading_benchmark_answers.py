"""Every answer of every benchmark in shared/data graded against itself and against reformatted versions.

Formats covered by the files: AIME strings with leading zeros, AMC floats (``27.0``), MATH500 LaTeX
(fractions, radicals, intervals, matrices, degrees, ``\\text{}``), HMMT comma lists, OlympiadBench and
Minerva lists of alternatives (with ``$`` delimiters, trailing newlines, units). Reformatted versions must
grade True and perturbed ones False, through the same batch path RL and evaluation use.
"""

from __future__ import annotations

import json
import re
from fractions import Fraction
from pathlib import Path
from typing import Any

import pytest

from components.grading.answers import extract_answer
from components.grading.config import GradingConfig
from components.grading.equivalence import grade_many_verdicts
from components.grading.normalize import gold_candidates, normalize_answer, read_number

ANSWER_FIELDS = ("answer", "final_answer")
_SINGLE_FRAC = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_INT_ROOT = re.compile(r"^(\d+)\\sqrt\{(\d+)\}$")
_THOUSANDS = re.compile(r"^\\?\$?-?\d{1,3}(?:,\s*\d{3})+(?:\.\d+)?$")


def _records(path: Path) -> list[dict[str, Any]]:
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".jsonl":
        return [json.loads(line) for line in text.splitlines() if line.strip()]
    return json.loads(text)


def benchmark_golds(root: Path) -> dict[str, list[Any]]:
    """file -> gold answers (str, float or list); answers only in a solution are read from its last box."""
    out: dict[str, list[Any]] = {}
    for path in sorted(root.rglob("*.json*")):
        golds = []
        for record in _records(path):
            field = next((f for f in ANSWER_FIELDS if f in record), None)
            if field is not None:
                golds.append(record[field])
            else:  # qwen25_math/minerva_math keeps its answer only inside the solution's \boxed{}
                golds.append(extract_answer(record["solution"], []))
        out[str(path.relative_to(root))] = golds
    return out


def reformatted(gold: str) -> list[str]:
    """Written variants of ``gold`` that mean the same answer."""
    variants = [f"${gold}$", gold.replace("\\frac", "\\dfrac")]
    if not _THOUSANDS.match(gold.replace("\\!", "")):
        # a space after each comma of a list; not of `58,500`, where `58, 500` reads as two numbers
        variants.append(" ".join(gold.replace(",", ", ").split()))
    value = read_number(normalize_answer(gold))
    if value is not None:
        variants.append(f"{value.numerator}/{value.denominator}" if value.denominator != 1 else f"{value}.0")
        if value.denominator != 1 and (value * 10**6).denominator == 1:
            variants.append(str(float(value)))  # terminating decimals only: 1/2 -> 0.5
        variants.append(f"{gold}\\text{{ units}}")
    if m := _SINGLE_FRAC.match(gold):  # `\frac{a}{b}` -> `(a)/(b)`: only math-verify can see these agree
        variants.append(f"{m.group(1)}({m.group(2)})/({m.group(3)})")
    if m := _INT_ROOT.match(gold):  # `4\sqrt{2}` -> `\sqrt{32}`
        variants.append(f"\\sqrt{{{int(m.group(1)) ** 2 * int(m.group(2))}}}")
    return variants


def perturbed(gold: str) -> str | None:
    """A wrong answer for ``gold``: the number + 1, or None when no simple perturbation is certain."""
    value = read_number(normalize_answer(gold))
    if value is None:
        return None
    wrong = value + 1
    return str(wrong.numerator) if wrong.denominator == 1 else f"{wrong.numerator}/{wrong.denominator}"


@pytest.fixture(scope="module")
def golds(shared_data: Path) -> dict[str, list[Any]]:
    found = benchmark_golds(shared_data / "benchmarks")
    assert len(found) == 15 and sum(map(len, found.values())) == 3207  # the MANIFEST row counts
    return found


def test_every_answer_equals_itself_and_its_boxed_response(
    golds: dict[str, list[Any]], pool_cfg: GradingConfig
) -> None:
    pairs: list[tuple[str | None, Any]] = []
    for answers in golds.values():
        for gold in answers:
            for candidate in gold_candidates(gold):
                pairs.append((candidate, gold))
                response = f"Reasoning ... so the result follows.\n\nThe answer is $\\boxed{{{candidate}}}$."
                pairs.append((extract_answer(response), gold))
    verdicts = grade_many_verdicts(pairs, pool_cfg)
    failures = [(p, v) for p, v in zip(pairs, verdicts, strict=True) if not v.equal]
    assert not failures, failures[:10]


def test_reformatted_answers_are_equal(golds: dict[str, list[Any]], pool_cfg: GradingConfig) -> None:
    pairs: list[tuple[str, Any]] = []
    for answers in golds.values():
        for gold in answers:
            for candidate in gold_candidates(gold):
                pairs.extend((variant, gold) for variant in reformatted(candidate))
    verdicts = grade_many_verdicts(pairs, pool_cfg)
    failures = [(p, v) for p, v in zip(pairs, verdicts, strict=True) if not v.equal]
    assert not failures, failures[:10]
    methods = {v.method for v in verdicts}
    assert {"exact", "numeric", "math_verify"} <= methods  # every path was exercised


def test_fast_path_never_says_false_where_math_verify_says_true(
    golds: dict[str, list[Any]], pool_cfg: GradingConfig
) -> None:
    """The decisive-False rules (numbers, number vs expression) agree with math-verify on real answers."""
    import random

    from components.grading.equivalence import fast_verdict
    from components.grading.verify_pool import get_pool

    answers = [gold_candidates(g)[0] for values in golds.values() for g in values]
    rng = random.Random(0)
    decided_false: dict[str, list[tuple[str, str]]] = {"numeric": [], "number_vs_expression": []}
    for gold in answers:
        for pred in (rng.choice(answers), perturbed(gold)):
            verdict = fast_verdict(pred, gold, pool_cfg.float_rel_tol) if pred else None
            if verdict is not None and not verdict.equal and verdict.method in decided_false:
                decided_false[verdict.method].append((gold, pred))
    sample = [pair for pairs in decided_false.values() for pair in rng.sample(pairs, 40)]
    pool = get_pool(pool_cfg.workers, pool_cfg.pool_start_timeout_s)
    results = pool.verify(sample, timeout_s=3.0, chunk_size=8)
    assert not [pair for pair, (equal, _) in zip(sample, results, strict=True) if equal]


def test_perturbed_answers_are_not_equal(golds: dict[str, list[Any]], pool_cfg: GradingConfig) -> None:
    pairs = []
    for answers in golds.values():
        for gold in answers:
            candidates = gold_candidates(gold)
            if len(candidates) == 1 and (wrong := perturbed(candidates[0])) is not None:
                pairs.append((wrong, gold))
    assert len(pairs) > 1500
    verdicts = grade_many_verdicts(pairs, pool_cfg)
    assert not [p for p, v in zip(pairs, verdicts, strict=True) if v.equal]


@pytest.mark.parametrize(
    ("pred", "gold", "equal"),
    [
        ("0.5", "\\frac{1}{2}", True),
        ("1/2", "\\frac{1}{2}", True),
        ("\\frac12", 0.5, True),
        ("27", 27.0, True),
        ("27.5", 27.0, False),
        ("33", "033", True),
        ("995", "995\\text{ dollars}", True),
        ("[1, 2)", "[1,2)", True),
        ("[1,2]", "[1,2)", False),
        ("(-\\infty, 3] \\cup (5, \\infty)", "(-\\infty,3]\\cup(5,\\infty)", True),
        ("\\sqrt{8}", "2\\sqrt{2}", True),
        ("x^2+2x+1", "(x+1)^2", True),
        ("\\{1,2,3\\}", "\\{3,2,1\\}", True),
        ("3", "x=3", True),
        (
            "\\frac{-1-\\sqrt{17}}{2}, \\frac{-1+\\sqrt{17}}{2}",
            "\\frac{-1+\\sqrt{17}}{2}, \\frac{-1-\\sqrt{17}}{2}",
            True,
        ),
        ("3.89\\times10^{-10}", ["3.89e-10\n", "3.89e-10"], True),
        (
            "\\frac{e^{t}}{3} + c e^{-2t}",
            ["x = \\frac{e^{t}}{3} + ce^{-2t}\n", "\\frac{e^{t}}{3} + c e^{-2t}\n"],
            True,
        ),
        ("\\frac{1}{576}", "\\frac{1}{567}", False),
    ],
)
def test_known_pairs(pred: str, gold: Any, equal: bool, pool_cfg: GradingConfig) -> None:
    assert grade_many_verdicts([(pred, gold)], pool_cfg)[0].equal is equal


def test_exact_fraction_variants_agree_with_fraction_arithmetic() -> None:
    # The variants' numeric claims are checked independently of the grader.
    assert Fraction("0.5") == Fraction(1, 2)
    assert reformatted("\\frac{1}{2}")[3:5] == ["1/2", "0.5"]
