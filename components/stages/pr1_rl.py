"""Stage `pr1_rl` (Parallel-R1's RL): GRPO from the cold start on the hard problems.

Training problems (``components.data.pr1_problems``): ``sample_orz``'s train split restricted to
``pr1_rl.problems.difficulties`` (tiny), or DAPO-17k-style files through the quality gate (GPU profile);
held out: ``sample_orz``'s test split. The reward is ``accuracy`` or the alternating
``accuracy_parallel_interv`` (``components.grading.rewards``: it reads the training step); rollouts are
native parallel (fork at ``<Parallel>`` into ``parallel_r1.paths`` paths, ``attention: unseen``) or one
sequential stream (``seen``), with the matching loss mask (``config.ParallelR1Config``); the job's schema and
paths per block are Parallel-R1's (``PipelineConfig.schema_of`` / ``engine_settings_of``). The recipe itself
is ``components.training.rl`` (local trainer, or a verl job when ``pr1_rl.backend: verl``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.data.pr1_problems import training_problems
from components.training.job import RLPaths, rl_job
from components.training.rl import train_rl


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    section = cfg.pr1_rl  # rollout mode and structural filter follow parallel_r1.attention (components.config)
    # starts from Parallel-R1's cold start (pr1_rl.init_from: pr1_coldstart)
    job = rl_job("pr1_rl", cfg, RLPaths.of(io, section.init_from))
    # trains GRPO on the problems pr1_rl.problems names (tiny: the hard ones of the train split)
    train, provenance, report = training_problems(section.problems, io.input("sample_orz/problems"))
    # writes Parallel-R1 to pr1_rl/model (checkpoints and the per-step log in pr1_rl/work)
    metrics = train_rl(job, train_problems=train)
    data = {**provenance, "n_train": len(train)}
    if report is not None:
        data["quality"] = {k: v for k, v in report.reconciliation().items() if k != "expectations"}
    return {"attention": cfg.parallel_r1.attention, "reward": section.reward, "problems": data, **metrics}
