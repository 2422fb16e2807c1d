"""Config of the data stages (owned by components/data)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel


class SampleOrzConfig(StrictModel):
    """Stage `sample_orz`: where problems come from, quality floors, and the seeded subset."""

    source: Literal["synthetic", "local", "hf", "url"] = "synthetic"
    local_path: str = "data/orz"
    hf_dataset: str = "Open-Reasoner-Zero/orz_math_57k_collection"
    url: str | None = None
    n: int = Field(8000, ge=1)
    test_n: int = Field(0, ge=0)
    seed: int = Field(0, ge=0)
    synthetic_pool: int = Field(20000, ge=1)
    min_problem_chars: int = Field(5, ge=1)
    max_problem_chars: int = Field(8000, ge=1)
    max_answer_chars: int = Field(200, ge=1)
    min_kept_fraction: float = Field(0.9, ge=0.0, le=1.0)
    n_shards: int = Field(2, ge=1)
