"""Trace metrics (parallel?, branches, critical path) and the canonical-layout normaliser."""

from __future__ import annotations

import pytest

from components.structure import (
    MULTIVERSE,
    NPR,
    TagIds,
    format_score,
    normalize_layout,
    normalize_layout_result,
    parallel_attention_inputs,
    parse_ids,
    parse_text,
    trace_metrics,
)

BLOCK2 = (
    "<guideline><plan>1: add the two</plan><plan>2: check by hand</plan></guideline>"
    "<step>1: 2+2 is 4 indeed</step><step>2: counting gives 4</step><takeaway>both say four</takeaway>"
)
BLOCK1 = "<guideline><plan>1: add the two</plan></guideline><step>1: 2+2 is 4 indeed</step><takeaway>so it is four</takeaway>"


def _ids(tokens: str, tags: TagIds) -> list[int]:
    words: dict[str, int] = {}
    return [tags.ids[t] if t in tags.ids else words.setdefault(t, len(words) + 1) for t in tokens.split()]


CANONICAL = "U IM A <guideline> <plan> p1 </plan> <plan> p2 </plan> </guideline> <step> a a </step> <step> b b b b </step> <takeaway> t </takeaway> x"


def test_id_metrics_pinned_and_equal_to_positions(npr_tags: TagIds) -> None:
    ids = _ids(CANONICAL, npr_tags)
    m = trace_metrics(parse_ids(ids, npr_tags, start=2))
    # 23 response tokens; steps of 4 and 6 tokens run side by side, so 4 are off the critical path.
    assert (m.total_tokens, m.critical_tokens, m.branches, m.n_blocks) == (23, 19, (2,), 1)
    assert m.ideal_speedup == pytest.approx(23 / 19)
    assert m.unit == "tokens" and m.is_parallel and m.is_parallel_any
    _, pos = parallel_attention_inputs(ids, npr_tags, start=2)
    assert m.critical_tokens == int(pos[2:].max()) - 2 + 1


NESTED = (
    "Q <Parallel> <Goal> <Outline> o </Outline> <Outline> o </Outline> </Goal> "
    "<Path> a <Parallel> <Goal> <Outline> o </Outline> </Goal> <Path> c </Path> <Path> d d </Path> "
    "<Conclusion> e </Conclusion> </Parallel> f </Path> <Path> g </Path> <Conclusion> h </Conclusion> </Parallel> z"
)


def test_nested_metrics_pinned_and_equal_to_positions(make_tags) -> None:  # noqa: ANN001
    tags = make_tags(MULTIVERSE)
    ids = _ids(NESTED, tags)
    m = trace_metrics(parse_ids(ids, tags))
    # inner paths 3 and 4 tokens save 3; outer paths 21 (18 after the inner saving) and 3 save 21 + 3 - 18 = 6.
    assert (m.total_tokens, m.critical_tokens, m.branches, m.n_blocks) == (39, 33, (2, 2), 2)
    _, pos = parallel_attention_inputs(ids, tags)
    assert m.critical_tokens == int(pos.max()) + 1


def test_sequential_trace_metrics() -> None:
    m = trace_metrics(parse_text("just think, then \\boxed{4}"))
    assert not m.is_parallel and not m.is_parallel_any and m.branches == () and m.ideal_speedup == 1.0
    assert m.unit == "chars" and m.total_tokens == m.critical_tokens == len("just think, then \\boxed{4}")


def test_text_metrics_with_token_lengths() -> None:
    text = BLOCK1 + BLOCK2 + " \\boxed{4}"
    m = trace_metrics(parse_text(text), token_lengths=lambda s: len(s.split()) + s.count("<"))
    assert m.unit == "tokens" and m.branches == (1, 2) and m.is_parallel
    # BLOCK2's steps: "<step>1: 2+2 is 4 indeed</step>" = 5 words + 2 tags... measured by the same function:
    step_a, step_b = "<step>1: 2+2 is 4 indeed</step>", "<step>2: counting gives 4</step>"
    tl = lambda s: len(s.split()) + s.count("<")  # noqa: E731
    assert m.total_tokens - m.critical_tokens == min(tl(step_a), tl(step_b))


def test_is_parallel_variants() -> None:
    one_plan = trace_metrics(parse_text(BLOCK1 + " \\boxed{4}"))
    assert not one_plan.is_parallel and one_plan.is_parallel_any
    broken = BLOCK2.replace("both say four", "ok")  # a two-plan block that breaks a rule is not counted
    m = trace_metrics(parse_text(broken + " \\boxed{4}"))
    assert not m.is_parallel and not m.is_parallel_any and m.branches == (2,)


def test_normalize_removes_gaps_only_in_valid_traces() -> None:
    spaced = BLOCK2.replace("</guideline>", "</guideline>\n").replace("</step>", "</step>\n") + " \\boxed{4}"
    assert format_score(spaced) == 0.0
    result = normalize_layout_result(spaced)
    assert result.normalized and result.removed_chars == 3
    assert result.text == BLOCK2 + " \\boxed{4}"
    assert normalize_layout(result.text) == result.text  # idempotent
    invalid = spaced.replace("both say four", "ok")
    kept = normalize_layout_result(invalid)
    assert not kept.normalized and kept.text == invalid and "summary_too_short" in (kept.reason or "")
    assert normalize_layout(invalid) == invalid


def test_normalize_keeps_text_between_blocks_and_in_steps() -> None:
    text = (
        "Start.\n" + BLOCK2.replace("</guideline>", "</guideline> ") + "\nmiddle\n" + BLOCK1 + "\n\\boxed{4}"
    )
    out = normalize_layout(text, NPR)
    assert out == "Start.\n" + BLOCK2 + "\nmiddle\n" + BLOCK1 + "\n\\boxed{4}"


def test_normalize_nested_multiverse() -> None:
    inner = (
        "<Parallel><Goal><Outline>1: left half</Outline><Outline>2: right half</Outline></Goal>\n"
        "<Path>1: left is 2 here</Path>\n<Path>2: right is 2 here</Path>\n<Conclusion>sum is four</Conclusion></Parallel>"
    )
    text = (
        "<Parallel><Goal><Outline>1: try small cases</Outline><Outline>2: use algebra</Outline></Goal> "
        f"<Path>1: split {inner} so 4</Path> <Path>2: algebra gives 4</Path> "
        "<Conclusion>both give four</Conclusion></Parallel> \\boxed{4}"
    )
    out = normalize_layout(text, MULTIVERSE)
    assert format_score(out, MULTIVERSE) == 0.0 and "</Goal><Path>" in out and "</Path><Path>" in out
    assert "</Path><Conclusion>" in out and out.count("\n") == 0
