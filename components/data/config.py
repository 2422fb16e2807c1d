"""Config of the data stages (owned by components/data)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel

DifficultyName = Literal["easy", "medium", "hard"]


class SampleOrzConfig(StrictModel):
    """Stage `sample_orz`: where problems come from, quality floors, and the seeded subset.

    ``source``: ``synthetic`` (the tiny task family, ``synthetic_pool`` problems mixed by
    ``synthetic_weights``), ``local`` (ORZ raw JSON file or directory at ``local_path``), ``hf`` (the hub
    dataset ``hf_dataset``, online only) or ``url`` (an ORZ raw JSON file at ``url``, online only).
    ``test_n`` problems are held out first, then ``val_n`` validation problems (for tuning: the RL stages'
    held-out evaluations and the seed's measurement read them, never the test split), then ``n`` training
    problems. The synthetic source draws each split from its own partition of the problem space
    (``components.data.synthetic.partition``), so the committed tiny seed never saw a test or val problem.
    """

    source: Literal["synthetic", "local", "hf", "url"] = "synthetic"
    local_path: str = "data/orz"
    hf_dataset: str = "Open-Reasoner-Zero/orz_math_57k_collection"
    url: str | None = None
    n: int = Field(8000, ge=1)
    test_n: int = Field(0, ge=0)
    val_n: int = Field(0, ge=0)
    seed: int = Field(0, ge=0)
    synthetic_pool: int = Field(20000, ge=1)
    synthetic_weights: dict[DifficultyName, float] = Field(
        default_factory=lambda: {"easy": 0.2, "medium": 0.4, "hard": 0.4}
    )
    # A truncated ORZ file (the public 72k copy is cut mid-record) fails unless this keeps its complete records.
    recover_truncated: bool = False
    download_timeout_s: float = Field(60.0, gt=0)
    min_problem_chars: int = Field(5, ge=1)
    max_problem_chars: int = Field(8000, ge=1)
    max_answer_chars: int = Field(200, ge=1)
    min_kept_fraction: float = Field(0.9, ge=0.0, le=1.0)
    n_shards: int = Field(2, ge=1)


class RejectFilterConfig(StrictModel):
    """Stage `reject_filter`: keep correct AND structurally valid trajectories."""

    max_accepted_per_problem: int = Field(1, ge=1)
    min_response_tokens: int = Field(1, ge=0)
    max_response_tokens: int = Field(30000, ge=1)
    min_acceptance_rate: float = Field(0.0, ge=0, le=1)
