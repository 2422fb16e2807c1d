"""Running a built verl job: on a Ray head the stage starts, inside a job submitted to a cluster, or (``npr verl
launch``) the stage submitted to the cluster at ``verl.ray_address``.

The job is built and validated before it gets here (``job.verl_job``, ``validate.validate_job``); this module
turns it into the driver's command and environment (``driver_argv``, ``driver_env``) and runs that driver
(``run_driver``: a head of its own, or the cluster a submitted job runs in). ``launch`` is the command line's:
it shows the validated job and, with a cluster address, submits the whole stage there, as the pipeline's
npr-stage flow does (``infra/ray/job.yaml``).
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path

import torch

from components.ops.launch import RAY_JOB_SPEC, load_spec
from components.settings import ConfigError
from components.training.config import VerlSettings
from components.training.job import RLJobConfig
from components.training.verl import ray_cluster, report
from components.training.verl.job import VERL_ENTRY_MODULE, VerlJob, build_job, ray_job_command, runtime_env
from components.training.verl.validate import validate_job

# Logical CPUs a head on a CPU node declares: verl's job is ~12 actors (task runner, trainer ranks, rollout
# server, agent-loop and reward workers, TransferQueue units), most of them idle while one computes, and a
# Ray actor holds one CPU to be scheduled; the processes themselves run one torch thread each.
CPU_HEAD_LOGICAL_CPUS = 32


def head_resources(v: VerlSettings) -> dict[str, int]:
    """What a head the stage starts declares: the node's GPUs; on the CPU platform, one logical device
    slot per training rank (plugins.cpu_platform) and enough logical CPUs for verl's actors."""
    if v.device == "cpu":
        return {"num_gpus": v.n_gpus_per_node, "num_cpus": CPU_HEAD_LOGICAL_CPUS}
    return {"num_gpus": v.n_gpus_per_node if torch.cuda.is_available() else 0}


def driver_argv(job: VerlJob, hydra_dir: Path, entry: str = VERL_ENTRY_MODULE) -> list[str]:
    """``python -m <entry> <the job's overrides>``, Hydra's own output folder (resolved config, log) in
    ``hydra_dir``: by default main_ppo writes outputs/<date>/<time> into the working directory, i.e. the
    user's checkout."""
    return [sys.executable, "-m", entry, *job.overrides, f"hydra.run.dir={Path(hydra_dir).resolve()}"]


def driver_env(job: VerlJob, attempt: int, attempt_log: Path) -> dict[str, str]:
    """This process's environment with the job's (its plugins, less what a Ray head must not inherit) and
    the attempt's report settings: verl's ``file`` logger path, the plugins' rollout records and their tag."""
    env = dict(os.environ)
    env.update({k: v for k, v in runtime_env(job)["env_vars"].items() if k not in ray_cluster.NOT_FORWARDED})
    env.update(
        {
            report.FILE_LOGGER_ENV: str(Path(attempt_log).resolve()),
            report.LOG_DIR_ENV: str((job.run_dir / report.ROLLOUT_DIR).resolve()),
            report.ATTEMPT_ENV: str(attempt),
        }
    )
    return env


def run_driver(job: VerlJob, argv: list[str], env: dict[str, str], log: Path, *, inside: bool) -> int:
    """Run the driver to its end and return its exit status: against the cluster this process runs in (a
    submitted job, ``inside``), else against a Ray head started for it and stopped afterwards."""
    v = job.section.verl
    if inside:
        return ray_cluster.run_driver(argv, "auto", env, log)
    with ray_cluster.RayHead.start(
        v.ray_head_host, env=env, dashboard=v.ray_dashboard, **head_resources(v)
    ) as head:
        return ray_cluster.run_driver(argv, head.address, head.env, log)


def launch(stage: str, cfg: RLJobConfig, dry_run: bool = False) -> int | None:
    """``npr verl launch STAGE [--dry-run] [--profile P]``: build and validate the verl job of an RL stage,
    print its settings and command, and (without ``dry_run``) submit the stage to the running cluster at
    ``verl.ray_address``; returns the exit status. None when there is no such cluster: the job then needs
    the head the stage starts itself, so the caller runs the stage (``components.stages.run_stage``, in its
    own process), which builds the job, runs verl's ``main_ppo`` and merges."""
    job = build_job(stage, cfg)
    try:
        check = validate_job(job)
    except ConfigError as err:
        print(f"error: {err}")
        return 2
    print(f"# {stage} ({job.profile}): verl accepts the job")
    for key, value in check.summary().items():
        print(f"#   {key}: {json.dumps(value, sort_keys=True)}")
    if dry_run:
        print(shlex.join(ray_job_command(job)))
        return 0
    address = job.section.verl.ray_address
    if not address:
        print(f"# {stage}: no verl.ray_address, so the stage starts its own Ray head and runs the job")
        return None
    # The cluster reproduces the whole stage, exactly as the pipeline's npr-stage flow submits it
    # (infra/ray/job.yaml): inputs pulled from the DVC remote there, files under verl.shared_dir, outputs and
    # run-cache pushed back. Overrides built here would name this machine's paths, which no node has.
    run_id = f"manual-{time.strftime('%Y%m%d-%H%M%S')}"
    work = Path(cfg.run.artifacts_dir) / stage / "work"
    work.mkdir(parents=True, exist_ok=True)
    print(f"# submitting {stage} to {address} as npr-{stage}-{run_id} (infra/ray/job.yaml)")
    done = ray_cluster.submit_stage_job(stage, load_spec(RAY_JOB_SPEC), run_id, address, work)
    if done.returncode == 0:
        print(
            f"# {stage} ran on the cluster; its outputs are on the DVC remote: `dvc pull {stage}` brings them here"
        )
    return done.returncode
