"""Stage `sr_rl`: SR, the sequential baseline: SR-Beta trained by DAPO on sequential rollouts.

The same recipe as ``npr_zero`` (DAPO, Stage-1 reward; ``components.training.rl``) from the sequential
warm-up's model: the baseline the report sets beside NPR, trained by RL without the parallel engine.
``sr_rl.backend: verl`` runs the same job through verl's trainer (``components.training.verl.stage``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.training.job import RLPaths, rl_job
from components.training.rl import train_rl


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # starts from SR-Beta (sr_rl.init_from: sequential_warmup), fine-tuned causally on the same trajectories
    job = rl_job("sr_rl", cfg, RLPaths.of(io, cfg.sr_rl.init_from))
    # trains DAPO on sample_orz's train split, evaluating on the held-out split every eval_every steps;
    # writes SR to sr_rl/model (checkpoints and the per-step log in sr_rl/work)
    return train_rl(job)
