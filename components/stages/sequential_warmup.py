"""Stage `sequential_warmup` (SR-Beta): the sequential twin of `parallel_warmup`.

Same data, same prompts, same tokens, same recipe; only the attention is plain causal
(``sequential_warmup.mode: sequential``), so SR-Beta differs from NPR-Beta in nothing but parallel training.
"""

from __future__ import annotations

from typing import Any

from components.artifacts import read_shards
from components.config import PipelineConfig
from components.dag import StageIO
from components.training.warmup import train_warmup


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    records = read_shards(io.input("reject_filter/accepted"))
    return train_warmup(cfg, io, cfg.sequential_warmup, records, cfg.schema_name)
