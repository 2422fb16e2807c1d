"""Stage `npr_zero`: NPR-Zero (NPR Stage 1), the seed model taught the parallel format by RL alone.

DAPO (``components.training.rl``: clip-higher, dynamic sampling, the overlong penalty) on sequential rollouts
of the parallel-format prompt, rewarded by the format-aware Stage-1 reward (``grading.stage1``). Its model
is what ``distill`` samples trajectories from. ``npr_zero.backend: verl`` runs the same job through verl's
trainer (``components.training.verl.stage``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.training.job import RLPaths, rl_job
from components.training.rl import train_rl


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # starts from the instruct model (npr_zero.init_from: seed), which has never seen the parallel format
    job = rl_job("npr_zero", cfg, RLPaths.of(io, cfg.npr_zero.init_from))
    # trains DAPO on sample_orz's train split, evaluating on the held-out split every eval_every steps;
    # writes NPR-Zero to npr_zero/model (checkpoints and the per-step log in npr_zero/work)
    return train_rl(job)
