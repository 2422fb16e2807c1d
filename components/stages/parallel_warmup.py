"""Stage `parallel_warmup` (NPR-Beta): SFT on the accepted trajectories with the parallel mask and positions.

Reads ``reject_filter/accepted`` (trajectory records, docs/architecture.md), starts from
``<init_from>/model`` and trains per ``parallel_warmup`` with ``components.training.warmup.train_warmup``
(tags as single tokens, the engine's prompt, responses in the canonical layout). Its sequential twin
(``sequential_warmup``) runs the same function with ``mode: sequential``. Every record that could not be
used is written to ``work/rejections.jsonl`` and counted in the metrics by reason.
"""

from __future__ import annotations

from typing import Any

from components.artifacts import read_shards
from components.config import PipelineConfig
from components.dag import StageIO
from components.training.warmup import WarmupPaths, train_warmup, warmup_job


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # NPR-Beta: starts from init_from's model (the seed), writes parallel_warmup/model (checkpoints, the step
    # log and the rejections in parallel_warmup/work)
    job = warmup_job("parallel_warmup", cfg, WarmupPaths.of(io, cfg.parallel_warmup.init_from))
    # the trajectories reject_filter accepted, trained with the parallel mask and positions (mode: parallel)
    records = read_shards(io.input("reject_filter/accepted"))
    return train_warmup(job, records)
