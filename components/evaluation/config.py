"""Config of evaluation and the nightly regression gate (owned by components/evaluation).

The sampling settings live flat in the ``evaluate`` section (they are what a baseline file pins); the
runner turns them into the engine's ``GenerationConfig`` once per checkpoint, with the mode chosen by
whether the checkpoint is a parallel one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from components.dag import model_stages
from components.engine.config import DecodeStageConfig, GenerationConfig
from components.settings import StrictModel


class BenchmarkSpec(StrictModel):
    """One benchmark: ``n_samples`` samples per problem (avg@n), pass@k / best@k with ``k <= n_samples``.

    ``smoke: true`` marks a few-problem sample of a benchmark that checks the path runs (the tiny profile's
    3 problems of each real benchmark, which its model cannot solve): reported in its own table, never in
    an average (accuracy or throughput) or a speedup.
    """

    name: str = Field(min_length=1)
    n_samples: int = Field(1, ge=1)
    k: int = Field(1, ge=1)
    max_problems: int | None = Field(None, ge=1)
    smoke: bool = False

    @model_validator(mode="after")
    def _k_within_samples(self) -> BenchmarkSpec:
        if self.k > self.n_samples:
            raise ValueError(f"benchmark {self.name!r}: k={self.k} exceeds n_samples={self.n_samples}")
        return self


class SpeedupConfig(StrictModel):
    """How a parallel checkpoint's speedup is measured: the same prompts decoded in parallel and in
    sequential mode, batch by batch, alternating which mode goes first (the machine's speed drifts).

    ``benchmark``: whose problems (None: every non-smoke benchmark); ``max_problems``: the first N of them
    (None: all), one sample each; ``batch_size``: the decode batch (None: ``generation.batch_size``);
    ``repeats``: decodes of each batch per mode, the fastest counting. NPR's
    speedup is a latency claim (one problem answered in fewer decode steps); on a CPU a full batch is
    compute-bound, so the tiny profile measures it at a small batch (docs/results.md has both).
    """

    benchmark: str | None = None
    max_problems: int | None = Field(None, ge=1)
    batch_size: int | None = Field(None, ge=1)
    # each batch is decoded this many times in each mode and the fastest decode of each counts (timeit's
    # rule: other work on the machine only ever slows a decode down); the decodes are seeded per request,
    # so every repeat decodes the same tokens
    repeats: int = Field(1, ge=1)
    # which parallel checkpoints get it (None: every one); the tiny profile times NPR's, whose speedup the
    # recipe claims, and not Parallel-R1's (each decode costs ~40 s of a 2-core run)
    checkpoints: list[str] | None = None

    def applies_to(self, checkpoint: str) -> bool:
        return self.checkpoints is None or checkpoint in self.checkpoints


def _every_model_stage() -> list[str]:
    """The default checkpoints: every stage that writes a model (``artifacts/<stage>/model`` in dvc.yaml), in
    the order the report lists them (a branch's SFT next to its RL). Read when a config leaves
    ``evaluate.checkpoints`` out (the profiles name theirs), so dvc.yaml stays the one list."""
    return model_stages()


class RecipeClaim(StrictModel):
    """A claim of the paper: checkpoint ``a``'s accuracy minus ``b``'s is ``>= 0`` (``ge``) or ``> 0`` (``gt``)."""

    a: str
    b: str
    relation: Literal["ge", "gt"]


class EvaluateConfig(DecodeStageConfig):
    """Stage `evaluate` and `npr eval`: which checkpoints, which benchmarks, the pinned sampling settings."""

    checkpoints: list[str] = Field(default_factory=_every_model_stage)
    parallel_checkpoints: list[str] = ["parallel_warmup", "papo_rl"]
    benchmarks: list[BenchmarkSpec] = []
    benchmark_dir: str = "data/benchmarks"
    # The engine's own sampling settings (pinned in baseline files); `mode` is chosen per checkpoint.
    generation: GenerationConfig = GenerationConfig(top_p=0.7)
    # Instruction a checkpoint is prompted with (the paper prompts its models with the NPR format), and
    # per-checkpoint exceptions for checkpoints trained on the other instruction.
    prompt_style: Literal["parallel", "sequential", "parallel_r1"] = "parallel"
    prompt_style_overrides: dict[str, Literal["parallel", "sequential", "parallel_r1"]] = {}
    # Speedup = tokens/s of the same checkpoint's same prompts decoded in parallel vs sequential mode
    # (``speedup``); the sequential decodes are graded and kept too (records with mode "sequential").
    measure_speedup: bool = True
    speedup: SpeedupConfig = SpeedupConfig()
    records_shards: int = Field(1, ge=1)
    # The benchmark the report's recipe table (components/evaluation/recipe.py: checkpoints in the paper's
    # order, claims with paired bootstrap intervals) is computed on; None = the first of `benchmarks`.
    recipe_benchmark: str | None = None
    recipe_confidence: float = Field(0.95, gt=0, lt=1)
    recipe_resamples: int = Field(2000, ge=100)
    # The paper's comparison: its checkpoints in its order, each the stage that writes it -> the paper's
    # name for it (the relative recipe, arXiv 2509.07980, after NPR's and SR's, on the same seed and
    # problems); the accuracy claims of its Table 2 (NPR against its starting point, its sequential twin,
    # its warmup, Parallel-R1; the two warmups against each other); and the checkpoint the parallel-rate
    # and speedup targets are about (NPR; None: no targets). A checkpoint of the run not named here is
    # listed after these, by its stage name.
    recipe_names: dict[str, str] = {
        "seed": "seed (instruct)",
        "npr_zero": "NPR-Zero",
        "parallel_warmup": "NPR-Beta",
        "sequential_warmup": "SR-Beta",
        "papo_rl": "NPR",
        "sr_rl": "SR",
        "pr1_coldstart": "Parallel-R1 cold start",
        "pr1_rl": "Parallel-R1",
    }
    recipe_claims: list[RecipeClaim] = [
        RecipeClaim(a="papo_rl", b="seed", relation="ge"),
        RecipeClaim(a="papo_rl", b="sr_rl", relation="ge"),
        RecipeClaim(a="papo_rl", b="parallel_warmup", relation="gt"),
        RecipeClaim(a="parallel_warmup", b="sequential_warmup", relation="ge"),
        RecipeClaim(a="papo_rl", b="pr1_rl", relation="ge"),
    ]
    recipe_subject: str | None = "papo_rl"
    # The committed seed spread of the recipe (components/evaluation/spread.py: N runs of one commit with
    # shifted training seeds, written by benchmarks/bench_recipe.py --json): the report sets its mean and
    # spread beside each checkpoint's avg@n. None = none committed; a path that does not exist (yet) is
    # reported as such. `{precision}` in it is the compute precision this run's training resolved to
    # (run.autocast: bfloat16 or float32), so a run is compared with the spread of its own precision.
    # Keep it under a directory that dvc.yaml's evaluate stage depends on.
    seed_spread: str | None = Field(None, min_length=1)
    # A markdown note on what this profile's run can and cannot show (the miniature's scale), printed at the
    # top of the report. None = none. Keep it under a directory the evaluate stage depends on (eval/notes).
    scale_note: str | None = Field(None, min_length=1)

    @model_validator(mode="after")
    def _consistent(self) -> EvaluateConfig:
        unknown = sorted(set(self.parallel_checkpoints) - set(self.checkpoints))
        if unknown:
            raise ValueError(f"parallel_checkpoints {unknown} are not in checkpoints {self.checkpoints}")
        # prompt_style_overrides and speedup.checkpoints may name a model stage left out of this run's
        # checkpoints (narrowed with -S): PipelineConfig checks them against its stage table
        # (components.config.cross_field_problems), which this section cannot see.
        names = [b.name for b in self.benchmarks]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"benchmark names must be unique; repeated: {dupes}")
        named_in_claims = {c.a for c in self.recipe_claims} | {c.b for c in self.recipe_claims}
        unnamed = sorted((named_in_claims | ({self.recipe_subject} - {None})) - set(self.recipe_names))
        if unnamed:
            raise ValueError(f"recipe_claims and recipe_subject name {unnamed}, which recipe_names does not")
        smoke = {b.name for b in self.benchmarks if b.smoke}
        named = (("speedup.benchmark", self.speedup.benchmark), ("recipe_benchmark", self.recipe_benchmark))
        for what, name in named:
            if name is not None and (name not in names or name in smoke):
                raise ValueError(f"evaluate.{what} {name!r} is not a (non-smoke) benchmark in {names}")
        return self

    def recipe_benchmark_name(self) -> str | None:
        """The benchmark of the recipe table: ``recipe_benchmark``, else the first non-smoke one (None
        without one)."""
        main = [b.name for b in self.benchmarks if not b.smoke]
        return self.recipe_benchmark or (main[0] if main else None)

    def mode_for(self, checkpoint: str) -> Literal["parallel", "sequential"]:
        """How a checkpoint decodes: parallel for ``parallel_checkpoints``, sequential otherwise."""
        return "parallel" if checkpoint in self.parallel_checkpoints else "sequential"

    def prompt_style_for(self, checkpoint: str) -> str:
        return self.prompt_style_overrides.get(checkpoint, self.prompt_style)


class NightlyConfig(StrictModel):
    """The nightly regression gate: the promoted checkpoint vs the baseline ``npr nightly promote`` wrote."""

    checkpoint: str = "papo_rl"
    # The user's own baselines (`npr nightly promote` writes them and tracks them with DVC).
    baseline_dir: str = "baselines"
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
    # A failed gate: a line appended here always; a POST to the URL in this environment variable when set
    # (components/evaluation/alerts.py). The URL is a secret: it stays out of params.yaml.
    alert_file: str = "artifacts/nightly/alerts.jsonl"
    alert_webhook_env: str | None = "NPR_ALERT_WEBHOOK"
    alert_timeout_s: float = Field(10.0, gt=0)
