"""The synthetic task family: determinism, verifiable answers, bounds, partition, canonical layout, mistakes."""

from __future__ import annotations

import random
import re

import pytest

from components.data.problems import content_id
from components.data.synthetic import (
    LEVELS,
    MISTAKES,
    Expression,
    Part,
    allocate,
    generate_problems,
    partition,
    render_solution,
)

# The strict validity regex of ../shared/notes/tiny-feasibility.md, written out independently of the code.
VALID = re.compile(
    r"^\s*<guideline>((\s*<plan>[^<>]+</plan>)+)\s*</guideline>((\s*<step>[^<>]+</step>)+)\s*"
    r"<takeaway>[^<>]+</takeaway>[^<>]*\\boxed\{-?\d+\}[^<>]*$"
)
CANONICAL = re.compile(
    r"^<guideline>(<plan>\d+: [^<>]+</plan>)+</guideline>(<step>\d+: [^<>]+</step>)+"
    r"<takeaway>[^<>]+</takeaway> \\boxed\{-?\d+\}$"
)


def _recompute(problem: str) -> int:
    # Independent check: the problem's expression is valid Python arithmetic once "Compute" and "." go.
    expr = problem.removeprefix("Compute ").removesuffix(".")
    assert re.fullmatch(r"[\d\s()+\-]+", expr), problem
    return eval(expr)  # noqa: S307 - digits, brackets and + - only (asserted above)


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


def test_difficulty_levels_have_their_shape_and_bounds():
    records = generate_problems(900, seed=3, weights={"easy": 1, "medium": 1, "hard": 1})
    shapes = {"easy": (3, 3), "medium": (4, 4), "hard": (4, 5)}
    for r in records:
        brackets = re.findall(r"\(([^()]*)\)", r["problem"])
        operands = [re.findall(r"\d+", b) for b in brackets]
        assert (len(brackets), len(operands[0])) == shapes[r["difficulty"]], r
        assert all(len(o) == len(operands[0]) for o in operands)
        assert all(1 <= int(x) <= 9 for o in operands for x in o)
        for part in Expression.parse(r["problem"]).parts:
            assert all(0 <= v <= 19 for v in part.running()) and 0 <= part.value <= 9
    assert {r["difficulty"] for r in records} == {"easy", "medium", "hard"}


def test_allocation_and_capacity_pinned():
    assert allocate(10, {"easy": 0.8, "medium": 0.1, "hard": 0.1}) == {"easy": 8, "medium": 1, "hard": 1}
    assert allocate(7, {"easy": 1, "hard": 1}) == {"easy": 4, "medium": 0, "hard": 3}
    # chains of n operands in 1..9 whose running values stay in 0..19 and end in 0..9 (counted by hand for
    # 2 operands: a + b <= 9 gives 36, a - b >= 0 gives 45), to the power of the brackets, x 2^(joins)
    assert LEVELS["easy"].capacity() == _brute_force_chains(3) ** 3 * 2**2
    assert _brute_force_chains(2) == 81
    assert LEVELS["hard"].capacity() > LEVELS["medium"].capacity() > 10**17
    with pytest.raises(ValueError, match="unknown difficulty"):
        generate_problems(3, seed=0, weights={"trivial": 1})


def _brute_force_chains(n_operands: int) -> int:
    import itertools

    count = 0
    for first in range(1, 10):
        for moves in itertools.product([(op, x) for op in "+-" for x in range(1, 10)], repeat=n_operands - 1):
            value, ok = first, True
            for op, x in moves:
                value = value + x if op == "+" else value - x
                ok = ok and 0 <= value <= 19
            count += ok and 0 <= value <= 9
    return count


def test_partition_is_a_property_of_the_problem_and_can_be_drawn_alone():
    records = generate_problems(2000, seed=0)
    counts = {p: sum(partition(r["id"]) == p for r in records) for p in ("train", "val", "test")}
    assert 0.03 < counts["test"] / 2000 < 0.07 and 0.03 < counts["val"] / 2000 < 0.07
    only_val = generate_problems(50, seed=0, partitions=("val",))
    assert len(only_val) == 50 and {partition(r["id"]) for r in only_val} == {"val"}
    train = generate_problems(200, seed=1, partitions=("train",))
    assert {partition(r["id"]) for r in train} == {"train"}


def test_bracket_worked_one_operation_at_a_time():
    part = Part((7, 3, 1, 7), ("-", "-", "+"))
    assert part.running() == [4, 3, 10] and part.value == 10
    assert part.equation == "7 - 3 - 1 + 7 = 4 - 1 + 7 = 3 + 7 = 10"


def test_parallel_rendering_is_canonical_and_valid():
    rng = random.Random(0)
    for r in generate_problems(200, seed=1, weights={"easy": 1, "medium": 1, "hard": 1}):
        text = render_solution(r, "parallel", rng)
        assert CANONICAL.match(text), text
        assert VALID.match(text), text
        n_parts = r["problem"].count("(")
        assert text.count("<plan>") == text.count("<step>") == n_parts
        assert re.findall(r"<step>(\d+):", text) == [str(i) for i in range(1, n_parts + 1)]
        assert text.endswith(f"\\boxed{{{r['answer']}}}")


def test_parallel_pinned_example_with_negative_answer():
    record = {"problem": "Compute (2 + 3 - 4) - (9 - 1 - 8 + 6) - (1 + 1).", "answer": "-7"}
    assert render_solution(record, "parallel", random.Random(0)) == (
        "<guideline><plan>1: first bracket</plan><plan>2: second bracket</plan><plan>3: third bracket</plan>"
        "</guideline><step>1: 2 + 3 - 4 = 5 - 4 = 1; v1=1</step>"
        "<step>2: 9 - 1 - 8 + 6 = 8 - 8 + 6 = 0 + 6 = 6; v2=6</step>"
        "<step>3: 1 + 1 = 2; v3=2</step><takeaway>v1=1 - v2=6 - v3=2 = -7</takeaway> \\boxed{-7}"
    )


def test_takeaway_names_every_value_as_its_step_does():
    """The takeaway copies each value by its name (``v2=``), which its step writes right before the value:
    a copy by content, the same under the causal and the parallel mask."""
    for r in generate_problems(50, seed=2, weights={"easy": 1, "medium": 1, "hard": 1}):
        text = render_solution(r, "parallel", random.Random(0))
        steps = re.findall(r"<step>(\d+): [^<]*; (v\d+)=(\d+)</step>", text)
        takeaway = re.search(r"<takeaway>(.*) = -?\d+</takeaway>", text).group(1)
        assert [(f"v{i}", v) for i, _, v in steps] == [(n, v) for _, n, v in steps]
        assert re.findall(r"(v\d+)=(\d+)", takeaway) == [(n, v) for _, n, v in steps]


def test_sequential_templates_end_in_boxed_and_have_no_tags():
    rng = random.Random(0)
    seen = set()
    for r in generate_problems(60, seed=2, weights={"easy": 1, "medium": 1}):
        text = render_solution(r, "sequential", rng)
        assert "<" not in text
        assert re.search(rf"\\boxed\{{{re.escape(r['answer'])}\}}\.?$", text), text
        seen.add(text.split(" ")[0])
    assert {"First,", "Bracket"} <= seen and len(seen) >= 3


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
    with pytest.raises(ValueError, match="not a synthetic"):
        Expression.parse("Compute (1 + 2) (3 + 4).")
