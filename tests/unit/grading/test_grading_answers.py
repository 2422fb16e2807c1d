"""Answer extraction: last box with nested braces, fallbacks in their configured order, linear time."""

from __future__ import annotations

import time

import pytest

from components.grading.answers import extract_answer, extract_answer_detail, last_boxed


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("so \\boxed{5}.", "5"),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}"),
        ("first \\boxed{1} then \\boxed{\\sqrt{\\frac{a}{b}}}", "\\sqrt{\\frac{a}{b}}"),
        ("\\fbox{42}", "42"),
        ("\\boxed {7}", "7"),
        ("outer \\boxed{\\boxed{1}+1}", "\\boxed{1}+1"),
        ("truncated: \\boxed{3} and later \\boxed{4", "3"),
        ("stray } brace then \\boxed{x}", "x"),
        ("\\boxedx{1}", None),
        ("no box here", None),
        ("\\boxed{(-\\infty, 3] \\cup (5, \\infty)}", "(-\\infty, 3] \\cup (5, \\infty)"),
        ("$\\boxed{\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}}$", "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}"),
    ],
)
def test_last_boxed(text: str, expected: str | None) -> None:
    assert last_boxed(text) == expected


@pytest.mark.parametrize(
    ("text", "answer", "method"),
    [
        ("<takeaway>done</takeaway> \\boxed{12}", "12", "boxed"),
        ("empty box \\boxed{ } but Answer: 9", "9", "answer_line"),
        ("work...\nAnswer: $\\frac{3}{4}$.", "\\frac{3}{4}", "answer_line"),
        ("**Final Answer:** 17", "17", "answer_line"),
        ("Final Answer: The final answer is $35.06$. I hope it is correct.", "35.06", "answer_line"),
        ("Answer:\n\n  x = 2\n", "x = 2", "answer_line"),
        ("Answer: 1\nthen Answer: 2", "2", "answer_line"),
        ("The total is 1,234 apples, or -0.5 of them", "-0.5", "last_number"),
        ("we counted 1,000 sheep", "1000", "last_number"),
        ("nothing numeric", None, None),
    ],
)
def test_extraction_with_default_fallbacks(text: str, answer: str | None, method: str | None) -> None:
    assert extract_answer_detail(text) == (answer, method)


def test_fallbacks_are_configurable_and_ordered() -> None:
    text = "Answer: 3, computed from 4 and 5"
    assert extract_answer(text, ["answer_line", "last_number"]) == "3, computed from 4 and 5"
    assert extract_answer(text, ["last_number", "answer_line"]) == "5"
    assert extract_answer(text, []) is None
    assert extract_answer("the answer: 8", ["last_number"]) == "8"


def test_bad_input_raises_clearly() -> None:
    with pytest.raises(ValueError, match="unknown answer fallback 'magic'"):
        extract_answer("no box", ["magic"])
    with pytest.raises(TypeError, match="needs a str"):
        extract_answer(None)  # type: ignore[arg-type]


def test_results_are_cached() -> None:
    from components.grading.answers import _extract

    text = "a distinct text for the cache test \\boxed{99}"
    before = _extract.cache_info().hits
    assert extract_answer(text) == extract_answer(text) == "99"
    assert _extract.cache_info().hits == before + 1


@pytest.mark.parametrize(
    "adversarial",
    [
        "\\boxed{" * 150_000,  # ~1 MB of unclosed boxes
        "{" * 500_000 + "\\boxed{1}" + "}" * 500_000,
        "Answer: " * 120_000,
        "1," * 500_000,
    ],
)
def test_megabyte_adversarial_inputs_are_linear(adversarial: str) -> None:
    start = time.perf_counter()
    extract_answer(adversarial + " tail")
    # One linear pass over ~1 MB takes about a second on a loaded 2-core box; a quadratic scan takes hours.
    assert time.perf_counter() - start < 10.0
