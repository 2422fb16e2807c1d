"""Stage `pr1_rl` (Parallel-R1's RL): GRPO from the cold start on the hard problems.

Training problems (``components.data.pr1_problems``): ``sample_orz``'s train split restricted to
``pr1_rl.problems.difficulties`` (tiny), or DAPO-17k-style files through the quality gate (GPU profile);
held out: ``sample_orz``'s test split. The reward is ``accuracy`` or the alternating
``accuracy_parallel_interv`` (``components.grading.rewards``: it reads the training step); rollouts are
native parallel (fork at ``<Parallel>`` into ``parallel_r1.paths`` paths, ``attention: unseen``) or one
sequential stream (``seen``), with the matching loss mask (``config.ParallelR1Config``). The
recipe itself is ``components.training.rl`` (local trainer, or a verl job when ``pr1_rl.backend: verl``).
"""

from __future__ import annotations

from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.data.pr1_problems import training_problems
from components.training.rl import run_rl_stage


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    section = cfg.pr1_rl  # rollout mode and structural filter follow parallel_r1.attention (components.config)
    train, provenance, report = training_problems(section.problems, io.input("sample_orz/problems"))
    metrics = run_rl_stage(
        "pr1_rl",
        cfg,
        io,
        schema=cfg.schema_of("pr1_rl"),
        generation=cfg.parallel_r1.engine_settings(),
        train_problems=train,
    )
    data = {**provenance, "n_train": len(train)}
    if report is not None:
        data["quality"] = {k: v for k, v in report.reconciliation().items() if k != "expectations"}
    return {"attention": cfg.parallel_r1.attention, "reward": section.reward, "problems": data, **metrics}
