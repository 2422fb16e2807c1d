"""judge / summarize and the registered rewards (values from GradingConfig), on real NPR traces.

Every answer here is decided on the fast path, so no process pool is started.
"""

from __future__ import annotations

import pytest

from components.grading import verify_pool
from components.grading.config import GradingConfig
from components.grading.judge import Judgement, judge, judge_many, summarize
from components.grading.rewards import REWARDS, RewardResult, get_reward, register_reward, score_many

VALID = (
    "<guideline><plan>1: add the two numbers</plan><plan>2: check by subtraction</plan></guideline>"
    "<step>1: 2 + 3 = 5 so far</step><step>2: 5 - 3 = 2, consistent</step>"
    "<takeaway>The sum is 5 indeed.</takeaway>\nSo the answer is \\boxed{5}."
)
# Well-formed tags but two content faults: a too-short step (-0.4) and no box after the block (-1.0). Its
# "so 5" is no explicit final answer, so it is not credited either.
CONTENT_FAULTS = (
    "<guideline><plan>1: add the two numbers</plan></guideline><step>1: 5</step>"
    "<takeaway>The sum is 5 indeed.</takeaway> so 5"
)
# A closing tag the grammar does not accept: structurally malformed.
MALFORMED = "<step>1: oops</guideline> \\boxed{5}"
PLAIN = "Adding gives 5, so \\boxed{5}"  # no parallel block at all (-1.5), but the tags are fine


@pytest.fixture(autouse=True)
def _no_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("these answers must be graded on the fast path")

    monkeypatch.setattr(verify_pool, "get_pool", refuse)


def test_judge_reads_answer_and_structure() -> None:
    j = judge(VALID, "5")
    assert j == Judgement(
        pred="5", correct=True, format_score=0.0, valid=True, empty=False, answer_method="boxed"
    )
    assert j.as_record() == {"answer_pred": "5", "correct": True, "format_score": 0.0, "valid": True}

    faults = judge(CONTENT_FAULTS, 5.0)
    assert (faults.pred, faults.correct, faults.valid, faults.malformed) == (None, False, False, False)
    assert faults.format_score == pytest.approx(-1.4)
    assert set(faults.violations) == {"step_too_short", "missing_answer"}

    malformed = judge(MALFORMED, "5")
    assert malformed.malformed and not malformed.valid and malformed.correct

    empty = judge("   ", "5")
    assert empty.empty and empty.pred is None and not empty.correct


def test_judge_many_checks_lengths_and_types() -> None:
    with pytest.raises(ValueError, match="2 responses but 1 golds"):
        judge_many([VALID, VALID], ["5"])
    with pytest.raises(ValueError, match="response 0 is a NoneType"):
        judge_many([None], ["5"])  # type: ignore[list-item]


def test_summarize_fractions() -> None:
    judgements = judge_many([VALID, VALID.replace("{5}", "{6}"), CONTENT_FAULTS, ""], ["5"] * 4)
    summary = summarize(judgements)
    # correct: VALID (CONTENT_FAULTS states no final answer); valid: VALID, VALID(6); both: VALID only.
    assert summary["n"] == 4
    assert summary["accuracy"] == 0.25
    assert summary["format_valid"] == 0.5
    assert summary["correct_and_valid"] == 0.25
    assert summary["empty"] == 0.25
    assert summary["grade_failures"] == 0
    assert summary["truncated"] == 0.0
    with pytest.raises(ValueError, match="at least one"):
        summarize([])


def test_stage1_values() -> None:
    cfg = GradingConfig()
    results = score_many(
        "stage1",
        [VALID, VALID.replace("{5}", "{6}"), CONTENT_FAULTS, MALFORMED, PLAIN, ""],
        ["5"] * 6,
        cfg=cfg,
    )
    assert [r.score for r in results] == pytest.approx([1.0, -1.0, -1.4, -2.0, -1.5, -2.0])
    assert not any(r.filtered for r in results)
    assert results[2] == RewardResult(
        score=pytest.approx(-1.4),
        correct=False,
        valid=False,
        format_score=pytest.approx(-1.4),
        filtered=False,
        pred=None,
    )


def test_stage1_values_come_from_config() -> None:
    cfg = GradingConfig.model_validate({"stage1": {"correct": 2.0, "wrong": -0.5, "empty": -3.0}})
    results = score_many("stage1", [VALID, VALID.replace("{5}", "{6}"), ""], ["5"] * 3, cfg=cfg)
    assert [r.score for r in results] == [2.0, -0.5, -3.0]


def test_stage1_invalid_offset_keeps_every_failure_below_every_pass() -> None:
    cfg = GradingConfig.model_validate({"stage1": {"invalid_offset": -1.0}})
    results = score_many(
        "stage1",
        [VALID, VALID.replace("{5}", "{6}"), CONTENT_FAULTS, MALFORMED, PLAIN, ""],
        ["5"] * 6,
        cfg=cfg,
    )
    # content faults -1.4 -> -2.4 clipped to the empty minimum -2; plain -1.5 -> -2
    assert [r.score for r in results] == pytest.approx([1.0, -1.0, -2.0, -2.0, -2.0, -2.0])
    assert max(r.score for r in results if not r.valid) < min(r.score for r in results if r.valid)
    with pytest.raises(ValueError, match="invalid_offset"):
        GradingConfig.model_validate({"stage1": {"invalid_offset": 0.5}})


def test_stage3_filters_instead_of_scoring() -> None:
    cfg = GradingConfig()
    responses = [VALID, VALID.replace("{5}", "{6}"), CONTENT_FAULTS, MALFORMED, PLAIN, ""]
    results = score_many("stage3", responses, ["5"] * 6, cfg=cfg)
    assert [(r.score, r.filtered) for r in results] == [
        (1.0, False),
        (-1.0, False),
        (-1.0, False),  # content faults are not structural: scored on accuracy alone (no final answer)
        (0.0, True),  # malformed tags: flagged for the trainer to drop
        (1.0, False),  # sequential answers are kept (no block is not malformed)
        (0.0, False),  # empty -> stage3.empty
    ]
    strict = GradingConfig.model_validate({"stage3": {"filter_on": "any_violation", "empty": -0.25}})
    strict_results = score_many("stage3", responses, ["5"] * 6, cfg=strict)
    assert [r.filtered for r in strict_results] == [False, False, True, True, True, False]
    assert strict_results[-1].score == -0.25


def test_registry() -> None:
    assert {"stage1", "stage3"} <= set(REWARDS)
    with pytest.raises(KeyError, match="unknown reward 'nope'; registered: .*stage1"):
        get_reward("nope")
    with pytest.raises(ValueError, match="already registered"):
        register_reward("stage1")(lambda j, cfg: RewardResult(0.0, False, False, 0.0, False, None))

    @register_reward("test_accuracy_only")
    def accuracy(j: Judgement, cfg: GradingConfig) -> RewardResult:
        return RewardResult(float(j.correct), j.correct, j.valid, j.format_score, False, j.pred)

    try:
        assert get_reward("test_accuracy_only") is accuracy
        assert (
            register_reward("test_accuracy_only")(accuracy) is accuracy
        )  # re-registering the same fn is fine
        assert score_many("test_accuracy_only", [PLAIN], ["5"])[0].score == 1.0
    finally:
        REWARDS.pop("test_accuracy_only")


# Responses that never state a final answer, or were cut off, each with a last number equal to the gold.
UNANSWERED = [
    ("Let me list the cases: 1, 2, 3, 4, 5", None),  # no answer at all
    ("3 3 9 1 7 1 5", None),  # a garble of digits
    ("<guideline><plan>1: 4 4 </plan></guideline><step>1: 1 5", "length"),  # truncated, format-invalid
    ("The value is \\boxed{5", None),  # truncated inside the box
    ("So far we have $\\boxed{5}$ but the overlap still has to go, giving", "length"),  # cut by the budget
    (VALID, "length"),  # a complete, valid, correct-looking trace that hit the length limit anyway
    ("Final Answer: 5", None),  # an answer line: evaluation reads it, rewards (box only) do not
]


@pytest.mark.parametrize(("response", "finish_reason"), UNANSWERED)
def test_no_reward_and_no_accuracy_without_an_explicit_complete_answer(
    response: str, finish_reason: str | None
) -> None:
    cfg = GradingConfig.model_validate({"stage1": {"invalid_offset": -1.0}})
    for name, values in (("stage1", cfg.stage1), ("stage3", cfg.stage3)):
        result = score_many(name, [response], ["5"], cfg=cfg, finish_reasons=[finish_reason])[0]
        assert not result.correct and result.score < values.correct
    judgement = judge(response, "5", cfg=cfg, purpose="evaluation", finish_reason=finish_reason)
    answered_line = response.startswith("Final Answer") and finish_reason is None
    assert judgement.correct is answered_line  # only the explicit answer line counts, and only in evaluation
    assert judgement.truncated is (finish_reason == "length" or response.endswith("\\boxed{5"))


def test_accuracy_of_unanswered_and_truncated_responses_is_zero() -> None:
    responses = [r for r, _ in UNANSWERED[:-1]]
    reasons = [f for _, f in UNANSWERED[:-1]]
    summary = summarize(judge_many(responses, ["5"] * len(responses), finish_reasons=reasons))
    assert summary["accuracy"] == 0.0 and summary["truncated"] == pytest.approx(4 / 6)


def test_last_number_is_only_read_where_a_profile_opts_in() -> None:
    guess = "Let me list the cases: 1, 2, 3, 4, 5"
    assert not judge(guess, "5").correct
    opted_in = GradingConfig.model_validate(
        {"extraction": {"evaluation": {"fallbacks": ["answer_line", "last_number"]}}}
    )
    assert judge(guess, "5", cfg=opted_in).correct  # the opt-in does what it says ...
    assert not judge(guess, "5", cfg=opted_in, purpose="reward").correct  # ... for that purpose only
    # ... and still never for a truncated response
    assert not judge(guess, "5", cfg=opted_in, finish_reason="length").correct


def test_the_old_fallbacks_key_says_where_it_went() -> None:
    with pytest.raises(ValueError, match="grading.extraction.<purpose>.fallbacks"):
        GradingConfig.model_validate({"fallbacks": ["answer_line", "last_number"]})
    with pytest.raises(ValueError, match="finish reasons"):
        judge_many([VALID], ["5"], finish_reasons=[])
