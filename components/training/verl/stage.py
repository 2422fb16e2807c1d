"""An RL stage through verl's own trainer: launch ``main_ppo`` on Ray, then merge its checkpoint.

``run_verl_stage`` is what ``components.training.rl.run_rl_stage`` calls for ``<stage>.backend: verl``.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import torch


def run_verl_stage(
    stage: str,
    cfg: Any,
    init_dir: Path,
    problems_dir: Path,
    out_dir: Path,
    work_dir: Path,
    train_problems: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """GPU path: run verl's trainer on Ray, then merge its last FSDP checkpoint into the stage's HF output.

    Where it runs (``components.training.verl.ray_cluster``): with ``verl.ray_address: null`` this process starts
    a Ray head on its node and stops it afterwards (paths are this node's); inside a job submitted to a
    running cluster (the npr-stage flow's path for ``ray_address``) the driver attaches to that cluster and
    every path it hands verl is under ``verl.shared_dir``, which all nodes mount.
    """
    import shutil
    import sys

    import yaml

    from components.artifacts import atomic_dir
    from components.training.verl import ray_cluster
    from components.training.verl.launch import VERL_ENTRY_MODULE, prepare_launch, runtime_env

    v = getattr(cfg, stage).verl
    inside = ray_cluster.inside_submitted_job()
    if v.ray_address and not inside:
        raise RuntimeError(
            f"{stage} attaches to the Ray cluster at {v.ray_address} ({stage}.verl.ray_address): run it "
            "through the pipeline (npr run / the npr-stage flow), which submits it there as a Ray job and "
            "restores its outputs from the DVC run-cache; `npr stage` alone cannot"
        )
    if inside:
        if not v.shared_dir:
            raise RuntimeError(f"{stage} runs on a Ray cluster but {stage}.verl.shared_dir is not set")
        run_dir = Path(v.shared_dir) / "npr" / stage / os.environ.get("NPR_PIPELINE_RUN_ID", "run") / "verl"
        shared_model = run_dir / "inputs" / "model"
        if not shared_model.exists():  # every node reads the starting model from the shared filesystem
            shutil.copytree(init_dir, shared_model)
        init_dir = shared_model
    else:
        run_dir = work_dir / "verl"
    _, overrides_file = prepare_launch(
        stage, cfg, init_dir, problems_dir, run_dir, train_problems=train_problems
    )
    overrides = yaml.safe_load(Path(overrides_file).read_text())["overrides"]
    entry = os.environ.get("NPR_VERL_ENTRY_MODULE", VERL_ENTRY_MODULE)  # a stand-in trainer in tests
    argv = [sys.executable, "-m", entry, *overrides]
    env = dict(os.environ)
    env.update(
        {
            k: v_
            for k, v_ in runtime_env(getattr(cfg, stage), cfg.schema_of(stage))["env_vars"].items()
            if k not in ray_cluster.NOT_FORWARDED
        }
    )
    log = run_dir / "driver.log"
    if inside:
        returncode = ray_cluster.run_driver(argv, "auto", env, log)
    else:
        with ray_cluster.RayHead.start(v.ray_head_host, env=env, **head_resources(v)) as head:
            returncode = ray_cluster.run_driver(argv, head.address, head.env, log)
    if returncode != 0:
        raise RuntimeError(
            f"verl job for {stage} failed with exit code {returncode}: {log} ({overrides_file})"
        )
    steps = sorted(
        (run_dir / "checkpoints").glob("global_step_*"), key=lambda p: int(p.name.rsplit("_", 1)[1])
    )
    if not steps:
        raise RuntimeError(f"verl job for {stage} finished without a checkpoint in {run_dir / 'checkpoints'}")
    with atomic_dir(out_dir) as tmp:
        merge = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
        merge += ["--local_dir", str(steps[-1] / "actor"), "--target_dir", str(tmp)]
        subprocess.run(merge, check=True)
    return {
        "backend": "verl",
        "ray": "cluster " + str(v.ray_address) if inside else f"own head on {v.ray_head_host}",
        "steps": int(steps[-1].name.rsplit("_", 1)[1]),
        "overrides": str(overrides_file),
    }


# Logical CPUs a head on a CPU node declares: verl's job is ~12 actors (task runner, trainer ranks, rollout
# server, agent-loop and reward workers, TransferQueue units), most of them idle while one computes, and a
# Ray actor holds one CPU to be scheduled; the processes themselves run one torch thread each.
CPU_HEAD_LOGICAL_CPUS = 32


def head_resources(v: Any) -> dict[str, int]:
    """What a head the stage starts declares: the node's GPUs; on the CPU platform, one logical device
    slot per training rank (plugins.cpu_platform) and enough logical CPUs for verl's actors."""
    if v.device == "cpu":
        return {"num_gpus": v.n_gpus_per_node, "num_cpus": CPU_HEAD_LOGICAL_CPUS}
    return {"num_gpus": v.n_gpus_per_node if torch.cuda.is_available() else 0}
