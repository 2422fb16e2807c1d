"""The synthetic task family: determinism, verifiable answers, canonical parallel layout, mistakes."""

from __future__ import annotations

import random
import re

import pytest

from components.data.problems import content_id
from components.data.synthetic import (
    LEVELS,
    MISTAKES,
    Expression,
    allocate,
    generate_problems,
    render_solution,
)

# The strict validity regex of ../shared/notes/tiny-feasibility.md, written out independently of the code.
VALID = re.compile(
    r"^\s*<guideline>((\s*<plan>[^<>]+</plan>)+)\s*</guideline>((\s*<step>[^<>]+</step>)+)\s*"
    r"<takeaway>[^<>]+</takeaway>[^<>]*\\boxed\{-?\d+\}[^<>]*$"
)
CANONICAL = re.compile(
    r"^<guideline>(<plan>\d+: [^<>]+</plan>)+</guideline>(<step>\d+: [^<>]+</step>)+"
    r"<takeaway>[^<>]+</takeaway> The answer is \\boxed\{-?\d+\}\.$"
)


def _recompute(problem: str) -> int:
    # Independent check: the problem's expression is valid Python arithmetic once "Compute" and "." go.
    expr = problem.removeprefix("Compute ").removesuffix(".")
    assert re.fullmatch(r"[\d\s()+\-*]+", expr), problem
    return eval(expr)  # noqa: S307 - digits, brackets and + - * only (asserted above)


def test_same_seed_same_problems_and_different_seed_differs():
    a, b = generate_problems(300, seed=7), generate_problems(300, seed=7)
    assert a == b
    c = generate_problems(300, seed=8)
    assert [r["id"] for r in a] != [r["id"] for r in c]


def test_answers_verified_by_recomputation_and_ids_are_content_hashes():
    records = generate_problems(2000, seed=0, weights={"easy": 1, "medium": 1, "hard": 1})
    for r in records:
        assert int(r["answer"]) == _recompute(r["problem"])
        assert r["id"] == content_id(r["problem"], r["answer"])
        assert r["source"] == "synthetic"
    assert len({r["problem"] for r in records}) == len(records)


def test_difficulty_levels_have_their_shape():
    records = generate_problems(900, seed=3, weights={"easy": 1, "medium": 1, "hard": 1})
    for r in records:
        parts = re.findall(r"\((\d) ([-+*]) (\d)\)", r["problem"])
        ops = [op for _, op, _ in parts]
        if r["difficulty"] == "easy":
            assert len(parts) == 2 and set(ops) <= {"+", "-"}
        elif r["difficulty"] == "medium":
            assert len(parts) == 3 and set(ops) <= {"+", "-"}
        else:
            assert len(parts) == 2 and "*" in ops
    assert {r["difficulty"] for r in records} == {"easy", "medium", "hard"}


def test_allocation_and_capacity_pinned():
    assert allocate(10, {"easy": 0.8, "medium": 0.1, "hard": 0.1}) == {"easy": 8, "medium": 1, "hard": 1}
    assert allocate(7, {"easy": 1, "hard": 1}) == {"easy": 4, "medium": 0, "hard": 3}
    # 9^4 operand choices x 2^2 inner ops x 2 outer ops; hard: 9^4 x (3^2 - 2^2) x 2; medium: 9^6 x 2^3 x 2^2.
    assert LEVELS["easy"].capacity() == 52_488
    assert LEVELS["hard"].capacity() == 65_610
    assert LEVELS["medium"].capacity() == 17_006_112
    with pytest.raises(ValueError, match="distinct easy"):
        generate_problems(52_489, seed=0, weights={"easy": 1})
    with pytest.raises(ValueError, match="unknown difficulty"):
        generate_problems(3, seed=0, weights={"trivial": 1})


def test_parallel_rendering_is_canonical_and_valid():
    rng = random.Random(0)
    for r in generate_problems(200, seed=1, weights={"easy": 1, "medium": 1, "hard": 1}):
        text = render_solution(r, "parallel", rng)
        assert CANONICAL.match(text), text
        assert VALID.match(text), text
        n_parts = r["problem"].count("(") - r["problem"].count("(-")
        assert text.count("<plan>") == text.count("<step>") == n_parts
        assert re.findall(r"<step>(\d+):", text) == [str(i) for i in range(1, n_parts + 1)]
        assert text.endswith(f"\\boxed{{{r['answer']}}}.")


def test_parallel_pinned_example_with_negative_part():
    record = {"problem": "Compute (7 + 3) + (5 - 8).", "answer": "7"}
    rng = random.Random(0)  # random() = 0.844 -> positional plan names
    assert render_solution(record, "parallel", rng) == (
        "<guideline><plan>1: compute the left part</plan><plan>2: compute the right part</plan></guideline>"
        "<step>1: 7 + 3 = 10</step><step>2: 5 - 8 = -3</step><takeaway>10 + (-3) = 7</takeaway>"
        " The answer is \\boxed{7}."
    )


def test_sequential_templates_end_in_boxed_and_have_no_tags():
    rng = random.Random(0)
    seen = set()
    for r in generate_problems(60, seed=2, weights={"easy": 1, "medium": 1}):
        text = render_solution(r, "sequential", rng)
        assert "<" not in text
        assert text.endswith(f"\\boxed{{{r['answer']}}}.")
        seen.add(text.split(" ")[0])
    assert {"We", "First,"} <= seen and len(seen) >= 3


@pytest.mark.parametrize("mistake", MISTAKES)
def test_each_mistake_breaks_validity(mistake):
    rng = random.Random(0)
    record = generate_problems(1, seed=5)[0]
    text = render_solution(record, "parallel", rng, mistake=mistake)
    plans, steps = text.count("<plan>"), text.count("<step>")
    valid = bool(VALID.match(text)) and plans == steps
    assert not valid, text


def test_bad_arguments_raise():
    rng = random.Random(0)
    record = generate_problems(1, seed=0)[0]
    with pytest.raises(ValueError, match="unknown mistake"):
        render_solution(record, "parallel", rng, mistake="typo")
    with pytest.raises(ValueError, match="parallel style only"):
        render_solution(record, "sequential", rng, mistake="no_boxed")
    with pytest.raises(ValueError, match="not a synthetic"):
        Expression.parse("What is 2 + 2?")


def test_parse_round_trip():
    for r in generate_problems(100, seed=4, weights={"easy": 1, "medium": 1, "hard": 1}):
        assert Expression.parse(r["problem"]).to_dict() == r["expression"]
