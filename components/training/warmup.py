"""The warmups' SFT as one function: the body of ``parallel_warmup``, ``sequential_warmup`` and ``pr1_coldstart``.

``train_warmup`` starts from ``<init_from>/model``, makes the schema's tags single tokens
(``add_tag_tokens``), re-renders each prompt with ``render_prompt`` (the engine's prompt), normalises each
response to the canonical layout, and trains with ``components.training.sft``. Every record that could not
be used is written to ``work/rejections.jsonl`` and counted in the metrics by reason.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any, Protocol

from components.artifacts import atomic_dir, write_jsonl
from components.dag import StageIO
from components.models.config import ModelsConfig
from components.models.tags import add_tag_tokens
from components.prompts import PromptConfig
from components.settings import RunConfig
from components.structure import TagIds
from components.structure.merge import MergeSemantics
from components.tracking import TrackedConfig
from components.training.config import SFTStageConfig
from components.training.distributed import DistContext, full_model_state
from components.training.sft_data import prepare_examples


class WarmupJobConfig(TrackedConfig, Protocol):
    """What a warmup reads of the pipeline's config. That is components.config.PipelineConfig, a floor above
    this package, so it is named here by what the warmup uses: the run settings (device, precision), the
    model settings it loads with, the prompts it renders, the merge semantics its parallel mask trains in,
    and, for the stage's W&B run (``TrackedConfig``), the tracking section and the whole config."""

    @property
    def merge_semantics(self) -> MergeSemantics: ...

    @property
    def run(self) -> RunConfig: ...

    @property
    def models(self) -> ModelsConfig: ...

    @property
    def prompts(self) -> PromptConfig: ...


# Printed in the metrics so a reader sees how few rejections are listed there (all are in the file).
REJECTION_EXAMPLES_IN_METRICS = 5


def train_warmup(
    cfg: WarmupJobConfig, io: StageIO, section: SFTStageConfig, records: list[dict[str, Any]], schema_name: str
) -> dict[str, Any]:
    """SFT ``<init_from>/model`` on trajectory ``records`` (``{problem, response, ...}``) of ``schema_name``
    per ``section`` (its mode and prompt style): the body of the warmups and of ``pr1_coldstart``."""
    from components.models.loading import load_model, resolve_device, save_model  # lazy: transformers
    from components.training.sft import EpochSource, SFTSettings  # lazy: transformers
    from components.training.sft_run import train_sft_in_stage_run  # lazy: transformers

    ctx = DistContext.from_env(resolve_device(cfg.run))
    model, tokenizer = load_model(
        io.input(f"{section.init_from}/model"), cfg.models, cfg.run, for_training=True
    )
    tag_ids = add_tag_tokens(model, tokenizer, schema_name, cfg.models.pad_embeddings_to_multiple_of)
    data = prepare_examples(
        records,
        tokenizer,
        cfg.prompts,
        mode=section.mode,
        prompt_style=section.prompt_style,
        schema_name=schema_name,
        max_length=section.max_length,
    )
    work = Path(io.output("model")).parent / "work"
    if ctx.is_main:
        work.mkdir(parents=True, exist_ok=True)
        write_jsonl(work / "rejections.jsonl", (asdict(r) for r in data.rejections))
    if not data.examples:
        raise ValueError(
            f"no usable SFT example among {len(records)} accepted records: {data.summary()['rejected_by_reason']}"
            f" (details in {work / 'rejections.jsonl'})"
        )
    settings = SFTSettings.from_stage_config(
        section, len(data.examples), cfg.run.autocast, cfg.merge_semantics
    )
    tags = TagIds.from_tokenizer(tokenizer, schema_name) if section.mode == "parallel" else None
    source = EpochSource(data.examples, settings.examples_per_step, section.seed)
    result = train_sft_in_stage_run(
        cfg, io.stage, work, model, source, settings, pad_id=tokenizer.pad_token_id, tags=tags, ctx=ctx
    )
    # under FSDP the weights are gathered to rank 0 (a collective call), which alone writes the model
    state = full_model_state(model) if ctx.active else None
    if ctx.is_main:
        with atomic_dir(io.output("model")) as tmp:
            save_model(model, tokenizer, tmp, state_dict=state)
    return {
        "mode": section.mode,
        "init_from": section.init_from,
        "tag_ids": tag_ids,
        **data.summary(),
        "rejection_examples": [asdict(r) for r in data.rejections[:REJECTION_EXAMPLES_IN_METRICS]],
        **result.summary(),
    }
