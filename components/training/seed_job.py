"""The tiny seed build's job, built once: the ``seed`` recipe and the shared settings it reads, off the config.

``seed_job(stage, cfg, paths)`` reads the recipe (the ``seed`` section), the schema its tokenizer and
grading use, the run's seed and precision, the prompts, the tiny architecture and attention (``models``), the
grading its measurement reads and the W&B settings into one frozen ``SeedJob``. Everything in
``components.training.tiny_seed`` takes that object; the stage file (``components/stages/seed.py``) builds it
with its paths, ``npr seed build`` without a stage (no stage W&B run, its own output and work dirs).

The config is ``components.config.PipelineConfig``, a floor above this package (it assembles this package's
sections), so the builder names what it reads as a Protocol (``SeedJobConfig``); PipelineConfig satisfies it
member by member (tests/unit/core/test_config_protocols.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from components.dag import StageIO
from components.grading.config import GradingConfig
from components.models.config import ModelsConfig, SeedConfig
from components.ops.config import TrackingConfig
from components.prompts import PromptConfig
from components.settings import RunConfig


class SeedJobConfig(Protocol):
    """What the seed build's job reads of the pipeline's config: its recipe (``seed``), the run's seed and
    precision, the prompts, the tiny architecture and attention (``models``), the schema its tokenizer and
    grading use, the grading settings its measurement reads and the W&B settings of a stage's run."""

    schema_name: str

    @property
    def seed(self) -> SeedConfig: ...

    @property
    def run(self) -> RunConfig: ...

    @property
    def prompts(self) -> PromptConfig: ...

    @property
    def models(self) -> ModelsConfig: ...

    @property
    def grading(self) -> GradingConfig: ...

    @property
    def tracking(self) -> TrackingConfig: ...


@dataclass(frozen=True)
class SeedPaths:
    """Where stage `seed` reads and writes (its ``StageIO``, resolved from dvc.yaml)."""

    problems: Path  # ``sample_orz/problems``: the held-out split the model is measured on
    writes: Path  # the seed model, written atomically
    work_dir: Path  # the build's checkpoints, step log and W&B run id (not a DVC out)

    @classmethod
    def of(cls, io: StageIO) -> SeedPaths:
        """The seed stage's paths from its ``StageIO``: the problems, its ``model`` and the work dir beside it."""
        model = Path(io.output("model"))
        return cls(problems=io.input("sample_orz/problems"), writes=model, work_dir=model.parent / "work")


@dataclass(frozen=True)
class SeedJob:
    """The seed build and measurement, as ``tiny_seed`` reads them; built by ``seed_job``."""

    section: SeedConfig  # the recipe (steps, batch, schedule, style mix) and the stage's measurement
    schema: str  # the structure schema the tokenizer's tags and the grading follow
    run: RunConfig  # the run's seed (data, initialisation), device and precision
    prompts: PromptConfig
    models: ModelsConfig  # the tiny architecture, its attention, the base model a stage materialises
    grading: GradingConfig
    # the stage's W&B run: inside ``run_stage`` it is already open (with the whole config recorded) and the
    # SFT logs into it; only its mode and project are read here
    tracking: TrackingConfig
    stage: str | None = None  # the stage whose W&B run the SFT logs to; None: ``npr seed build``, no run
    paths: SeedPaths | None = None  # None: a build outside the stage (``npr seed build``, tests)

    def stage_paths(self) -> SeedPaths:
        """The job's paths; a job built without them cannot run as a stage."""
        if self.paths is None:
            raise ValueError("the seed job was built without its stage paths (seed_job(..., paths=))")
        return self.paths


def seed_job(stage: str | None, cfg: SeedJobConfig, paths: SeedPaths | None = None) -> SeedJob:
    """The seed build's job: the ``seed`` recipe (stage `seed`'s section, and ``npr seed build``'s, which
    runs in no stage: ``stage`` None) and the shared settings it reads, once; ``paths``: the stage's."""
    return SeedJob(
        section=cfg.seed,
        schema=cfg.schema_name,
        run=cfg.run,
        prompts=cfg.prompts,
        models=cfg.models,
        grading=cfg.grading,
        tracking=cfg.tracking,
        stage=stage,
        paths=paths,
    )
