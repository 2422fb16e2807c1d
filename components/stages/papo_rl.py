"""Stage `papo_rl`: NPR (NPR Stage 3), NPR-Beta trained by PAPO on its own native parallel rollouts.

PAPO (``components.training.rl``, ``components.training.papo``): rollouts decoded by the native parallel
engine (fork at ``</guideline>``, merge at ``<takeaway>``), every rollout the canonical mask builder rejects
filtered out before it is scored (counted by reason), the Stage-3 reward (``grading.stage3``), strictly
on-policy updates with the parallel attention mask. ``papo_rl.backend: verl`` runs the same job through
verl's trainer (``components.training.verl.stage``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.training.job import RLPaths, rl_job
from components.training.rl import train_rl


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # starts from NPR-Beta (papo_rl.init_from: parallel_warmup), which already writes the parallel format
    job = rl_job("papo_rl", cfg, RLPaths.of(io, cfg.papo_rl.init_from))
    # trains PAPO on sample_orz's train split, evaluating on the held-out split every eval_every steps;
    # writes NPR to papo_rl/model (checkpoints, the step log and the filtered rollouts in papo_rl/work)
    return train_rl(job)
