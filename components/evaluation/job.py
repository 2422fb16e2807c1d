"""The evaluation's job (``EvalJob``), built once from the pipeline's config (``eval_job``), and what that
builder reads of the config (``EvalJobConfig``).

The evaluate stage, ``npr eval`` (``adhoc``) and the nightly flow each build one ``EvalJob`` and hand it to
the runner; nothing below them reads the whole config (issue 45: a stage builds its job once)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

from components.dag import StageIO
from components.engine.config import GenerationConfig
from components.evaluation.config import EvaluateConfig
from components.grading.config import GradingConfig
from components.models.config import ModelsConfig
from components.prompts import PromptConfig
from components.settings import RunConfig
from components.structure.merge import MergeSemantics

Mode = Literal["parallel", "sequential"]
REPORT_FILE = "report.md"


class EvalJobConfig(Protocol):
    """What ``eval_job`` reads of the pipeline's config. That is components.config.PipelineConfig, a floor
    above this package (it assembles this package's sections), so it is named here by what the job holds:
    its own section (``evaluate``), the prompts, the grading settings, the model and run settings a
    checkpoint is loaded with, the schema and merge semantics the checkpoints were trained in, and how each
    checkpoint is decoded (mode, instruction, schema, engine settings)."""

    @property
    def evaluate(self) -> EvaluateConfig: ...

    @property
    def prompts(self) -> PromptConfig: ...

    @property
    def grading(self) -> GradingConfig: ...

    @property
    def models(self) -> ModelsConfig: ...

    @property
    def run(self) -> RunConfig: ...

    @property
    def schema_name(self) -> str: ...

    @property
    def merge_semantics(self) -> MergeSemantics: ...

    def decode_mode_of(self, checkpoint: str) -> Literal["parallel", "sequential"]: ...

    def prompt_style_of(self, checkpoint: str) -> str: ...

    def schema_of(self, stage: str) -> str: ...

    def engine_settings_of(self, checkpoint: str, *, evaluation: bool = False) -> dict[str, Any]: ...


@dataclass(frozen=True)
class CheckpointDecode:
    """How one checkpoint is decoded, resolved from the config when the job is built."""

    mode: Mode  # parallel checkpoints (evaluate.parallel_checkpoints, Parallel-R1's) decode in parallel
    prompt_style: str  # the instruction it was trained under
    schema: str  # the structure schema its traces are judged and decoded by
    engine_settings: Mapping[str, Any] = field(default_factory=dict)  # extra GenerationConfig fields


@dataclass(frozen=True)
class EvalOutputs:
    """Where an evaluation writes: per-sample records, the report (markdown and PNGs), the plot data."""

    records_dir: Path
    report_dir: Path
    plots_dir: Path

    @property
    def report(self) -> Path:
        return self.report_dir / REPORT_FILE


@dataclass(frozen=True)
class EvalPaths:
    """Where stage `evaluate` reads and writes (its ``StageIO``, resolved from dvc.yaml)."""

    models: Mapping[str, Path]  # each evaluated checkpoint's ``<stage>/model``
    problems: Path  # ``sample_orz/problems``: the held-out split's benchmark
    outputs: EvalOutputs
    work_dir: Path  # finished checkpoints kept for a rerun, the W&B run id (not a DVC out)

    @classmethod
    def of(cls, io: StageIO, checkpoints: Sequence[str]) -> EvalPaths:
        """The evaluate stage's paths from its ``StageIO`` for the checkpoints its section names."""
        if io.plots is None:
            raise ValueError("stage evaluate declares no plots/evaluate output in dvc.yaml")
        out = EvalOutputs(
            records_dir=io.output("records"), report_dir=io.output("report"), plots_dir=io.plots
        )
        return cls(
            models={name: io.input(f"{name}/model") for name in checkpoints},
            problems=io.input("sample_orz/problems"),
            outputs=out,
            # the stage's work dir (artifacts/evaluate/work, stamped by run_stage)
            work_dir=out.report_dir.parent / "work",
        )


@dataclass(frozen=True)
class EvalJob:
    """An evaluation as the runner reads it; built by ``eval_job``."""

    section: EvaluateConfig  # benchmarks, sampling (generation), speedup, shards, the recipe comparison
    prompts: PromptConfig
    grading: GradingConfig
    models: ModelsConfig  # how a checkpoint is loaded (with ``run``'s device and precision)
    run: RunConfig
    schema: str  # the pipeline's schema (a checkpoint's own is in ``decoding``)
    merge_semantics: MergeSemantics  # what the checkpoints were trained to see, pinned beside the decode's
    decoding: Mapping[str, CheckpointDecode]  # per checkpoint name the job evaluates

    def decode_of(self, checkpoint: str) -> CheckpointDecode:
        """How ``checkpoint`` is decoded; the job knows only the checkpoints it was built for."""
        if checkpoint not in self.decoding:
            raise KeyError(
                f"the evaluation job was built without checkpoint {checkpoint!r} (eval_job(..., names))"
            )
        return self.decoding[checkpoint]

    def with_generation(self, generation: GenerationConfig) -> EvalJob:
        """The job with ``evaluate.generation`` replaced (a served checkpoint's URL)."""
        return dataclasses.replace(self, section=self.section.model_copy(update={"generation": generation}))


def eval_job(cfg: EvalJobConfig, checkpoints: Sequence[str] | None = None) -> EvalJob:
    """The evaluation's job: the ``evaluate`` section and the shared settings it reads, once, with each
    checkpoint's decoding resolved (``checkpoints``: default the section's; ``npr eval`` and the nightly
    name the one they evaluate). Where it reads and writes is the caller's (the stage's ``EvalPaths``)."""
    names = cfg.evaluate.checkpoints if checkpoints is None else checkpoints
    decoding = {
        name: CheckpointDecode(
            mode=cfg.decode_mode_of(name),
            prompt_style=cfg.prompt_style_of(name),
            schema=cfg.schema_of(name),
            engine_settings=cfg.engine_settings_of(name, evaluation=True),
        )
        for name in names
    }
    return EvalJob(
        section=cfg.evaluate,
        prompts=cfg.prompts,
        grading=cfg.grading,
        models=cfg.models,
        run=cfg.run,
        schema=cfg.schema_name,
        merge_semantics=cfg.merge_semantics,
        decoding=decoding,
    )
