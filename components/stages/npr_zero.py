"""Stage `npr_zero`: NPR-Zero (NPR Stage 1): DAPO with the format-aware Stage-1 reward, sequential rollouts, from the seed model.

The recipe is ``components.training.rl`` (local trainer, or a verl job when ``npr_zero.backend: verl``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.training.rl import run_rl_stage


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    return run_rl_stage("npr_zero", cfg, io)
