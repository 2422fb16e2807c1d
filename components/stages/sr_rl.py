"""Stage `sr_rl`: SR (the sequential baseline): DAPO from SR-Beta on the sequential format.

The recipe is ``components.training.rl`` (local trainer, or a verl job when ``sr_rl.backend: verl``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.training.rl import run_rl_stage


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    return run_rl_stage("sr_rl", cfg, io)
