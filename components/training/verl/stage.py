"""An RL stage through verl's own trainer: ``main_ppo`` on Ray, resumed from its checkpoints, merged, reported.

``run_verl_stage`` is the stage body for ``<stage>.backend: verl`` (``components.training.rl.train_rl`` hands
it the stage's ``RLJob``):

1. the verl job built once from it (``job.verl_job``: overrides, input paths, plugin environment), validated
   by verl (``validate``), its parquet inputs written (``prepare_job``);
2. ``python -m verl.trainer.main_ppo <overrides>`` against a Ray head this process starts (or, inside a job
   submitted to a running cluster, against that cluster), as attempt ``k`` of the job: verl's ``file``
   logger writes to ``verl_logs/attempt-k.jsonl`` and the plugins' rollout records carry ``k``;
3. verl resumes by itself (``trainer.resume_mode: auto``) from the newest checkpoint under
   ``checkpoints/``, so a stage killed after a checkpoint continues from it when it is run again (the
   work dir survives while the stage's code, params and inputs are unchanged: ``components.stages``).
   verl writes a step's checkpoint before it logs the step's metrics, so a kill between the two leaves a
   checkpoint of a step nobody can report; ``rewind_to_reported`` drops such checkpoints first, and the
   resumed attempt runs that step again;
4. the newest checkpoint merged into the stage's HF output by verl's model merger;
5. the stage's metrics and per-step log from verl's run (``report``), so a resumed job reports every step
   of the run, as an uninterrupted one does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from components.artifacts import atomic_dir
from components.training.config import VerlSettings
from components.training.job import RLJob
from components.training.verl import ray_cluster, report
from components.training.verl.job import VERL_ENTRY_MODULE, VerlJob, read_problems, verl_job, write_job_files
from components.training.verl.launch import driver_argv, driver_env, run_driver
from components.training.verl.validate import check_inputs, validate_job

CHECKPOINTS = "checkpoints"
TRACKER_FILE = "latest_checkpointed_iteration.txt"  # verl's record of its newest checkpoint
STEP_LOG = "metrics.jsonl"  # the local trainer's per-step log name (components.reporting.RL_LOG)
ERROR_TAIL_LINES = 25


class VerlJobError(RuntimeError):
    """verl's job failed; the message carries the end of its driver log."""


def latest_checkpoint_step(run_dir: Path) -> int | None:
    """The step of verl's newest checkpoint in ``run_dir`` (what ``resume_mode: auto`` resumes from)."""
    tracker = Path(run_dir) / CHECKPOINTS / TRACKER_FILE
    try:
        return int(tracker.read_text().strip())
    except (OSError, ValueError):
        return None


def _step_of(checkpoint: Path) -> int:
    return int(checkpoint.name.rsplit("_", 1)[1])


def checkpoint_dirs(run_dir: Path) -> list[Path]:
    """verl's ``global_step_<n>`` checkpoints in ``run_dir``, oldest first."""
    return sorted((Path(run_dir) / CHECKPOINTS).glob("global_step_*"), key=_step_of)


def rewind_to_reported(run_dir: Path) -> int | None:
    """Drop every checkpoint newer than the newest one whose step verl logged, point verl's tracker at that
    one (no tracker: verl starts afresh), and return its step: what the next attempt resumes from.

    verl's loop saves a step's checkpoint, then validates, then logs the step's metrics; resuming from a
    checkpoint whose metrics were never logged would leave that step out of the report for good. A folder
    newer than the tracker is a save cut short.
    """
    run_dir = Path(run_dir)
    newest = latest_checkpoint_step(run_dir)
    logged = set(report.verl_steps(run_dir))
    saved = {_step_of(d): d for d in checkpoint_dirs(run_dir)}
    resume = max((s for s in saved if newest is not None and s <= newest and s in logged), default=None)
    for step, checkpoint in saved.items():
        if resume is None or step > resume:
            shutil.rmtree(checkpoint)
    tracker = run_dir / CHECKPOINTS / TRACKER_FILE
    if resume is None:
        tracker.unlink(missing_ok=True)
    elif resume != newest:
        tmp = tracker.with_suffix(".tmp")
        tmp.write_text(str(resume))
        tmp.replace(tracker)
    return resume


def error_tail(log: Path, lines: int = ERROR_TAIL_LINES) -> str:
    """The end of a driver log, from its last traceback when it has one (what failed, not Ray's noise)."""
    try:
        text = log.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return ""
    starts = [i for i, line in enumerate(text) if line.startswith("Traceback")]
    chunk = text[starts[-1] :] if starts else text
    return "\n".join(chunk[-lines:])


def _placement(stage: str, v: VerlSettings, init_dir: Path, work_dir: Path) -> tuple[bool, Path, Path]:
    """(inside a submitted job, run dir, starting model) for the two placements (ray_cluster)."""
    inside = ray_cluster.inside_submitted_job()
    if v.ray_address and not inside:
        raise RuntimeError(
            f"{stage} attaches to the Ray cluster at {v.ray_address} ({stage}.verl.ray_address): run it "
            "through the pipeline (npr run / the npr-stage flow), which submits it there as a Ray job and "
            "restores its outputs from the DVC run-cache; `npr stage` alone cannot"
        )
    if not inside:
        return False, work_dir / "verl", init_dir
    if not v.shared_dir:
        raise RuntimeError(f"{stage} runs on a Ray cluster but {stage}.verl.shared_dir is not set")
    run_dir = Path(v.shared_dir) / "npr" / stage / os.environ.get("NPR_PIPELINE_RUN_ID", "run") / "verl"
    shared_model = run_dir / "inputs" / "model"
    if not shared_model.exists():  # every node reads the starting model from the shared filesystem
        shutil.copytree(init_dir, shared_model)
    return True, run_dir, shared_model


def prepare_job(
    job: VerlJob, problems_dir: Path, train_problems: list[dict[str, Any]] | None = None
) -> Path:
    """Have verl validate the built ``job``, check its problems against the starting model's tokenizer and
    write its inputs; returns its ``verl_overrides.yaml`` record. Nothing is written before verl accepts the
    job."""
    validate_job(job)
    train, val = read_problems(job, Path(problems_dir), train_problems)
    check_inputs(job, [*train, *val])
    return write_job_files(job, train, val)


def run_verl_stage(rl: RLJob, train_problems: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Train the stage ``rl`` describes with verl's ``main_ppo`` and return its metrics (see the module
    docstring); ``train_problems``: a stage's own training set (pr1_rl), else its problems' train split."""
    stage, paths, v = rl.stage, rl.stage_paths(), rl.section.verl
    work_dir, out_dir = paths.work_dir, paths.writes
    inside, run_dir, init_dir = _placement(stage, v, paths.starts_from, work_dir)
    job = verl_job(rl, model_path=init_dir, run_dir=run_dir)
    overrides_file = prepare_job(job, paths.problems, train_problems)
    entry = os.environ.get("NPR_VERL_ENTRY_MODULE", VERL_ENTRY_MODULE)  # a stand-in trainer in tests
    attempt, attempt_log = report.next_attempt(run_dir)
    argv = driver_argv(job, run_dir / "hydra" / f"attempt-{attempt:02d}", entry)
    attempt_log.parent.mkdir(parents=True, exist_ok=True)
    resumed_from = rewind_to_reported(run_dir)
    env = driver_env(job, attempt, attempt_log)
    log = run_dir / "driver.log"
    returncode = run_driver(job, argv, env, log, inside=inside)
    if returncode != 0:
        raise VerlJobError(
            f"verl job for {stage} failed with exit code {returncode} (attempt {attempt}); driver log {log}, "
            f"overrides {overrides_file}:\n{error_tail(log)}"
        )
    steps = checkpoint_dirs(run_dir)
    if not steps:
        raise VerlJobError(f"verl job for {stage} finished without a checkpoint in {run_dir / CHECKPOINTS}")
    with atomic_dir(out_dir) as tmp:
        merge = [sys.executable, "-m", "verl.model_merger", "merge", "--backend", "fsdp"]
        merge += ["--local_dir", str(steps[-1] / "actor"), "--target_dir", str(tmp)]
        subprocess.run(merge, check=True, capture_output=True)

    records = report.step_records(stage, run_dir)
    report.write_step_log(records, Path(work_dir) / STEP_LOG)
    metrics = report.summarize(records, job.section.algorithm)
    metrics.update(
        {
            "backend": "verl",
            "ray": "cluster " + str(v.ray_address) if inside else f"own head on {v.ray_head_host}",
            "checkpoint_step": _step_of(steps[-1]),
            "attempts": attempt,
            "resumed_from_step": resumed_from,
            "overrides": str(overrides_file),
        }
    )
    return metrics


__all__ = [
    "VerlJobError",
    "checkpoint_dirs",
    "latest_checkpoint_step",
    "prepare_job",
    "rewind_to_reported",
    "run_verl_stage",
]
