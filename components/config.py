"""The one typed model of params.yaml, profile materialisation and key-path error reporting.

params.yaml is the resolved config of the active profile (``configs/<profile>.yaml``; a profile that starts
with ``base: OTHER`` is deep-merged over that profile first: ``read_profile``); DVC tracks its keys per stage.
``npr config use PROFILE`` rewrites params.yaml from the profile file.

Validation has three layers, each naming the key it rejects (``ConfigError``): types and ranges per field
(``components.settings.StrictModel``: no bool-as-int, no string-as-number); cross-field rules of the config
alone (``PipelineConfig._cross_checks``: generation and SFT lengths within the tiny model's positions, the
PAPO engine with its filter); and rules about the checkout the config
runs in (``check_workspace``: the prompt files exist, a GPU stage asks for no more GPUs than the gpu pool's
jobs get). YAML is read as YAML 1.2 reads numbers (``1e-4`` is a float, as DVC writes it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ValidationError, model_validator

from components.data.config import RejectFilterConfig, SampleOrzConfig
from components.engine.config import DistillConfig
from components.evaluation.config import EvaluateConfig, NightlyConfig
from components.grading.config import GradingConfig
from components.models.config import ModelsConfig, SeedConfig
from components.ops.config import OrchestrationConfig, StorageConfig, TrackingConfig
from components.prompts import PromptConfig
from components.settings import ConfigError, RunConfig, StrictModel, load_yaml_text
from components.structure.merge import MergeSemantics
from components.training.config import (
    ParallelR1Config,
    PR1ColdStartConfig,
    PR1RLConfig,
    RLStageConfig,
    SFTStageConfig,
)

CONFIGS_DIR = Path("configs")
PARAMS_FILE = Path("params.yaml")
PREFECT_FILE = Path("prefect.yaml")
GPU_STAGE_DEPLOYMENT = "npr-stage"  # the deployment gpu stages are dispatched to (flows/pipeline.py)

SectionT = TypeVar("SectionT", bound=BaseModel)


class PipelineConfig(StrictModel):
    """Everything in params.yaml."""

    profile: str
    schema_name: Literal["npr", "multiverse", "parallel_r1"] = "npr"
    # What the tokens after a parallel block see of its branches (components.structure.merge): isolated
    # (NPR's: the branches as generated, at shared positions) or reread (the merge re-reads the branches as
    # sequential text, what a stock SGLang/vLLM server does). The parallel SFT, the RL trainer and every
    # parallel decode follow it; docs/architecture.md, "Merge semantics".
    merge_semantics: MergeSemantics = "isolated"
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
        listed = sorted(set(self.evaluate.parallel_checkpoints) & set(parallel_r1_stages()))
        if listed:
            raise ValueError(
                f"evaluate.parallel_checkpoints lists {listed}: the Parallel-R1 checkpoints decode as "
                "parallel_r1.attention says (unseen: parallel, seen: sequential); remove them there"
            )
        overridden = sorted(set(self.evaluate.prompt_style_overrides) & set(parallel_r1_stages()))
        if overridden:
            raise ValueError(
                f"evaluate.prompt_style_overrides names {overridden}: the Parallel-R1 checkpoints are always "
                "prompted with prompts.parallel_r1_instruction; remove them there"
            )
        return self

    @model_validator(mode="after")
    def _cross_checks(self) -> PipelineConfig:
        problems = cross_field_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self

    def sections(self, kind: type[SectionT] | tuple[type[SectionT], ...]) -> dict[str, SectionT]:
        """This config's sections of type ``kind`` (``sections_of``: the stage table), by name, in field
        order: the typed way to go over the RL stages (``cfg.sections(RLStageConfig)``) and the like."""
        return {name: getattr(self, name) for name in sections_of(kind)}

    def section(self, stage: str) -> BaseModel | None:
        """The section of pipeline stage ``stage`` (None for a name that is not a stage's)."""
        return self.sections(STAGE_SECTION_TYPES).get(stage)

    def schema_of(self, stage: str) -> str:
        """The structure schema of a stage's traces (and of the checkpoint it writes): the stage section's
        own (Parallel-R1's stages: ``parallel_r1``) or the pipeline's ``schema_name``."""
        # the section's type says it (a class constant), so no section value is read
        field = PipelineConfig.model_fields.get(stage)
        return getattr(field.annotation if field else None, "SCHEMA", None) or self.schema_name

    def decode_mode_of(self, checkpoint: str) -> Literal["parallel", "sequential"]:
        """How ``evaluate`` decodes a checkpoint: the Parallel-R1 ones per ``parallel_r1.attention``, the
        others per ``evaluate.parallel_checkpoints``."""
        if checkpoint in parallel_r1_stages():
            return self.parallel_r1.mode
        return self.evaluate.mode_for(checkpoint)

    def prompt_style_of(self, checkpoint: str) -> str:
        """The instruction ``evaluate`` prompts a checkpoint with (its training instruction)."""
        if checkpoint in parallel_r1_stages():
            return self.parallel_r1.PROMPT_STYLE
        return self.evaluate.prompt_style_for(checkpoint)

    def engine_settings_of(self, checkpoint: str, *, evaluation: bool = False) -> dict[str, Any]:
        """Extra engine settings of a checkpoint's decoding (Parallel-R1's paths per block, and with
        ``evaluation`` its evaluation budget), else none."""
        if checkpoint not in parallel_r1_stages():
            return {}
        pr1 = self.parallel_r1
        return pr1.evaluation_settings() if evaluation else pr1.engine_settings()


# The stage table. Stage names live in dvc.yaml and in the sections of PipelineConfig above, nowhere else
# (tests/unit/core/test_stage_table.py); a stage's kind is its section's type (PR1RLConfig is an
# RLStageConfig), so a new RL stage is one field here and one entry in dvc.yaml.
# The section types that are pipeline stages (the rest of PipelineConfig is shared settings).
STAGE_SECTION_TYPES: tuple[type, ...] = (
    SampleOrzConfig,
    SeedConfig,
    RLStageConfig,
    DistillConfig,
    RejectFilterConfig,
    SFTStageConfig,
    EvaluateConfig,
)


def sections_of(kind: type | tuple[type, ...]) -> tuple[str, ...]:
    """The sections of PipelineConfig whose type is ``kind`` (or a subclass of it), in field order."""
    return tuple(
        name
        for name, info in PipelineConfig.model_fields.items()
        if isinstance(info.annotation, type) and issubclass(info.annotation, kind)
    )


def pipeline_stages() -> tuple[str, ...]:
    """Every stage of the pipeline (dvc.yaml's stages), in the order the config declares them."""
    return sections_of(STAGE_SECTION_TYPES)


def rl_stages() -> tuple[str, ...]:
    """The RL stages (an RLStageConfig section): the stages that run a local or verl RL trainer."""
    return sections_of(RLStageConfig)


def sft_stages() -> tuple[str, ...]:
    """The SFT stages (an SFTStageConfig section); ``seed`` trains too, but by its own recipe."""
    return sections_of(SFTStageConfig)


# The section types of the stages that only sample from a model (their section has the engine's ``generation``).
DECODE_KINDS: tuple[type[BaseModel], ...] = (DistillConfig, EvaluateConfig)


def decode_stages() -> tuple[str, ...]:
    """The stages that only sample from a model (``DECODE_KINDS``)."""
    return sections_of(DECODE_KINDS)


def model_stages() -> tuple[str, ...]:
    """The stages that write a model (``artifacts/<stage>/model``): seed and every SFT and RL stage."""
    return sections_of((SeedConfig, SFTStageConfig, RLStageConfig))


def parallel_r1_stages() -> tuple[str, ...]:
    """The Parallel-R1 recipe's stages, whose checkpoints decode and are prompted per ``parallel_r1``."""
    return sections_of((PR1ColdStartConfig, PR1RLConfig))


# The section types whose seeds drive training: every RL and SFT stage (rollout sampling, data order and
# selection, init) and distillation's sampling. Not ``sample_orz`` (the problems and the test split stay
# the same), not ``seed`` (the committed seed model's recipe), not ``evaluate`` (its sampling stays fixed,
# so that the spread of a retrained run is the training's).
TRAINING_SEED_KINDS: tuple[type[BaseModel], ...] = (RLStageConfig, SFTStageConfig, DistillConfig)


def training_seed_sections() -> tuple[str, ...]:
    """The sections whose seeds drive training (``TRAINING_SEED_KINDS``)."""
    return sections_of(TRAINING_SEED_KINDS)


def _seed_fields(model: BaseModel, prefix: str) -> dict[str, int]:
    """Every int field named ``seed`` of ``model`` and the models inside it, by key path."""
    out: dict[str, int] = {}
    for name, info in type(model).model_fields.items():
        if info.exclude:  # derived by PipelineConfig, not a params.yaml key
            continue
        value = getattr(model, name)
        if name == "seed" and isinstance(value, int) and not isinstance(value, bool):
            out[f"{prefix}.{name}"] = value
        elif isinstance(value, BaseModel):
            out.update(_seed_fields(value, f"{prefix}.{name}"))
    return out


def training_seeds(cfg: PipelineConfig) -> dict[str, int]:
    """The seeds of one training run, by key path: ``run.seed`` (every stage's torch seed) and each seed of
    the ``training_seed_sections``. ``run.seed`` is left out when the seed stage builds the seed model from
    it (``models.base_model: tiny``): shifting it would retrain the seed model, whose recipe stays fixed."""
    seeds = {} if cfg.models.base_model == "tiny" else {"run.seed": cfg.run.seed}
    for name, section in cfg.sections(TRAINING_SEED_KINDS).items():
        seeds.update(_seed_fields(section, name))
    return seeds


def training_seed_overrides(cfg: PipelineConfig, offset: int) -> list[str]:
    """``--set`` overrides (``key=value``) that shift every training seed by ``offset``: the same recipe,
    problems and evaluation, another training run (``benchmarks/bench_recipe.py --seeds``). 0 = none."""
    if offset < 0:
        raise ValueError(f"a seed offset must be >= 0 (seeds are non-negative), got {offset}")
    if offset == 0:
        return []
    return [f"{key}={value + offset}" for key, value in training_seeds(cfg).items()]


def _generation_lengths(cfg: PipelineConfig) -> dict[str, int]:
    """Every ``max_new_tokens`` of the config, by key path."""
    out = {"seed.max_new_tokens": cfg.seed.max_new_tokens}
    out.update({f"{s}.max_new_tokens": sc.max_new_tokens for s, sc in cfg.sections(RLStageConfig).items()})
    out["distill.generation.max_new_tokens"] = cfg.distill.generation.max_new_tokens
    out["evaluate.generation.max_new_tokens"] = cfg.evaluate.generation.max_new_tokens
    if cfg.parallel_r1.max_new_tokens is not None:
        out["parallel_r1.max_new_tokens"] = cfg.parallel_r1.max_new_tokens
    return out


def _merge_problems(cfg: PipelineConfig) -> list[str]:
    """Under ``reread`` every parallel decode must re-read its merges (``merge_mode: reprefill``, no isolated-
    merge plugin): a shared-KV merge would sample the ``isolated`` policy the checkpoints were not trained to be."""
    if cfg.merge_semantics != "reread":
        return []
    plugin = [
        key
        for key, gen in (
            ("distill.generation", cfg.distill.generation),
            ("evaluate.generation", cfg.evaluate.generation),
        )
        if gen.sglang_isolated_merge
    ]
    if plugin:
        return [
            f"merge_semantics 'reread' cannot be served by SGLang's isolated-merge plugin: set "
            f"{', '.join(k + '.sglang_isolated_merge' for k in plugin)} to false"
        ]
    modes = {
        f"{s}.merge_mode": sc.merge_mode
        for s, sc in cfg.sections(RLStageConfig).items()
        if sc.engine_mode == "parallel"
    }
    if cfg.distill.generation.mode == "parallel":
        modes["distill.generation.merge_mode"] = cfg.distill.generation.merge_mode
    if cfg.evaluate.parallel_checkpoints or cfg.parallel_r1.mode == "parallel":
        modes["evaluate.generation.merge_mode"] = cfg.evaluate.generation.merge_mode
    wrong = sorted(k for k, mode in modes.items() if mode != "reprefill")
    if not wrong:
        return []
    return [
        f"merge_semantics 'reread' needs every parallel decode to re-read its merges: set {', '.join(wrong)} "
        "to reprefill (shared_kv samples the isolated merge)"
    ]


def _evaluate_name_problems(cfg: PipelineConfig) -> list[str]:
    """``evaluate``'s per-checkpoint keys may name a model stage left out of this run's checkpoints (narrowed
    with -S), not a name that is no stage's (a typo)."""
    known = set(cfg.evaluate.checkpoints) | set(model_stages())
    named = {
        "evaluate.prompt_style_overrides": cfg.evaluate.prompt_style_overrides,
        "evaluate.speedup.checkpoints": cfg.evaluate.speedup.checkpoints or (),
        "evaluate.recipe_names": cfg.evaluate.recipe_names,
    }
    return [
        f"{key} {unknown} name neither a checkpoint nor a model stage"
        for key, names in named.items()
        if (unknown := sorted(set(names) - known))
    ]


def cross_field_problems(cfg: PipelineConfig) -> list[str]:
    """Rules that tie keys together, each problem naming its keys (empty when the config is consistent)."""
    problems = []
    tiny = cfg.models.tiny
    if cfg.models.base_model == "tiny" and tiny is None:
        problems.append("models.tiny: models.base_model is 'tiny' but the tiny architecture is not set")
    if tiny is not None:
        # the tiny architecture is the model's whether the stage builds it (base_model: tiny) or
        # materialises the committed checkpoint that was built from it (models/tiny-instruct)
        limit = tiny.max_position_embeddings
        for key, n in _generation_lengths(cfg).items():
            if n >= limit:  # the prompt needs at least one position too
                problems.append(
                    f"{key}={n} leaves no room for the prompt within models.tiny.max_position_embeddings={limit}"
                )
        lengths = {"seed.max_length": cfg.seed.max_length}
        lengths.update({f"{s}.max_length": sc.max_length for s, sc in cfg.sections(SFTStageConfig).items()})
        for key, n in lengths.items():
            if n > limit:
                problems.append(f"{key}={n} exceeds models.tiny.max_position_embeddings={limit}")
    for stage, sc in cfg.sections(RLStageConfig).items():
        if sc.engine_mode == "parallel" and not sc.structural_filter:
            problems.append(f"{stage}.engine_mode 'parallel' needs {stage}.structural_filter: true")
    problems += _merge_problems(cfg)
    problems += _evaluate_name_problems(cfg)
    # verl's own rules (GPU counts, batch splits, tensor parallelism) are checked by running verl's
    # validation on the job (components.training.verl.validate.validate_job), not re-implemented here
    return problems


def gpu_pool_size(prefect_file: Path = PREFECT_FILE) -> int | None:
    """GPUs a job of the gpu pool gets (``gpu_count`` of the npr-stage deployment in prefect.yaml)."""
    if not prefect_file.exists():
        return None
    data = load_yaml_text(prefect_file.read_text(), str(prefect_file)) or {}
    for dep in data.get("deployments") or []:
        if isinstance(dep, dict) and dep.get("name") == GPU_STAGE_DEPLOYMENT:
            count = ((dep.get("work_pool") or {}).get("job_variables") or {}).get("gpu_count")
            return int(count) if isinstance(count, int) else None
    return None


def check_workspace(cfg: PipelineConfig, source: str, root: Path | None = None) -> None:
    """Rules about the checkout the config runs in (paths are relative to it, as the stages read them):
    the instruction files exist, and no gpu stage needs more GPUs than a gpu-pool job gets."""
    root = Path(root) if root is not None else Path.cwd()
    problems = []
    for key in ("parallel_instruction", "sequential_instruction"):
        path = getattr(cfg.prompts, key)
        if not (root / path).is_file():
            problems.append(f"prompts.{key}: file {path} does not exist")
    pool = gpu_pool_size(root / PREFECT_FILE)
    if pool is not None:
        for stage in cfg.orchestration.gpu_stages:
            need = getattr(cfg.section(stage), "nproc_per_node", None)
            if need is not None and need > pool:
                problems.append(
                    f"{stage}.nproc_per_node={need} but a job of the gpu pool gets {pool} GPUs "
                    f"(gpu_count of the {GPU_STAGE_DEPLOYMENT} deployment in {PREFECT_FILE})"
                )
    if problems:
        raise ConfigError(f"{source}: " + "; ".join(problems))


def _format_errors(err: ValidationError, source: str) -> str:
    """One line: the file, then every key path with what is wrong with it."""
    parts = []
    for e in err.errors():
        path = ".".join(str(p) for p in e["loc"])
        msg = e["msg"].removeprefix("Value error, ")
        got = f" (got {e['input']!r})" if "input" in e and not isinstance(e["input"], dict) else ""
        parts.append(f"{path}: {msg}{got}" if path else msg)
    return f"invalid config in {source}: " + "; ".join(parts)


def parse_override(text: str) -> tuple[list[str], Any]:
    """Parse ``a.b.c=value``; the value is read as YAML so numbers/bools/lists keep their types."""
    if "=" not in text:
        raise ConfigError(f"override {text!r} must look like key.path=value")
    key, raw = text.split("=", 1)
    if not key.strip():
        raise ConfigError(f"override {text!r} has an empty key")
    return key.strip().split("."), load_yaml_text(raw, f"override {text!r}")


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Apply dotted overrides in place; an unknown path is left for validation to reject by name."""
    for text in overrides:
        path, value = parse_override(text)
        node = data
        for i, part in enumerate(path[:-1]):
            if part not in node:
                node[part] = {}
            elif not isinstance(node[part], dict):
                where = ".".join(path[: i + 1])
                raise ConfigError(f"override {text!r}: {where} is a value, not a section")
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
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise ConfigError(f"{path}: not UTF-8 text (byte {err.start})") from None
    data = load_yaml_text(text, str(path))
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return data


def profile_path(profile: str, configs_dir: Path | None = None) -> Path:
    configs_dir = configs_dir or CONFIGS_DIR
    path = configs_dir / f"{profile}.yaml"
    if not path.exists():
        known = sorted(p.stem for p in configs_dir.glob("*.yaml"))
        raise ConfigError(f"unknown profile {profile!r}; known profiles: {', '.join(known)}")
    return path


# A profile file may start from another: ``base: qwen3-4b`` at its top level deep-merges the file over the
# base profile (itself possibly an overlay). Hardware variants of one recipe (8xH100, one GPU, a CPU
# rehearsal) then say only what they change, and the merged result is validated like any profile.
BASE_KEY = "base"


def deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """``overlay`` over ``base``: mappings merge key by key, anything else (a value, a list) replaces the
    base's whole, so a list in an overlay is the list (no element-wise merge to guess about)."""
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def read_profile(profile: str, configs_dir: Path | None = None) -> dict[str, Any]:
    """The profile's data with its ``base`` chain resolved (before validation). An overlay names itself
    (``profile:`` equal to its file name, so params.yaml never carries the base's name); an unknown base,
    a base that is not a name, or a cycle is a ConfigError naming the files."""
    configs_dir = configs_dir or CONFIGS_DIR
    chain: list[str] = []
    data: dict[str, Any] | None = None
    name = profile
    layers: list[dict[str, Any]] = []
    while True:
        if name in chain:
            raise ConfigError(f"profile {profile!r}: base cycle {' -> '.join([*chain, name])}")
        chain.append(name)
        path = profile_path(name, configs_dir)
        layer = read_yaml(path)
        layers.append(layer)
        if BASE_KEY not in layer:
            break
        base = layer.pop(BASE_KEY)
        if not isinstance(base, str) or not base:
            raise ConfigError(
                f"{path}: {BASE_KEY} must name a profile (a file in {configs_dir}), got {base!r}"
            )
        if layer.get("profile") != name:
            raise ConfigError(
                f"{path}: an overlay must name itself: set profile: {name} (it would inherit {base!r})"
            )
        if not (configs_dir / f"{base}.yaml").exists():
            known = sorted(p.stem for p in configs_dir.glob("*.yaml"))
            raise ConfigError(
                f"{path}: unknown {BASE_KEY} profile {base!r}; known profiles: {', '.join(known)}"
            )
        name = base
    for layer in reversed(layers):
        data = layer if data is None else deep_merge(data, layer)
    assert data is not None  # the loop read at least the profile's own file
    return data


def profile_names(configs_dir: Path | None = None) -> list[str]:
    """Every profile (a file of ``configs/``, overlays included), sorted."""
    return sorted(p.stem for p in (configs_dir or CONFIGS_DIR).glob("*.yaml"))


def gpu_profiles(configs_dir: Path | None = None) -> list[str]:
    """The profiles whose stages run on GPUs (``orchestration.gpu_stages`` not empty)."""
    names = profile_names(configs_dir)
    return [n for n in names if validate_config(read_profile(n, configs_dir), n).orchestration.gpu_stages]


def load_config(
    path: Path | str = PARAMS_FILE,
    profile: str | None = None,
    overrides: list[str] | None = None,
    root: Path | None = None,
) -> PipelineConfig:
    """Load params.yaml, or a profile file when ``profile`` is given, apply overrides, validate (the
    workspace checks are relative to ``root``, by default the current directory: the checkout stages run
    in; a script run from elsewhere names the checkout)."""
    source = profile_path(profile) if profile else Path(path)
    data = apply_overrides(read_profile(profile) if profile else read_yaml(source), overrides or [])
    cfg = validate_config(data, str(source))
    check_workspace(cfg, str(source), root)
    return cfg


def load_orchestration(root: Path | None = None) -> OrchestrationConfig:
    """The orchestration section of ``root``'s params.yaml (``npr server`` / ``npr worker``), or its defaults
    when there is no params.yaml yet."""
    params = (root or Path(".")) / PARAMS_FILE
    if not params.exists():
        return OrchestrationConfig()
    return load_config(params).orchestration


def materialise_profile(
    profile: str, overrides: list[str] | None = None, dest: Path = PARAMS_FILE
) -> PipelineConfig:
    """Write the validated profile (plus overrides) to params.yaml; returns the config written."""
    return write_params(load_config(profile=profile, overrides=overrides), dest)


def override_params(overrides: list[str], dest: Path = PARAMS_FILE) -> PipelineConfig:
    """Apply overrides to params.yaml as it is (hand edits and `dvc exp run -S` values stay)."""
    return write_params(load_config(dest, overrides=overrides), dest)


def write_params(cfg: PipelineConfig, dest: Path = PARAMS_FILE) -> PipelineConfig:
    """params.yaml := ``cfg`` (atomically; untouched when it already says exactly that)."""
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
