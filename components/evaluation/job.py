"""What an evaluation reads of the pipeline's config (``EvalJobConfig``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, Protocol, Self

from components.evaluation.config import EvaluateConfig
from components.grading.config import GradingConfig
from components.models.config import ModelsConfig
from components.prompts import PromptConfig
from components.settings import RunConfig
from components.structure.merge import MergeSemantics


class EvalJobConfig(Protocol):
    """What an evaluation (``components.evaluation.runner``, ``adhoc``) reads of the pipeline's config. That
    is components.config.PipelineConfig, a floor above this package (it assembles this package's sections),
    so it is named here by what an evaluation uses: its own section (``evaluate``), the prompts, the grading
    settings, the model and run settings a checkpoint is loaded with, the schema and merge semantics the
    checkpoints were trained in, how each checkpoint is decoded (mode, instruction, schema, engine
    settings), and a copy with another ``evaluate`` section (a served checkpoint's URL)."""

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

    def model_copy(self, *, update: Mapping[str, Any] | None = None) -> Self: ...
