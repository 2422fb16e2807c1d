"""The warmups' SFT as one function: the body of ``parallel_warmup``, ``sequential_warmup`` and ``pr1_coldstart``.

A warmup stage builds its job once: its stage file calls ``warmup_job(stage, cfg, WarmupPaths.of(io,
init_from))``, which reads the stage's section (an ``SFTStageConfig``) and the shared settings the SFT
trains with (schema, merge semantics, prompts, run, models, W&B settings) into a frozen ``WarmupJob``.
``train_warmup(job, records)`` takes only that job and the records.

``train_warmup`` starts from ``job.paths.starts_from``, makes the schema's tags single tokens
(``add_tag_tokens``), re-renders each prompt with ``render_prompt`` (the engine's prompt), normalises each
response to the canonical layout, and trains with ``components.training.sft``. Every record that could not
be used is written to ``work/rejections.jsonl`` and counted in the metrics by reason.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel

from components.artifacts import atomic_dir, write_jsonl
from components.dag import StageIO
from components.models.config import ModelsConfig
from components.models.tags import add_tag_tokens
from components.ops.config import TrackingConfig
from components.prompts import PromptConfig
from components.settings import ConfigError, RunConfig
from components.structure import TagIds
from components.structure.merge import MergeSemantics
from components.training.config import SFTStageConfig
from components.training.distributed import DistContext, full_model_state
from components.training.sft_data import prepare_examples


class WarmupJobConfig(Protocol):
    """What a warmup's job is built from. The config is components.config.PipelineConfig, a floor above this
    package, so the builder names what it reads: the stage's section (looked up by name), the schema of its
    traces, the merge semantics its parallel mask trains in, the prompts it renders, the run settings
    (device, precision), the model settings it loads with and the W&B settings of the stage's run."""

    @property
    def merge_semantics(self) -> MergeSemantics: ...

    @property
    def run(self) -> RunConfig: ...

    @property
    def models(self) -> ModelsConfig: ...

    @property
    def prompts(self) -> PromptConfig: ...

    @property
    def tracking(self) -> TrackingConfig: ...

    def section(self, stage: str) -> BaseModel | None: ...

    def schema_of(self, stage: str) -> str: ...


@dataclass(frozen=True)
class WarmupPaths:
    """Where a warmup reads its model and writes (its ``StageIO``, resolved from dvc.yaml)."""

    starts_from: Path  # ``<init_from>/model``
    writes: Path  # the trained model, written atomically
    work_dir: Path  # checkpoints, the step log, the rejections, the W&B run id (not a DVC out)

    @classmethod
    def of(cls, io: StageIO, init_from: str) -> WarmupPaths:
        """A warmup's paths from its ``StageIO``: the ``model`` of the stage it starts from, its own
        ``model`` and the work dir beside it."""
        model = Path(io.output("model"))
        return cls(starts_from=io.input(f"{init_from}/model"), writes=model, work_dir=model.parent / "work")


@dataclass(frozen=True)
class WarmupJob:
    """One warmup stage, as ``train_warmup`` reads it; built by ``warmup_job``."""

    stage: str  # names the W&B run (one per stage) and the step log's stage
    section: SFTStageConfig  # its mode, prompt style, recipe and ``init_from``
    schema: str  # the structure schema of the traces (and of the checkpoint it writes)
    merge_semantics: MergeSemantics  # what post-merge tokens see in the parallel mask
    prompts: PromptConfig
    run: RunConfig  # device, dtype and compute precision (``run.autocast``)
    models: ModelsConfig  # how the starting model is loaded, the embedding padding of new tags
    # the stage's W&B run: inside ``run_stage`` it is already open (with the whole config recorded) and the
    # SFT logs into it; only its mode and project are read here
    tracking: TrackingConfig
    paths: WarmupPaths


def warmup_job(stage: str, cfg: WarmupJobConfig, paths: WarmupPaths) -> WarmupJob:
    """``stage``'s job: its section (which must be an SFT stage's) and the shared settings it trains with,
    read once; ``paths``: where it reads and writes."""
    section = cfg.section(stage)
    if not isinstance(section, SFTStageConfig):
        raise ConfigError(f"{stage!r} is not an SFT warmup stage (its section is {type(section).__name__})")
    return WarmupJob(
        stage=stage,
        section=section,
        schema=cfg.schema_of(stage),
        merge_semantics=cfg.merge_semantics,
        prompts=cfg.prompts,
        run=cfg.run,
        models=cfg.models,
        tracking=cfg.tracking,
        paths=paths,
    )


# Printed in the metrics so a reader sees how few rejections are listed there (all are in the file).
REJECTION_EXAMPLES_IN_METRICS = 5


def train_warmup(job: WarmupJob, records: list[dict[str, Any]]) -> dict[str, Any]:
    """SFT ``job.paths.starts_from`` on trajectory ``records`` (``{problem, response, ...}``) of the job's
    schema per its section (mode and prompt style): the body of the warmups and of ``pr1_coldstart``."""
    from components.models.loading import load_model, resolve_device, save_model  # lazy: transformers
    from components.training.sft import EpochSource, SFTSettings  # lazy: transformers
    from components.training.sft_run import train_sft_in_stage_run  # lazy: transformers

    section, paths = job.section, job.paths
    ctx = DistContext.from_env(resolve_device(job.run))
    model, tokenizer = load_model(paths.starts_from, job.models, job.run, for_training=True)
    tag_ids = add_tag_tokens(model, tokenizer, job.schema, job.models.pad_embeddings_to_multiple_of)
    data = prepare_examples(
        records,
        tokenizer,
        job.prompts,
        mode=section.mode,
        prompt_style=section.prompt_style,
        schema_name=job.schema,
        max_length=section.max_length,
    )
    work = paths.work_dir
    if ctx.is_main:
        work.mkdir(parents=True, exist_ok=True)
        write_jsonl(work / "rejections.jsonl", (asdict(r) for r in data.rejections))
    if not data.examples:
        raise ValueError(
            f"no usable SFT example among {len(records)} accepted records: {data.summary()['rejected_by_reason']}"
            f" (details in {work / 'rejections.jsonl'})"
        )
    settings = SFTSettings.from_stage_config(
        section, len(data.examples), job.run.autocast, job.merge_semantics
    )
    tags = TagIds.from_tokenizer(tokenizer, job.schema) if section.mode == "parallel" else None
    source = EpochSource(data.examples, settings.examples_per_step, section.seed)
    result = train_sft_in_stage_run(
        job.tracking, job.stage, work, model, source, settings,
        pad_id=tokenizer.pad_token_id, tags=tags, ctx=ctx,
    )
    # under FSDP the weights are gathered to rank 0 (a collective call), which alone writes the model
    state = full_model_state(model) if ctx.active else None
    if ctx.is_main:
        with atomic_dir(paths.writes) as tmp:
            save_model(model, tokenizer, tmp, state_dict=state)
    return {
        "mode": section.mode,
        "init_from": section.init_from,
        "tag_ids": tag_ids,
        **data.summary(),
        "rejection_examples": [asdict(r) for r in data.rejections[:REJECTION_EXAMPLES_IN_METRICS]],
        **result.summary(),
    }
