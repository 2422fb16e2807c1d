"""What the training floor reads of the pipeline's config, named as Protocols.

The config is ``components.config.PipelineConfig``, a floor above this package (it assembles this package's
sections), so a training function names what it uses instead of importing it; PipelineConfig satisfies each
protocol member by member (tests/unit/core/test_config_protocols.py). They live here, in a module that
imports only config models, so the local trainer (``components.training.rl``) and the verl job
(``components.training.verl.job``, which builds the verl job) share one definition.
"""

from __future__ import annotations

from typing import Any, Protocol

from components.grading.config import GradingConfig
from components.models.config import ModelsConfig
from components.ops.config import TrackingConfig
from components.prompts import PromptConfig
from components.settings import RunConfig
from components.structure.merge import MergeSemantics
from components.tracking import TrackedConfig
from components.training.config import StageSections


class VerlJobConfig(StageSections, Protocol):
    """What a verl job reads of the pipeline's config. That is components.config.PipelineConfig, a floor
    above this package (it assembles this package's sections), so it is named here by what a job uses: the
    stage's own section (``StageSections``), the run's folders and seed, the model's attention, the prompts, the
    grading settings its reward reads, the W&B project, and the schema and merge semantics it trains in."""

    profile: str
    schema_name: str

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


class RLTrainerConfig(StageSections, Protocol):
    """What the local RL trainer reads of the pipeline's config. That is components.config.PipelineConfig, a
    floor above this package (it assembles this package's sections), so it is named here by what the trainer
    uses: the stage's own section (``StageSections``, unless it is given one), the schema and merge semantics
    its traces are parsed and trained in, the prompts, the grading settings its rewards and evaluations read,
    and the run's compute precision (``run.autocast``)."""

    schema_name: str

    @property
    def merge_semantics(self) -> MergeSemantics: ...

    @property
    def prompts(self) -> PromptConfig: ...

    @property
    def grading(self) -> GradingConfig: ...

    @property
    def run(self) -> RunConfig: ...


class RLJobConfig(RLTrainerConfig, VerlJobConfig, TrackedConfig, Protocol):
    """What an RL stage (``run_rl_stage``) reads of the pipeline's config: the trainer's
    (``RLTrainerConfig``), the stage's W&B run (``TrackedConfig``) and, when the stage's backend is verl,
    what a verl job reads (``VerlJobConfig``; it includes the model settings the local trainer loads the
    policy with)."""
