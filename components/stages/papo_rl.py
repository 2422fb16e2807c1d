"""Stage `papo_rl`: NPR (Stage 3): PAPO from NPR-Beta, native parallel rollouts, structural filtering, Stage-3 reward.

The recipe is ``components.training.rl`` (local trainer, or a verl job when ``papo_rl.backend: verl``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.training.rl import run_rl_stage


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    return run_rl_stage("papo_rl", cfg, io)
