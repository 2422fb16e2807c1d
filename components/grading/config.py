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


class Stage3Reward(StrictModel):
    """PAPO: accuracy only; invalid structure is filtered, not scored."""

    correct: float = 1.0
    wrong: float = -1.0
    empty: float = 0.0


class GradingConfig(StrictModel):
    fallbacks: list[Literal["answer_line", "last_number"]] = ["answer_line", "last_number"]
    timeout_s: float = Field(5.0, gt=0)
    workers: int = Field(2, ge=1)
    float_rel_tol: float = Field(1e-6, ge=0)
    stage1: Stage1Reward = Stage1Reward()
    stage3: Stage3Reward = Stage3Reward()
