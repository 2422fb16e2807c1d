"""Stage `sequential_warmup` (SR-Beta): the sequential twin of `parallel_warmup`.

Same data, same prompts, same tokens, same recipe; only the attention is plain causal
(``sequential_warmup.mode: sequential``), so SR-Beta differs from NPR-Beta in nothing but parallel training.
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.stages.parallel_warmup import run_warmup


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    return run_warmup(cfg, io, cfg.sequential_warmup)
