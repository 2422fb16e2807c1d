"""Golden traces for every schema: the violations found and the format score they add up to."""

from __future__ import annotations

import pytest

from components.structure import (
    MIN_SCORE,
    PENALTIES,
    format_score,
    get_schema,
    is_valid,
    parse_ids,
    parse_text,
)

PLANS = "<guideline><plan>1: add the two</plan><plan>2: check by hand</plan></guideline>"
STEPS = "<step>1: 2+2 is 4 indeed</step><step>2: counting gives 4</step>"
TAKEAWAY = "<takeaway>both say four</takeaway>"
BLOCK = PLANS + STEPS + TAKEAWAY
ANSWER = " so \\boxed{4}"
VALID_NPR = BLOCK + ANSWER

NPR_CASES = [
    # (id, text, expected violation codes in position order, expected score)
    ("valid", VALID_NPR, [], 0.0),
    ("valid_two_blocks", BLOCK + "\nthen\n" + BLOCK + ANSWER, [], 0.0),
    ("valid_nested_braces", BLOCK + " \\boxed{\\frac{1}{2}}", [], 0.0),
    ("no_block", "The answer is \\boxed{4}", ["no_block"], -1.5),
    ("no_block_no_answer", "The answer is four", ["no_block", "missing_answer"], -2.0),
    (
        "steps_fewer_than_plans",
        PLANS + "<step>1: 2+2 is 4 indeed</step>" + TAKEAWAY + ANSWER,
        ["step_count_mismatch"],
        -1.0,
    ),
    ("empty_plan", BLOCK.replace("1: add the two", "1:") + ANSWER, ["plan_too_short"], -0.4),
    ("short_step", BLOCK.replace("1: 2+2 is 4 indeed", "1: ab") + ANSWER, ["step_too_short"], -0.4),
    ("short_takeaway", BLOCK.replace("both say four", "ok") + ANSWER, ["summary_too_short"], -0.4),
    ("missing_boxed", BLOCK + " so four", ["missing_answer"], -1.0),
    ("empty_boxed", BLOCK + " \\boxed{ }", ["missing_answer"], -1.0),
    ("unbalanced_boxed", BLOCK + " \\boxed{4", ["missing_answer"], -1.0),
    ("boxed_only_before_block", "\\boxed{4} " + BLOCK, ["missing_answer"], -1.0),
    ("tag_in_tail", VALID_NPR + " </step>", ["tag_in_tail"], -1.0),
    ("two_tags_in_tail_once", VALID_NPR + " </step><plan>", ["tag_in_tail", "tag_in_tail"], -1.0),
    ("tag_between_blocks", BLOCK + "</plan>" + BLOCK + ANSWER, ["tag_outside_block"], -1.5),
    (
        "text_between_steps",
        PLANS + STEPS.replace("</step><step>", "</step>and<step>") + TAKEAWAY + ANSWER,
        ["steps_not_adjacent"],
        -0.2,
    ),
    (
        "whitespace_between_steps_ok",
        PLANS + "\n" + STEPS.replace("</step><step>", "</step>\n<step>") + "\n" + TAKEAWAY + ANSWER,
        [],
        0.0,
    ),
    ("text_in_goal", BLOCK.replace("<guideline>", "<guideline>Plan:") + ANSWER, ["goal_text"], -0.4),
    (
        "text_between_plans",
        BLOCK.replace("</plan><plan>", "</plan>and<plan>") + ANSWER,
        ["goal_text", "plans_not_adjacent"],
        -0.6,
    ),
    ("plan_label_missing", BLOCK.replace("1: add the two", "add the two") + ANSWER, ["label_missing"], -0.2),
    ("dotted_labels_ok", BLOCK.replace("1:", "1.1:") + ANSWER, [], 0.0),
    (
        "labels_out_of_order",
        PLANS + "<step>2: counting gives 4</step><step>1: 2+2 is 4 indeed</step>" + TAKEAWAY + ANSWER,
        ["label_mismatch"],
        -0.2,
    ),
    ("unclosed_last_block", BLOCK + "<guideline><plan>1: more</plan>" + ANSWER, ["unclosed_block"], -1.0),
    (
        "misplaced_in_takeaway",
        BLOCK.replace("both say four", "both say <step> four") + ANSWER,
        ["misplaced_tag"],
        -0.4,
    ),
    (
        "no_plans",
        "<guideline></guideline><step>1: abcdef</step>" + TAKEAWAY + ANSWER,
        ["no_plans", "step_count_mismatch"],
        -2.0,
    ),
    (
        "nested_forbidden",
        PLANS
        + "<step>1: <guideline><plan>1: x</plan></guideline> sure</step><step>2: counting gives 4</step>"
        + TAKEAWAY
        + ANSWER,
        ["nested_block", "misplaced_tag", "misplaced_tag", "misplaced_tag"],
        -2.0,
    ),
]


@pytest.mark.parametrize(
    ("text", "codes", "score"), [c[1:] for c in NPR_CASES], ids=[c[0] for c in NPR_CASES]
)
def test_npr_golden(text: str, codes: list[str], score: float) -> None:
    trace = parse_text(text, "npr")
    assert [v.code for v in trace.violations] == codes
    assert format_score(text, "npr") == pytest.approx(score, abs=1e-9)
    assert is_valid(text, "npr") == (codes == [])


MV_PLANS = "<Goal><Outline>1: try small cases</Outline><Outline>2: use algebra</Outline></Goal>"
MV_PATHS = "<Path>1: small cases give 4</Path><Path>2: algebra gives 4</Path>"
MV_BLOCK = "<Parallel>" + MV_PLANS + MV_PATHS + "<Conclusion>both give four</Conclusion></Parallel>"
MV_NESTED_PATH = (
    "<Path>1: split in two <Parallel><Goal><Outline>1: left half</Outline><Outline>2: right half</Outline></Goal>"
    "<Path>1: left is 2 here</Path><Path>2: right is 2 here</Path><Conclusion>sum is four</Conclusion>"
    "</Parallel> so 4</Path>"
)

MV_CASES = [
    ("valid", MV_BLOCK + " Answer: \\boxed{4}", [], 0.0),
    (
        "valid_nested",
        MV_BLOCK.replace("<Path>1: small cases give 4</Path>", MV_NESTED_PATH) + " \\boxed{4}",
        [],
        0.0,
    ),
    (
        "path_count",
        MV_BLOCK.replace("<Path>2: algebra gives 4</Path>", "") + " \\boxed{4}",
        ["step_count_mismatch"],
        -1.0,
    ),
    ("no_close", MV_BLOCK.replace("</Parallel>", "") + " \\boxed{4}", ["unclosed_block", "no_block"], -2.0),
    (
        "conclusion_outside",
        "<Parallel>" + MV_PLANS + MV_PATHS + "</Parallel><Conclusion>both give four</Conclusion> \\boxed{4}",
        ["unclosed_block", "no_block", "misplaced_tag"],
        -2.9 + 0.9,
    ),
]


@pytest.mark.parametrize(("text", "codes", "score"), [c[1:] for c in MV_CASES], ids=[c[0] for c in MV_CASES])
def test_multiverse_golden(text: str, codes: list[str], score: float) -> None:
    trace = parse_text(text, "multiverse")
    assert [v.code for v in trace.violations] == codes
    assert format_score(trace) == pytest.approx(score, abs=1e-9)


def test_multiverse_depth_limit() -> None:
    inner = "<Path>1: deep enough</Path><Path>2: deep enough</Path>"
    goal = "<Goal><Outline>1: aaa</Outline><Outline>2: bbb</Outline></Goal>"
    text = inner
    for _ in range(6):  # six levels; the schema allows five
        text = f"<Parallel>{goal}<Path>1: go on {text}</Path><Path>2: other side</Path><Conclusion>joined up</Conclusion></Parallel>"
    codes = [v.code for v in parse_text(text + " \\boxed{1}", "multiverse").violations]
    assert "nested_block" in codes
    assert get_schema("multiverse").max_depth == 5


PR1_BLOCK = "<Parallel><Path>small cases give 4</Path><Path>algebra gives 4</Path></Parallel><Summary>both give four</Summary>"
PR1_CASES = [
    ("valid", PR1_BLOCK + "\nFinal Answer: \\boxed{4}", [], 0.0),
    (
        "one_path",
        PR1_BLOCK.replace("<Path>algebra gives 4</Path>", "") + " \\boxed{4}",
        ["too_few_steps"],
        -1.0,
    ),
    ("no_summary", PR1_BLOCK.split("<Summary>")[0] + " \\boxed{4}", ["unclosed_block", "no_block"], -2.0),
    (
        "summary_inside",
        "<Parallel><Path>small cases give 4</Path><Path>algebra gives 4</Path><Summary>sum here"
        "</Summary></Parallel><Summary>both give four</Summary> \\boxed{4}",
        ["misplaced_tag", "steps_not_adjacent", "misplaced_tag"],
        -1.0,
    ),
]


@pytest.mark.parametrize(
    ("text", "codes", "score"), [c[1:] for c in PR1_CASES], ids=[c[0] for c in PR1_CASES]
)
def test_parallel_r1_golden(text: str, codes: list[str], score: float) -> None:
    trace = parse_text(text, "parallel_r1")
    assert [v.code for v in trace.violations] == codes
    assert format_score(trace) == pytest.approx(score, abs=1e-9)


def test_trace_tree_of_valid_npr() -> None:
    text = "intro " + BLOCK + " mid " + BLOCK + ANSWER
    trace = parse_text(text)
    assert len(trace.blocks) == 2
    first = trace.blocks[0]
    assert [p.label for p in first.plans] == ["1", "2"]
    assert [s.label for s in first.steps] == ["1", "2"]
    assert first.steps[0].text == "1: 2+2 is 4 indeed"
    assert text[first.steps[0].span.start : first.steps[0].span.end] == "<step>1: 2+2 is 4 indeed</step>"
    assert text[first.anchor : first.anchor + len("</guideline>")] == "</guideline>"
    assert text[first.merge : first.merge + len("<takeaway>")] == "<takeaway>"
    assert first.summary is not None and first.summary.text == "both say four"
    assert [text[s.start : s.end] for s in trace.between] == ["intro ", " mid "]
    assert trace.answer_text == ANSWER
    assert first.valid and trace.blocks[1].valid


def test_violation_positions_point_at_the_offending_tag() -> None:
    text = VALID_NPR + " tail </step>"
    (v,) = parse_text(text).violations
    assert (v.code, v.position) == ("tag_in_tail", text.rindex("</step>"))
    assert "</step>" in v.reason


def test_ids_and_text_parse_agree(make_tags, tokenize) -> None:  # noqa: ANN001
    tags = make_tags(get_schema("npr"), with_decoder=True)
    for _, text, codes, score in NPR_CASES:
        trace = parse_ids(tokenize(text, tags), tags)
        assert [v.code for v in trace.violations] == codes, text
        assert format_score(trace) == pytest.approx(score, abs=1e-9)


def test_ids_without_decoder_skip_content_rules(npr_tags, tokenize) -> None:  # noqa: ANN001
    text = BLOCK.replace("1: add the two", "1:") + " no answer"
    trace = parse_ids(tokenize(text, npr_tags), npr_tags)
    assert trace.violations == [] and not trace.has_text
    with pytest.raises(ValueError, match="decoder"):
        format_score(trace)


def test_penalty_table_is_complete_and_negative() -> None:
    assert all(p < 0 for p in PENALTIES.values())
    assert MIN_SCORE == -2.0


def test_prompt_is_not_parsed(npr_tags, tokenize) -> None:  # noqa: ANN001
    prompt = tokenize("use <step> tags like </step> this", npr_tags)
    ids = prompt + tokenize(VALID_NPR, npr_tags)
    assert parse_ids(ids, npr_tags, start=len(prompt)).violations == []
    assert [v.code for v in parse_ids(ids, npr_tags).violations] == ["tag_outside_block", "tag_outside_block"]


def test_strict_parse_raises_structural_only() -> None:
    from components.structure import StructureError

    parse_text(VALID_NPR.replace("both say four", "ok"), strict=True)  # content rule: scored, not raised
    with pytest.raises(StructureError) as err:
        parse_text(VALID_NPR + "</step>", strict=True)
    assert err.value.code == "tag_in_tail" and err.value.position == len(VALID_NPR)


def test_violation_list_is_capped_but_counted() -> None:
    from components.structure.parse import MAX_STORED_VIOLATIONS

    trace = parse_text(BLOCK.replace("both say four", "<plan>" * 1000) + ANSWER)
    assert len(trace.violations) == MAX_STORED_VIOLATIONS
    assert trace.violations_dropped == 1000 - MAX_STORED_VIOLATIONS  # one misplaced_tag per <plan>
    assert format_score(trace) == MIN_SCORE and not trace.blocks[0].valid


def _best_of(fn, repeats: int = 3) -> float:  # noqa: ANN001
    import time

    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


@pytest.mark.parametrize("unit", ["<guideline><plan>", "<step><guideline><plan>1: x", "<", "</step>x"])
def test_scoring_time_grows_linearly(unit: str) -> None:
    """10x the input must cost ~10x, not ~100x (a quadratic or backtracking scanner would)."""
    small, large = unit * (30_000 // len(unit)), unit * (300_000 // len(unit))
    ratio = _best_of(lambda: format_score(large)) / max(_best_of(lambda: format_score(small)), 1e-4)
    # linear is ~10x and quadratic ~100x; on a loaded 2-core machine a linear scan measured up to 35x
    # (cache effects of the 300k input plus noise), so the bar sits between: 50x
    assert ratio < 50, f"{unit!r}: 10x input took {ratio:.1f}x the time"
