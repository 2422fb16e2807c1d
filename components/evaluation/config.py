"""Config of evaluation and the nightly regression gate (owned by components/evaluation).

The sampling settings live flat in the ``evaluate`` section (they are what a baseline file pins); the
runner turns them into the engine's ``GenerationConfig`` once per checkpoint, with the mode chosen by
whether the checkpoint is a parallel one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.engine.config import GenerationConfig
from components.settings import StrictModel


class BenchmarkSpec(StrictModel):
    """One benchmark: ``n_samples`` samples per problem (avg@n), pass@k / best@k with ``k <= n_samples``."""

    name: str = Field(min_length=1)
    n_samples: int = Field(1, ge=1)
    k: int = Field(1, ge=1)
    max_problems: int | None = Field(None, ge=1)

    @model_validator(mode="after")
    def _k_within_samples(self) -> BenchmarkSpec:
        if self.k > self.n_samples:
            raise ValueError(f"benchmark {self.name!r}: k={self.k} exceeds n_samples={self.n_samples}")
        return self


# The pipeline stages that write a model (artifacts/<stage>/model), in the order the report lists them.
MODEL_STAGES = (
    "seed",
    "npr_zero",
    "parallel_warmup",
    "papo_rl",
    "sequential_warmup",
    "sr_rl",
    "pr1_coldstart",
    "pr1_rl",
)


class EvaluateConfig(StrictModel):
    """Stage `evaluate` and `npr eval`: which checkpoints, which benchmarks, the pinned sampling settings."""

    checkpoints: list[str] = list(MODEL_STAGES)
    parallel_checkpoints: list[str] = ["parallel_warmup", "papo_rl"]
    benchmarks: list[BenchmarkSpec] = []
    benchmark_dir: str = "data/benchmarks"
    # The engine's own sampling settings (pinned in baseline files); `mode` is chosen per checkpoint.
    generation: GenerationConfig = GenerationConfig(top_p=0.7)
    # Instruction a checkpoint is prompted with (the paper prompts its models with the NPR format), and
    # per-checkpoint exceptions for checkpoints trained on the other instruction.
    prompt_style: Literal["parallel", "sequential", "parallel_r1"] = "parallel"
    prompt_style_overrides: dict[str, Literal["parallel", "sequential", "parallel_r1"]] = {}
    # Speedup = tokens/s of the same checkpoint's same prompts decoded in parallel vs sequential mode; the
    # sequential re-decode of each parallel checkpoint is also graded and kept (mode "sequential").
    measure_speedup: bool = True
    records_shards: int = Field(1, ge=1)
    # The benchmark the report's recipe table (components/evaluation/recipe.py: checkpoints in the paper's
    # order, claims with paired bootstrap intervals) is computed on; None = the first of `benchmarks`.
    recipe_benchmark: str | None = None
    recipe_confidence: float = Field(0.95, gt=0, lt=1)
    recipe_resamples: int = Field(2000, ge=100)

    @model_validator(mode="after")
    def _consistent(self) -> EvaluateConfig:
        unknown = sorted(set(self.parallel_checkpoints) - set(self.checkpoints))
        if unknown:
            raise ValueError(f"parallel_checkpoints {unknown} are not in checkpoints {self.checkpoints}")
        # Overrides may name a model stage left out of this run's checkpoints (narrowed with -S), not a typo.
        unknown = sorted(set(self.prompt_style_overrides) - set(self.checkpoints) - set(MODEL_STAGES))
        if unknown:
            raise ValueError(f"prompt_style_overrides {unknown} name neither a checkpoint nor a model stage")
        names = [b.name for b in self.benchmarks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"benchmark names must be unique; repeated: {dupes}")
        if self.recipe_benchmark is not None and self.recipe_benchmark not in names:
            raise ValueError(f"recipe_benchmark {self.recipe_benchmark!r} is not in benchmarks {names}")
        return self

    def recipe_benchmark_name(self) -> str | None:
        """The benchmark of the recipe table (None without benchmarks)."""
        return self.recipe_benchmark or (self.benchmarks[0].name if self.benchmarks else None)

    def mode_for(self, checkpoint: str) -> Literal["parallel", "sequential"]:
        """How a checkpoint decodes: parallel for ``parallel_checkpoints``, sequential otherwise."""
        return "parallel" if checkpoint in self.parallel_checkpoints else "sequential"

    def prompt_style_for(self, checkpoint: str) -> str:
        return self.prompt_style_overrides.get(checkpoint, self.prompt_style)


class NightlyConfig(StrictModel):
    """The nightly regression gate: the promoted checkpoint vs its committed baseline file."""

    checkpoint: str = "papo_rl"
    baseline_dir: str = "eval/baselines"
    # Baseline file is ``<baseline_dir>/<tag>.yaml``; default tag ``<profile>-<checkpoint>``.
    baseline_tag: str | None = None
    # The last green nightly's metrics (drift reference); not committed, kept beside the artifacts.
    state_file: str = "artifacts/nightly/last_green.json"
    report_dir: str = "artifacts/nightly"
    # Subset of evaluate.benchmarks to run nightly (None = all of them).
    benchmarks: list[str] | None = None
    cron: str = "0 3 * * *"
    timezone: str = "UTC"
    tolerance: float = Field(0.05, ge=0, le=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    # wilson: bound at n = problems x samples; bootstrap: resample problems (clustered samples).
    method: Literal["wilson", "bootstrap"] = "wilson"
    bootstrap_samples: int = Field(2000, ge=100)
    gate_metrics: list[Literal["accuracy", "pass@k"]] = ["accuracy", "pass@k"]
    format_valid_floor: float = Field(0.9, ge=0, le=1)
    parallel_rate_floor: float = Field(0.9, ge=0, le=1)
