"""One stage as a Prefect flow (deployable to the `gpu` work pool), and the stage execution both flows share.

A stage always runs through DVC (`dvc repro --single-item STAGE`): DVC decides whether it is stale, so a
retried or re-triggered run never redoes finished work. Inputs are pulled when missing and outputs pushed
after success, so consecutive stages may run on different machines.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml
from prefect import flow, get_run_logger
from prefect.artifacts import create_progress_artifact, update_progress_artifact
from prefect.context import TaskRunContext

from components import storage
from components.config import PARAMS_FILE, PipelineConfig, load_config, materialise_profile, validate_config
from components.dag import load_stages, stage_io
from components.env import THREADS_ENV
from components.ops.launch import RAY_JOB_SPEC, load_spec
from components.tracking import publish_pending_references
from components.training.config import RLStageConfig
from components.training.verl.ray_cluster import submit_stage_job

log = logging.getLogger(__name__)


class StageFailed(RuntimeError):
    """`dvc repro` of a stage exited non-zero; the message holds the tail of its output."""


def adopt_params(text: str) -> PipelineConfig:
    """Validate ``text`` as params.yaml and write it here (the pipeline machine's, verbatim)."""
    cfg = validate_config(yaml.safe_load(text), "params.yaml of the pipeline run")
    PARAMS_FILE.write_text(text)
    return cfg


def ensure_profile(profile: str, overrides: list[str] | None) -> PipelineConfig:
    """Materialise the requested profile only when it differs from params.yaml or overrides are given,
    so hand edits to params.yaml (e.g. `dvc exp run -S`) survive a plain run."""
    current = load_config()
    if profile != current.profile or overrides:
        return materialise_profile(profile, overrides or [])
    return current


def stage_metrics(stage: str) -> dict[str, Any]:
    """The stage's full record (``artifacts/<stage>/metrics.json``), or {} when it has none yet."""
    record = stage_io(stage).metrics
    if record is None or not record.exists():
        return {}
    return json.loads(record.read_text())


# What `dvc repro` (dvc 3.67, pinned) prints for each way a stage can end up done.
RAN, UP_TO_DATE, RESTORED = "ran", "up to date", "restored from run-cache"
_DVC_OUTCOMES = (
    ("Running stage '{stage}'", RAN),
    ("Stage '{stage}' didn't change, skipping", UP_TO_DATE),
    ("Stage '{stage}' is cached - skipping run", RESTORED),
)


def repro_outcome(stage: str, lines: list[str]) -> str | None:
    """Whether `dvc repro` ran the stage, found it up to date, or restored it from the run-cache."""
    found = None
    for line in lines:
        for marker, outcome in _DVC_OUTCOMES:
            if marker.format(stage=stage) in line:
                found = outcome
    return found


# A step-level progress line of components.progress in a log ("<what>: 40/100 steps (40%), ...").
_PROGRESS_LINE = re.compile(r"^(?P<what>.+): [\d.]+/[\d.]+ [^(]+ \((?P<pct>\d+)%\)")
_DONE_LINE = re.compile(r"^.+: done, [\d.]+ ")


class StageProgress:
    """The stage's progress lines (its output is a pipe, so components.progress writes plain lines) as a
    Prefect progress artifact ``<stage>-progress`` of the task run: a bar in the UI, at most a dozen
    updates per long step. Outside a Prefect run it does nothing."""

    def __init__(self, stage: str) -> None:
        self.stage, self.artifact_id = stage, None
        self.active = TaskRunContext.get() is not None

    def __call__(self, line: str) -> None:
        if not self.active:
            return
        match = _PROGRESS_LINE.match(line)
        if match is None and not _DONE_LINE.match(line):
            return

        pct, what = (float(match["pct"]) if match else 100.0), line[:200]
        try:
            if self.artifact_id is None:
                key = f"{self.stage.replace('_', '-')}-progress"
                self.artifact_id = create_progress_artifact(pct, key=key, description=what)
            else:
                update_progress_artifact(self.artifact_id, pct, description=what)
        except Exception as err:  # the UI's bar is a convenience: never fail a stage over it
            self.active = False
            print(f"progress artifact of stage {self.stage} disabled: {err}")


def execute_stage(
    stage: str,
    cfg: PipelineConfig,
    pipeline_run_id: str | None = None,
    torch_threads: int | None = None,
    report: dict[str, Any] | None = None,
    upstream_lock: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Pull missing inputs, `dvc repro --single-item`, push outputs; returns the stage's metrics.

    ``torch_threads`` (a stage running beside another) becomes the stage process's ``NPR_TORCH_THREADS``.
    ``report``, when given, receives ``outcome`` (``RAN``, ``UP_TO_DATE`` or ``RESTORED``) and the split of
    the task's wall time (``pull_s``, ``repro_s``, ``push_s``).
    ``upstream_lock``: dvc.lock entries of stages that ran elsewhere (the pipeline's machine), adopted
    first so their outputs can be pulled here. A verl stage placed on a running Ray cluster
    (``verl.ray_address``) is submitted there instead and its outputs restored from the run-cache.
    """
    started = time.perf_counter()
    if upstream_lock:
        adopt_lock_entries(upstream_lock)
    env = stage_env(pipeline_run_id, torch_threads)
    timeout_s = cfg.orchestration.timeout_for(stage)
    if on_ray_cluster(stage, cfg):
        submit_to_ray_cluster(stage, cfg, pipeline_run_id or "local", env, timeout_s)
        restore_from_run_cache(stage, env, timeout_s)
        print(
            f"stage {stage}: ran on the Ray cluster, restored here in {time.perf_counter() - started:.1f} s"
        )
        if report is not None:
            report.update(
                outcome=RESTORED, pull_s=0.0, repro_s=round(time.perf_counter() - started, 1), push_s=0.0
            )
        return stage_metrics(stage)
    if cfg.storage.pull_inputs:
        storage.pull_stage_inputs(stage, cfg.storage)
    pulled = time.perf_counter()
    # --wait-for-lock: another branch's `dvc repro` may hold the lock while it checks or records its stage
    cmd = [storage.dvc_executable(), "--wait-for-lock", "repro", "--single-item", stage]
    seen: list[str] = []  # DVC's lines about this stage (its outcome), whatever the tail keeps
    watch = f"'{stage}'"
    progress = StageProgress(stage)

    def on_line(line: str) -> None:
        if watch in line:
            seen.append(line)
        progress(line)

    returncode, tail, timed_out = stream_with_deadline(cmd, env, timeout_s, on_line=on_line)
    if timed_out:
        raise StageFailed(
            f"stage {stage} ran past its timeout of {timeout_s} s (orchestration.task_timeout_s) and was "
            "killed with its child processes:\n" + "\n".join(tail)
        )
    if returncode != 0:
        raise StageFailed(f"stage {stage} failed (dvc repro exit {returncode}):\n" + "\n".join(tail))
    reproduced = time.perf_counter()
    if cfg.storage.push_after_stage:
        storage.push_stage_outputs(stage, cfg.storage)
        publish_references(stage, cfg)
    # Where a stage task's time goes, beside the stage's own wall_time_s in its metrics.json.
    outcome = repro_outcome(stage, seen) or RAN
    print(
        f"stage {stage} {outcome}: pull {pulled - started:.1f} s, dvc repro {reproduced - pulled:.1f} s, "
        f"push {time.perf_counter() - reproduced:.1f} s"
    )
    if report is not None:
        report.update(
            outcome=outcome,
            pull_s=round(pulled - started, 1),
            repro_s=round(reproduced - pulled, 1),
            push_s=round(time.perf_counter() - reproduced, 1),
        )
    return stage_metrics(stage)


def publish_references(stage: str, cfg: PipelineConfig) -> int:
    """The stage's output references whose remote objects the push just created (a local remote's), into
    the stage's W&B run (``components.tracking.publish_pending_references``); a failure is a warning."""
    try:
        work_dir = stage_io(stage).work_dir
        return publish_pending_references(cfg, stage, work_dir) if work_dir is not None else 0
    except Exception as err:  # noqa: BLE001 - tracking must not undo a stage that ran and was pushed
        log.warning("W&B references of %s not logged after the push: %s", stage, err)
        return 0


def stage_env(pipeline_run_id: str | None = None, torch_threads: int | None = None) -> dict[str, str]:
    """The environment of a stage's `dvc repro`: this interpreter's tools first, and this checkout's code
    (PYTHONPATH), so a worker that checked out the launching commit runs that commit, not the code
    installed in its image."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    here = str(Path.cwd().resolve())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (here, env.get("PYTHONPATH", "")) if p)
    if pipeline_run_id:
        env["NPR_PIPELINE_RUN_ID"] = pipeline_run_id
    if torch_threads is not None:
        env[THREADS_ENV] = str(torch_threads)
    return env


# `npr stage` refuses to run when this is set: a restore must come from the run-cache, never from running
# a GPU stage on the machine that only asked for it.
RESTORE_ONLY_ENV = "NPR_RESTORE_ONLY"


def restore_from_run_cache(stage: str, env: dict[str, str] | None = None, timeout_s: float = 3600) -> None:
    """Bring a stage that ran on another machine into this workspace: `dvc repro --pull` finds its run in
    the remote run-cache (pushed by the machine that ran it), checks its outputs out and records them in
    dvc.lock, without running it (``NPR_RESTORE_ONLY`` makes `npr stage` refuse if DVC tried)."""
    env = dict(env or stage_env())
    env[RESTORE_ONLY_ENV] = "1"
    cmd = [storage.dvc_executable(), "--wait-for-lock", "repro", "--pull", "--single-item", stage]
    returncode, tail, timed_out = stream_with_deadline(cmd, env, timeout_s)
    if returncode != 0 or timed_out:
        raise StageFailed(
            f"stage {stage} ran elsewhere but its outputs could not be restored from the DVC run-cache "
            f"(dvc repro --pull exit {returncode}); was its run-cache pushed to the remote?\n"
            + "\n".join(tail)
        )


def lock_entries(exclude: str | None = None, root: Path | None = None) -> dict[str, Any]:
    """dvc.lock's stage entries (all but ``exclude``): what a machine needs to pull those stages' outputs."""
    lock = Path(root or ".") / "dvc.lock"
    if not lock.exists():
        return {}

    stages = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}) or {}
    return {name: entry for name, entry in stages.items() if name != exclude}


def adopt_lock_entries(entries: dict[str, Any], root: Path | None = None) -> None:
    """Write stage entries into dvc.lock (replacing those stages'), keeping the others."""
    lock = Path(root or ".") / "dvc.lock"
    data = (yaml.safe_load(lock.read_text()) if lock.exists() else None) or {"schema": "2.0", "stages": {}}
    data.setdefault("stages", {}).update(entries)
    tmp = lock.with_suffix(".lock.tmp")
    tmp.write_text(yaml.safe_dump(data, sort_keys=False, width=100))
    tmp.replace(lock)


def on_ray_cluster(stage: str, cfg: PipelineConfig) -> bool:
    """A verl stage placed on a running Ray cluster (``verl.ray_address``)."""
    section = cfg.section(stage)
    return isinstance(section, RLStageConfig) and section.backend == "verl" and bool(section.verl.ray_address)


def submit_to_ray_cluster(
    stage: str, cfg: PipelineConfig, run_id: str, env: dict[str, str], timeout_s: float
) -> None:
    """Submit the stage to its Ray cluster as infra/ray/job.yaml describes and wait for it."""
    address = cfg.sections(RLStageConfig)[stage].verl.ray_address
    work = Path(cfg.run.artifacts_dir) / stage / "work"
    done = submit_stage_job(stage, load_spec(RAY_JOB_SPEC), run_id, address, work, env, timeout_s)
    if done.returncode != 0:
        raise StageFailed(
            f"stage {stage}: the Ray job on {address} failed (ray job submit exit {done.returncode})"
        )


def stream_with_deadline(
    cmd: list[str], env: dict[str, str], timeout_s: float, on_line: Callable[[str], Any] | None = None
) -> tuple[int, list[str], bool]:
    """Run ``cmd``, echoing its output live; kill it and every process under it after ``timeout_s``.
    ``on_line`` sees every output line.

    Returns ``(exit code, last 25 output lines, timed out)``. The deadline is enforced here because a
    Prefect task timeout cannot interrupt a blocking read in a worker thread (where parallel stages run),
    and killing only `dvc` would leave the stage's own process running.
    """
    import psutil  # lazy: psutil

    tail: deque[str] = deque(maxlen=25)
    expired = threading.Event()

    def kill_tree(proc: subprocess.Popen) -> None:
        expired.set()
        with contextlib.suppress(psutil.NoSuchProcess):
            parent = psutil.Process(proc.pid)
            for child in [*parent.children(recursive=True), parent]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    child.kill()

    with subprocess.Popen(
        cmd, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, bufsize=1
    ) as proc:
        timer = threading.Timer(timeout_s, kill_tree, args=(proc,))
        timer.daemon = True
        timer.start()
        try:
            assert proc.stdout is not None
            for line in proc.stdout:  # live progress bars and metrics; the tail goes into errors
                sys.stdout.write(line)
                sys.stdout.flush()
                tail.append(line.rstrip("\n"))
                if on_line is not None:
                    on_line(line.rstrip("\n"))
        finally:
            timer.cancel()
    return proc.returncode, list(tail), expired.is_set()


@flow(name="npr-stage", log_prints=True)
def npr_stage(
    stage: str,
    profile: str = "tiny",
    overrides: list[str] | None = None,
    upstream_lock: dict[str, Any] | None = None,
    params_yaml: str | None = None,
) -> dict[str, Any]:
    """Run one stage of the pipeline (used for stages placed on the gpu work pool).

    ``params_yaml``/``upstream_lock``: the pipeline machine's params.yaml and dvc.lock entries, so this
    worker runs with the same params and can pull the inputs that machine produced; afterwards this worker
    has pushed the stage's outputs and its run-cache, from which the pipeline machine restores them."""
    cfg = adopt_params(params_yaml) if params_yaml else ensure_profile(profile, overrides)
    if stage not in load_stages():
        raise ValueError(f"unknown stage {stage!r}")
    get_run_logger().info("running stage %s (profile %s) in %s", stage, cfg.profile, Path.cwd())
    return execute_stage(stage, cfg, os.environ.get("NPR_PIPELINE_RUN_ID"), upstream_lock=upstream_lock)
