"""Stage `sequential_warmup` (SR-Beta): the sequential twin of `parallel_warmup`.

Same data, same prompts, same tokens, same recipe; only the attention is plain causal
(``sequential_warmup.mode: sequential``), so SR-Beta differs from NPR-Beta in nothing but parallel training.
"""

from __future__ import annotations

from typing import Any

from components.artifacts import read_shards
from components.config import PipelineConfig
from components.dag import StageIO
from components.training.warmup import WarmupPaths, train_warmup, warmup_job


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # SR-Beta: starts from init_from's model (the seed), writes sequential_warmup/model (checkpoints, the
    # step log and the rejections in sequential_warmup/work)
    job = warmup_job("sequential_warmup", cfg, WarmupPaths.of(io, cfg.sequential_warmup.init_from))
    # the same trajectories as parallel_warmup's, trained with plain causal attention (mode: sequential)
    records = read_shards(io.input("reject_filter/accepted"))
    return train_warmup(job, records)
