"""An RL stage's job, built once: its section and the shared settings it trains with, read off the config.

``rl_job(stage, cfg, paths)`` is the one place an RL stage's settings are looked up by the stage's name: it
reads the section (``rl_section``), the schema and generation extras the stage's traces use, the merge
semantics, the prompts, the grading, the run's and the models' settings and the W&B settings into one frozen
``RLJob``. Everything below takes that object: the local trainer (``components.training.rl``) and the verl
job (``components.training.verl.job.verl_job``, which builds its overrides from it). The RL stage files
(``components/stages/{npr_zero,papo_rl,sr_rl,pr1_rl}.py``) build it with their paths (``RLPaths``).

The config is ``components.config.PipelineConfig``, a floor above this package (it assembles this package's
sections), so the builder names what it reads as a Protocol (``RLJobConfig``); PipelineConfig satisfies it
member by member (tests/unit/core/test_config_protocols.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from components.dag import StageIO
from components.grading.config import GradingConfig
from components.models.config import ModelsConfig
from components.ops.config import TrackingConfig
from components.prompts import PromptConfig
from components.settings import RunConfig
from components.structure.merge import MergeSemantics
from components.training.config import RLStageConfig, StageSections, rl_section


class RLJobConfig(StageSections, Protocol):
    """What an RL stage's job reads of the pipeline's config: the stage's own section (``StageSections``),
    the schema and engine extras of its traces, the merge semantics, the prompts, the grading settings its
    rewards and evaluations read, the run's folders, seed and precision, the models' loading settings, the
    W&B project and the profile's name (a verl job's id)."""

    profile: str

    @property
    def run(self) -> RunConfig: ...

    @property
    def models(self) -> ModelsConfig: ...

    @property
    def prompts(self) -> PromptConfig: ...

    @property
    def grading(self) -> GradingConfig: ...

    @property
    def tracking(self) -> TrackingConfig: ...

    @property
    def merge_semantics(self) -> MergeSemantics: ...

    def schema_of(self, stage: str) -> str: ...

    def engine_settings_of(self, checkpoint: str, *, evaluation: bool = False) -> dict[str, Any]: ...


@dataclass(frozen=True)
class RLPaths:
    """Where an RL stage reads and writes (its ``StageIO``, resolved from dvc.yaml)."""

    starts_from: Path  # the model the stage trains: ``<init_from>/model``
    problems: Path  # ``sample_orz/problems``: rollouts on the train split, held-out evals on val (else test)
    writes: Path  # the trained model, written atomically
    work_dir: Path  # checkpoints, the per-step log, the W&B run id (not a DVC out)

    @classmethod
    def of(cls, io: StageIO, init_from: str) -> RLPaths:
        """An RL stage's paths from its ``StageIO``: the ``model`` of the stage it starts from, the problems,
        its own ``model`` and the work dir beside it."""
        model = io.output("model")
        return cls(
            starts_from=io.input(f"{init_from}/model"),
            problems=io.input("sample_orz/problems"),
            writes=model,
            work_dir=model.parent / "work",
        )


@dataclass(frozen=True)
class RLJob:
    """One RL stage, as its trainer (local or verl) reads it; built by ``rl_job``."""

    stage: str
    section: RLStageConfig
    schema: str  # the structure schema of the stage's traces (and of the checkpoint it writes)
    merge_semantics: MergeSemantics  # what post-merge tokens see in the trainer's forward
    prompts: PromptConfig
    grading: GradingConfig
    run: RunConfig  # the run's folders, device, dtype and compute precision (``run.autocast``)
    models: ModelsConfig  # how the starting model is loaded (attention implementation)
    tracking: TrackingConfig
    profile: str
    # extra GenerationConfig fields of its rollouts and evaluations (Parallel-R1's paths per block)
    generation: dict[str, Any] = field(default_factory=dict)
    # None: a trainer driven without a stage (tests, benchmarks hand it a model and problems themselves)
    paths: RLPaths | None = None

    def stage_paths(self) -> RLPaths:
        """The job's paths; a job built without them cannot run as a stage."""
        if self.paths is None:
            raise ValueError(f"{self.stage}: the job was built without its stage paths (rl_job(..., paths=))")
        return self.paths


def rl_job(stage: str, cfg: RLJobConfig, paths: RLPaths | None = None) -> RLJob:
    """``stage``'s job: its section (which must be an RL stage's) and the shared settings it needs, read
    once; ``paths``: where it reads and writes (None: a trainer driven without a stage)."""
    return RLJob(
        stage=stage,
        section=rl_section(cfg, stage),
        schema=cfg.schema_of(stage),
        merge_semantics=cfg.merge_semantics,
        prompts=cfg.prompts,
        grading=cfg.grading,
        run=cfg.run,
        models=cfg.models,
        tracking=cfg.tracking,
        profile=cfg.profile,
        generation=dict(cfg.engine_settings_of(stage)),
        paths=paths,
    )
