"""The one typed model of params.yaml, profile materialisation and key-path error reporting.

params.yaml is the resolved config of the active profile (``configs/<profile>.yaml``); DVC tracks its keys
per stage. ``npr config use PROFILE`` rewrites params.yaml from the profile file.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from components.data.config import SampleOrzConfig
from components.engine.config import DistillConfig, RejectFilterConfig
from components.evaluation.config import EvaluateConfig, NightlyConfig
from components.grading.config import GradingConfig
from components.models.config import ModelsConfig, SeedConfig
from components.ops.config import OrchestrationConfig, StorageConfig, TrackingConfig
from components.settings import StrictModel
from components.training.config import (
    ParallelR1Config,
    PR1ColdStartConfig,
    PR1RLConfig,
    RLStageConfig,
    SFTStageConfig,
)

CONFIGS_DIR = Path("configs")
PARAMS_FILE = Path("params.yaml")


class ConfigError(ValueError):
    """Raised when params.yaml (or a profile, or an override) does not validate; names the key path."""


class RunConfig(StrictModel):
    """Settings shared by all stages of one pipeline run."""

    seed: int = Field(0, ge=0)
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    torch_threads: int = Field(2, ge=1, le=256)
    artifacts_dir: str = "artifacts"


class PromptConfig(StrictModel):
    """The instruction files (ours, versioned) and how they are joined to a problem."""

    parallel_instruction: str = "prompts/npr_parallel_v1.txt"
    sequential_instruction: str = "prompts/sequential_v1.txt"
    # The Parallel-R1 recipe's instruction (pr1_coldstart, pr1_rl and their checkpoints in evaluate).
    parallel_r1_instruction: str = "prompts/pr1_parallel_v1.txt"
    # Separator between the problem text and the instruction inside the user turn.
    separator: str = "\n\n"
    system_prompt: str | None = None
    enable_thinking: bool = False


class PipelineConfig(StrictModel):
    """Everything in params.yaml."""

    profile: str
    schema_name: Literal["npr", "multiverse", "parallel_r1"] = "npr"
    run: RunConfig
    prompts: PromptConfig
    models: ModelsConfig
    grading: GradingConfig
    tracking: TrackingConfig
    storage: StorageConfig
    orchestration: OrchestrationConfig
    sample_orz: SampleOrzConfig
    seed: SeedConfig
    npr_zero: RLStageConfig
    distill: DistillConfig
    reject_filter: RejectFilterConfig
    parallel_warmup: SFTStageConfig
    sequential_warmup: SFTStageConfig
    papo_rl: RLStageConfig
    sr_rl: RLStageConfig
    # The Parallel-R1 recipe (arXiv 2509.07980) on the same components: cold start, then GRPO.
    parallel_r1: ParallelR1Config
    pr1_coldstart: PR1ColdStartConfig
    pr1_rl: PR1RLConfig
    evaluate: EvaluateConfig
    nightly: NightlyConfig

    @model_validator(mode="after")
    def _parallel_r1_variant(self) -> PipelineConfig:
        """The Parallel-R1 stages' modes follow ``parallel_r1.attention`` (one key picks Seen or Unseen):
        the cold start's SFT mode, the RL stage's rollout mode and structural filter, their instruction.
        The derived fields are not written to params.yaml (DVC tracks ``parallel_r1`` for both stages)."""
        pr1 = self.parallel_r1
        unseen = pr1.attention == "unseen"
        # object.__setattr__: a derived value, not an assignment to validate (and re-run this validator on)
        object.__setattr__(
            self,
            "pr1_coldstart",
            self.pr1_coldstart.model_copy(update={"mode": pr1.mode, "prompt_style": pr1.PROMPT_STYLE}),
        )
        object.__setattr__(
            self,
            "pr1_rl",
            self.pr1_rl.model_copy(
                update={
                    "engine_mode": pr1.mode,
                    "structural_filter": unseen,
                    "prompt_style": pr1.PROMPT_STYLE,
                }
            ),
        )
        listed = sorted(set(self.evaluate.parallel_checkpoints) & set(pr1.STAGES))
        if listed:
            raise ValueError(
                f"evaluate.parallel_checkpoints lists {listed}: the Parallel-R1 checkpoints decode as "
                "parallel_r1.attention says (unseen: parallel, seen: sequential); remove them there"
            )
        overridden = sorted(set(self.evaluate.prompt_style_overrides) & set(pr1.STAGES))
        if overridden:
            raise ValueError(
                f"evaluate.prompt_style_overrides names {overridden}: the Parallel-R1 checkpoints are always "
                "prompted with prompts.parallel_r1_instruction; remove them there"
            )
        return self

    def schema_of(self, stage: str) -> str:
        """The structure schema of a stage's traces (and of the checkpoint it writes): the stage section's
        own (Parallel-R1's stages: ``parallel_r1``) or the pipeline's ``schema_name``."""
        section = getattr(self, stage, None)
        return getattr(section, "SCHEMA", None) or self.schema_name

    def decode_mode_of(self, checkpoint: str) -> Literal["parallel", "sequential"]:
        """How ``evaluate`` decodes a checkpoint: the Parallel-R1 ones per ``parallel_r1.attention``, the
        others per ``evaluate.parallel_checkpoints``."""
        if checkpoint in self.parallel_r1.STAGES:
            return self.parallel_r1.mode
        return self.evaluate.mode_for(checkpoint)

    def prompt_style_of(self, checkpoint: str) -> str:
        """The instruction ``evaluate`` prompts a checkpoint with (its training instruction)."""
        if checkpoint in self.parallel_r1.STAGES:
            return self.parallel_r1.PROMPT_STYLE
        return self.evaluate.prompt_style_for(checkpoint)

    def engine_settings_of(self, checkpoint: str) -> dict[str, Any]:
        """Extra engine settings of a checkpoint's decoding (Parallel-R1's paths per block), else none."""
        return self.parallel_r1.engine_settings() if checkpoint in self.parallel_r1.STAGES else {}

    def section_hash(self, *keys: str) -> str:
        """Stable short hash of some top-level sections (used for stage fingerprints)."""
        payload = {k: self.model_dump(mode="json")[k] for k in keys}
        return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]


def _format_errors(err: ValidationError, source: str) -> str:
    lines = [f"invalid config in {source}:"]
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        lines.append(
            f"  {path}: {e['msg']}"
            + (f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else "")
        )
    return "\n".join(lines)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML so numbers/bools/lists keep their types."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key")
    return key.strip().split("."), yaml.safe_load(raw)


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides in place; an unknown path is left for validation to reject by name."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for part in path[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[path[-1]] = value
    return data


def validate_config(data: dict[str, Any], source: str = "<config>") -> PipelineConfig:
    try:
        return PipelineConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_errors(err, source)) from None


def read_yaml(path: Path) -> dict[str, Any]:
    if not path.exists():
        raise ConfigError(f"config file {path} does not exist")
    data = yaml.safe_load(path.read_text())
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return data


def profile_path(profile: str) -> Path:
    path = CONFIGS_DIR / f"{profile}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in CONFIGS_DIR.glob("*.yaml"))
        raise ConfigError(f"unknown profile {profile!r}; known profiles: {', '.join(known)}")
    return path


def load_config(
    path: Path | str = PARAMS_FILE, profile: str | None = None, overrides: list[str] | None = None
) -> PipelineConfig:
    """Load params.yaml, or a profile file when ``profile`` is given, apply overrides, validate."""
    source = profile_path(profile) if profile else Path(path)
    data = apply_overrides(read_yaml(source), overrides or [])
    return validate_config(data, str(source))


def materialise_profile(
    profile: str, overrides: list[str] | None = None, dest: Path = PARAMS_FILE
) -> PipelineConfig:
    """Write the validated profile (plus overrides) to params.yaml; returns the config written."""
    cfg = load_config(profile=profile, overrides=overrides)
    text = dump_yaml(cfg)
    if not dest.exists() or dest.read_text() != text:
        tmp = dest.with_suffix(".yaml.tmp")
        tmp.write_text(text)
        tmp.replace(dest)
    return cfg


def dump_yaml(cfg: PipelineConfig) -> str:
    header = (
        f"# Resolved config of profile '{cfg.profile}'. Generated by `npr config use {cfg.profile}` from\n"
        f"# configs/{cfg.profile}.yaml. Edits here (e.g. `dvc exp run -S key=value`) last until the next\n"
        f"# `npr config use` / `npr run --profile`; change the profile file to make them permanent.\n"
    )
    return header + yaml.safe_dump(
        cfg.model_dump(mode="json"), sort_keys=False, allow_unicode=True, width=100
    )
