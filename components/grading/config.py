"""Config of answer grading and rewards (owned by components/grading)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel


class Stage1Reward(StrictModel):
    """NPR-Zero: format pass -> +correct / wrong; format fail -> the format penalty; empty -> minimum."""

    correct: float = 1.0
    wrong: float = -1.0
    empty: float = -2.0
    # Reward of a format failure = max(empty, invalid_offset + format score). 0 is the paper's rule (the
    # penalty itself). With a seed that is right far less than half the time, a nearly valid trace (-0.4)
    # then out-earns a valid wrong one (-1) and RL drifts to "almost valid" (measured on the tiny profile:
    # format-valid 12.5% -> 9.5% in 10 steps; with offset -0.7 it reached 79% and then collapsed to 0% on
    # traces with a -0.2 penalty). An offset of `wrong` keeps every failure below every pass.
    invalid_offset: float = Field(0.0, le=0.0)


class Stage3Reward(StrictModel):
    """PAPO: accuracy only; invalid structure is filtered, not scored.

    ``filter_on``: ``structural`` filters a response whose tag sequence the grammar rejects (no attention
    mask can be built from it; NPR's trainer drops exactly these), ``any_violation`` filters every response
    with a format score below 0.
    """

    correct: float = 1.0
    wrong: float = -1.0
    empty: float = 0.0
    filter_on: Literal["structural", "any_violation"] = "structural"


class GradingConfig(StrictModel):
    """Answer extraction, equivalence (fast path, then math-verify in a process pool) and reward values.

    ``timeout_s`` bounds math-verify on one (gold, pred) pair; ``workers`` is the pool size; pairs go to the
    pool in chunks of ``chunk_size``; ``pool_start_timeout_s`` is the grace for spawning a worker (a fresh
    interpreter importing sympy); ``float_rel_tol`` is the tolerance of the numeric fast path for
    non-integers (two integers compare exactly).
    """

    fallbacks: list[Literal["answer_line", "last_number"]] = ["answer_line", "last_number"]
    timeout_s: float = Field(5.0, gt=0)
    workers: int = Field(2, ge=1)
    chunk_size: int = Field(32, ge=1)
    pool_start_timeout_s: float = Field(60.0, gt=0)
    float_rel_tol: float = Field(1e-6, ge=0)
    stage1: Stage1Reward = Stage1Reward()
    stage3: Stage3Reward = Stage3Reward()
