"""Parallel-R1's rewards and answer convention: the alternating schedule and its values are pinned.

``accuracy``: +1 / -1 by the answer. ``accuracy_parallel_interv``: steps 1-8 of every 10 accuracy only; steps
9-10 give a correct well-formed parallel trace 1.2, a correct tag-free one 1.0, anything else -1. The
``parallel_r1`` schema's answer is its ``Final Answer:`` line, read for every purpose. All answers here are
decided on the fast path (no process pool).
"""

from __future__ import annotations

import pytest

from components.grading import verify_pool
from components.grading.config import AlternatingParallelReward, GradingConfig
from components.grading.judge import judge
from components.grading.rewards import apply_reward, is_scheduled, score_many, score_response
from components.grading.verl_reward import compute_score

BLOCK = (
    "<Parallel><Path>7 + 3 = 10, then add 2</Path><Path>3 + 7 = 10, plus 2</Path></Parallel>"
    "<Summary>both paths give 12</Summary>"
)
PARALLEL = BLOCK + "\nFinal Answer: 12"
SEQUENTIAL = "7 + 3 = 10 and 10 + 2 = 12.\nFinal Answer: 12"
# a correct answer in a malformed block (the summary is missing): neither parallel nor sequential
BROKEN = "<Parallel><Path>7 + 3 = 10, then add 2</Path><Path>3 + 7 = 10, plus 2</Path></Parallel>\nFinal Answer: 12"
# well-formed tags but a path below the schema's minimum length: not "well-formed" for the reward
SHORT_PATH = BLOCK.replace("3 + 7 = 10, plus 2", "12") + "\nFinal Answer: 12"


@pytest.fixture(autouse=True)
def _no_pool(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("these answers must be graded on the fast path")

    monkeypatch.setattr(verify_pool, "get_pool", refuse)


def test_the_schedule_of_the_paper() -> None:
    """(global_step - 1) % 10 < 8 -> accuracy only (npr-reference.md §3.5), steps counted from 1."""
    values = AlternatingParallelReward()
    parallel_steps = [s for s in range(1, 31) if values.rewards_parallel(s)]
    assert parallel_steps == [9, 10, 19, 20, 29, 30]
    assert [
        AlternatingParallelReward(period=4, parallel_steps=1).rewards_parallel(s) for s in range(1, 9)
    ] == [
        False,
        False,
        False,
        True,
    ] * 2
    assert not any(AlternatingParallelReward(parallel_steps=0).rewards_parallel(s) for s in range(1, 21))
    with pytest.raises(ValueError, match="count from 1"):
        values.rewards_parallel(0)
    with pytest.raises(ValueError, match="exceeds period"):
        AlternatingParallelReward(period=2, parallel_steps=3)


@pytest.mark.parametrize(
    ("response", "gold", "accuracy_step", "parallel_step"),
    [
        (PARALLEL, "12", 1.0, 1.2),
        (SEQUENTIAL, "12", 1.0, 1.0),
        (BROKEN, "12", 1.0, -1.0),
        (SHORT_PATH, "12", 1.0, -1.0),
        (PARALLEL, "13", -1.0, -1.0),
        (SEQUENTIAL, "13", -1.0, -1.0),
        ("", "12", -1.0, -1.0),
    ],
    ids=[
        "parallel",
        "sequential",
        "broken-block",
        "short-path",
        "wrong-parallel",
        "wrong-sequential",
        "empty",
    ],
)
def test_values_on_accuracy_and_parallel_steps(
    response: str, gold: str, accuracy_step: float, parallel_step: float
) -> None:
    for step in (1, 8, 11):
        r = score_response("accuracy_parallel_interv", response, gold, "parallel_r1", step=step)
        assert r.score == accuracy_step
    for step in (9, 10, 20):
        r = score_response("accuracy_parallel_interv", response, gold, "parallel_r1", step=step)
        assert r.score == parallel_step and not r.filtered
    assert score_response("accuracy", response, gold, "parallel_r1").score == accuracy_step


def test_values_come_from_the_config() -> None:
    cfg = GradingConfig.model_validate(
        {"accuracy_parallel_interv": {"correct_parallel": 2.0, "correct": 0.5, "wrong": 0.0}}
    )
    texts = [PARALLEL, SEQUENTIAL, BROKEN]
    at = {
        s: [
            r.score
            for r in score_many("accuracy_parallel_interv", texts, ["12"] * 3, "parallel_r1", cfg, step=s)
        ]
        for s in (1, 10)
    }
    assert at == {1: [0.5, 0.5, 0.5], 10: [2.0, 0.5, 0.0]}


def test_a_scheduled_reward_needs_the_step() -> None:
    assert is_scheduled("accuracy_parallel_interv") and not is_scheduled("accuracy")
    with pytest.raises(ValueError, match="training step"):
        score_many("accuracy_parallel_interv", [PARALLEL], ["12"], "parallel_r1")
    with pytest.raises(ValueError, match="training step"):
        apply_reward("accuracy_parallel_interv", judge(PARALLEL, "12", "parallel_r1"), GradingConfig())
    # a plain reward ignores a step it does not read
    assert (
        apply_reward("accuracy", judge(PARALLEL, "12", "parallel_r1"), GradingConfig(), step=9).score == 1.0
    )


def test_the_final_answer_line_is_the_parallel_r1_answer() -> None:
    """Read for every purpose (the schema's convention), and required by its format rules."""
    for purpose in ("reward", "evaluation", "distill", "cli"):
        j = judge(PARALLEL, "12", "parallel_r1", purpose=purpose)
        assert (j.pred, j.correct, j.valid, j.answer_method) == ("12", True, True, "answer_line")
    # NPR's reward reads boxes only: the same line is no answer there
    assert judge(SEQUENTIAL, "12", "npr", purpose="reward").pred is None
    # the format check wants the line (or a box) after the last block
    bare = judge(BLOCK + " twelve", "12", "parallel_r1")
    assert "missing_answer" in bare.violations and not bare.valid
    assert judge(BLOCK + " so \\boxed{12}", "12", "parallel_r1").valid
    # a truncated response has no answer, its line notwithstanding
    cut = judge(PARALLEL, "12", "parallel_r1", purpose="reward", finish_reason="length")
    assert cut.truncated and not cut.correct


def test_verl_entry_point_reads_the_step() -> None:
    settings = {"reward": "accuracy_parallel_interv", "schema": "parallel_r1"}
    scores = [compute_score("x", PARALLEL, "12", {**settings, "global_step": s})["score"] for s in (8, 9)]
    assert scores == [1.0, 1.2]
    assert compute_score("x", SEQUENTIAL, "12", settings, global_step=10)["score"] == 1.0
    with pytest.raises(ValueError, match="training step"):
        compute_score("x", PARALLEL, "12", settings)
    values = {"correct_parallel": 3.0}
    assert (
        compute_score("x", PARALLEL, "12", {**settings, "global_step": 9, "reward_values": values})["score"]
        == 3.0
    )
