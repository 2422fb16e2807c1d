"""``train_sft`` as a stage runs it: inside the stage's W&B run, every step logged, the summary at the end.

The seed and both warmups train through here, so what a user sees in W&B for an SFT stage is the same
whichever stage it is. Under ``torchrun`` only rank 0 opens the run and logs.
"""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from components.ops.config import TrackingConfig
from components.tracking import stage_run, step_logger
from components.training.checkpoint import checkpoint_step, latest_checkpoint
from components.training.distributed import DistContext
from components.training.sft import SFTResult, SFTSettings, StepSource, train_sft


def train_sft_in_stage_run(
    tracking: TrackingConfig,
    stage: str,
    work: Path,
    model: torch.nn.Module,
    source: StepSource,
    settings: SFTSettings,
    *,
    pad_id: int,
    tags: Any = None,
    ctx: DistContext | None = None,
) -> SFTResult:
    """Run (or resume) ``train_sft`` in ``work`` (metrics to ``work/train_metrics.json``) inside one W&B run
    per stage, resumed with the stage; the run's summary gets the numeric fields of ``SFTResult.summary``.

    ``tracking`` is the W&B section only, as the RL trainer's: inside ``run_stage`` the stage's run is already
    open (recording the whole config) and this logs into it; a run opened here records no config."""
    ctx = ctx or DistContext()
    with stage_run(tracking, stage, work) if ctx.is_main else nullcontext() as tracker:
        if tracker is not None:  # W&B continues after the checkpoint train_sft resumes from
            newest = latest_checkpoint(work)
            tracker.resume_from(checkpoint_step(newest) if newest is not None else -1)
        result = train_sft(
            model,
            source,
            settings,
            work,
            pad_id=pad_id,
            tags=tags,
            metrics_path=work / "train_metrics.json",
            on_step=step_logger(tracker) if tracker is not None else None,
            ctx=ctx,
        )
        if tracker is not None:
            tracker.summary({k: v for k, v in result.summary().items() if isinstance(v, (int, float))})
    return result
