"""Config of evaluation and the nightly regression gate (owned by components/evaluation)."""

from __future__ import annotations

from pydantic import Field

from components.settings import StrictModel


class BenchmarkSpec(StrictModel):
    name: str
    n_samples: int = Field(1, ge=1)
    k: int = Field(1, ge=1)
    max_problems: int | None = Field(None, ge=1)


class EvaluateConfig(StrictModel):
    checkpoints: list[str] = ["seed", "npr_zero", "parallel_warmup", "papo_rl", "sequential_warmup", "sr_rl"]
    parallel_checkpoints: list[str] = ["parallel_warmup", "papo_rl"]
    benchmarks: list[BenchmarkSpec] = []
    benchmark_dir: str = "data/benchmarks"
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(0.7, gt=0, le=1)
    max_new_tokens: int = Field(30000, ge=1)
    seed: int = Field(0, ge=0)
    measure_speedup: bool = True


class NightlyConfig(StrictModel):
    checkpoint: str = "papo_rl"
    baseline_dir: str = "eval/baselines"
    cron: str = "0 3 * * *"
    timezone: str = "UTC"
    tolerance: float = Field(0.05, ge=0, le=1)
    confidence: float = Field(0.95, gt=0, lt=1)
    format_valid_floor: float = Field(0.9, ge=0, le=1)
    parallel_rate_floor: float = Field(0.9, ge=0, le=1)
