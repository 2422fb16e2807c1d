"""The pipeline flow: one Prefect task per dvc.yaml stage, each started when its upstream stages are done.

The stage list and its dependencies are read from dvc.yaml (never written here), so the flow and `dvc repro`
cannot drift. Each task's version is the stage fingerprint (its code + params); the task runs the stage
through DVC, pushes its outputs and publishes its metrics as a Prefect artifact. Stages named in
`orchestration.gpu_stages` are dispatched to the `npr-stage` deployment on the gpu work pool instead of
running in this process.

With `orchestration.max_parallel_stages: 1` the stages run one after another in dvc.yaml's topological
order. Above 1, independent branches (the NPR and SR branches) run at the same time, at most that many
stages at once; those stages get `run.torch_threads / max_parallel_stages` torch threads each (the
``NPR_TORCH_THREADS`` of their process). DVC allows it: `dvc repro` holds the repository lock only while it
checks and records a stage, not while the stage's command runs, and the flow passes `--wait-for-lock`.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Literal

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.runtime import flow_run
from prefect.states import Completed
from prefect.task_runners import ThreadPoolTaskRunner

from components import storage
from components.config import PipelineConfig, load_config
from components.dag import ancestors, independent_stages, load_stages, stage_order
from components.fingerprint import stage_fingerprint
from components.reporting import embed_images, stage_markdown, timing_markdown
from components.training.memory import gpus_for
from flows.stage import (
    PARAMS_FILE,
    RAN,
    RESTORED,
    UP_TO_DATE,
    ensure_profile,
    execute_stage,
    lock_entries,
    restore_from_run_cache,
    stage_metrics,
)

REPO_ROOT = Path(__file__).resolve().parents[1]


def profile_names(root: Path = REPO_ROOT) -> tuple[str, ...]:
    """The profiles a run may use: configs/<name>.yaml."""
    return tuple(sorted(p.stem for p in (root / "configs").glob("*.yaml")))


# The run form's choices, read when the flow is loaded (deployed or run): Prefect renders a Literal as a
# drop-down and, with enforce_parameter_schema (prefect.yaml), the server refuses any other value when the
# run is submitted, instead of the run failing later.
ProfileName = Literal[profile_names()]  # type: ignore[valid-type]
StageName = Literal[tuple(load_stages(REPO_ROOT / "dvc.yaml"))]  # type: ignore[valid-type]
# Task state names: a stage DVC found up to date is visibly not one that ran.
STATE_NAMES = {RAN: "Ran", UP_TO_DATE: "Up to date", RESTORED: "Restored from run-cache"}

NPR_STAGE_DEPLOYMENT = "npr-stage/npr-stage"
# Most stages the flow's thread pool could ever run at once; orchestration.max_parallel_stages limits it.
MAX_WORKERS = 8
# Per flow run: a semaphore of max_parallel_stages slots, shared by that run's task threads.
_SLOTS: dict[str, threading.BoundedSemaphore] = {}


def _outcome_header(outcome: str, metrics: dict[str, Any], wall_s: float) -> str:
    """How the stage's task went, in one sentence for the Prefect UI."""
    return {
        RAN: f"ran in {wall_s:.1f} s (the stage itself: {metrics.get('wall_time_s', '–')} s)",
        UP_TO_DATE: "up to date: DVC skipped it; the numbers are those of the run that produced its outputs",
        RESTORED: "restored from DVC's run-cache: not run again; the numbers are those of the cached run",
    }.get(outcome, outcome)


def run_stage_in_flow(
    stage: str,
    profile: str,
    fingerprint: str,
    gpu: bool,
    pipeline_run_id: str,
    torch_threads: int | None = None,
) -> dict[str, Any]:
    """Run one stage (DVC decides staleness), then publish its metrics (and the report, if it wrote one).

    Returns ``{"metrics": ..., "wall_s": ...}``; ``torch_threads`` overrides run.torch_threads for a stage
    that runs beside another one.
    """
    slots = _SLOTS.get(pipeline_run_id)
    if slots is not None:
        slots.acquire()
    start = time.perf_counter()
    report: dict[str, Any] = {}
    try:
        metrics = _run_stage(stage, profile, gpu, pipeline_run_id, torch_threads, report)
    finally:
        wall = round(time.perf_counter() - start, 1)
        if slots is not None:
            slots.release()
    outcome = report.get("outcome", RAN)
    _publish(stage, fingerprint, metrics, outcome, wall)
    return {"metrics": metrics, "wall_s": wall, "outcome": outcome}


def stage_task_body(*args: Any, **kwargs: Any) -> Any:
    """``run_stage_in_flow`` as the stage task runs it: its final state is named after the outcome ("Ran",
    "Up to date", "Restored from run-cache"), so the UI shows which stages did work."""
    result = run_stage_in_flow(*args, **kwargs)
    name = STATE_NAMES.get(result["outcome"], "Completed")
    return Completed(name=name, message=f"stage {args[0]}: {result['outcome']}", data=result)


def _run_stage(
    stage: str,
    profile: str,
    gpu: bool,
    pipeline_run_id: str,
    torch_threads: int | None,
    report: dict[str, Any] | None = None,
) -> dict[str, Any]:
    cfg = load_config()
    if gpu:
        from prefect.deployments import run_deployment  # lazy: prefect

        run = run_deployment(
            name=NPR_STAGE_DEPLOYMENT,
            parameters=gpu_stage_parameters(stage, profile),
            job_variables=gpu_job_variables(stage, cfg, pipeline_run_id),
            timeout=cfg.orchestration.timeout_for(stage),
        )
        if not run.state or not run.state.is_completed():
            raise RuntimeError(f"stage {stage} on the gpu pool ended in {run.state}")
        # the worker pushed the outputs and the run-cache: bring them (and the dvc.lock entry) here
        restore_from_run_cache(stage, timeout_s=cfg.orchestration.timeout_for(stage))
        return stage_metrics(stage)
    return execute_stage(stage, cfg, pipeline_run_id, torch_threads, report)


def gpu_stage_parameters(stage: str, profile: str) -> dict[str, Any]:
    """The npr-stage flow's parameters: the stage, the profile, this machine's params.yaml and its dvc.lock
    entries of the other stages (so the worker runs with the same params and can pull the inputs this
    machine produced; the run-cache entry it pushes then matches what this machine restores)."""
    return {
        "stage": stage,
        "profile": profile,
        "upstream_lock": lock_entries(exclude=stage),
        "params_yaml": PARAMS_FILE.read_text(),  # hand edits (dvc exp run -S) included
    }


def gpu_job_variables(stage: str, cfg: PipelineConfig, pipeline_run_id: str) -> dict[str, Any]:
    """The gpu pool job of a stage: as many GPUs as its own settings use (``memory.gpus_for``: 0 for a
    verl stage on a running Ray cluster, 1 for the torch-engine evaluate), and the commit this pipeline
    runs, which the worker checks out before running the stage (infra/gpu/checkout.sh), with the DVC
    remote this checkout resolves (the user's bucket lives in .dvc/config.local, which stays here)."""
    env = {
        "NPR_PIPELINE_RUN_ID": pipeline_run_id,
        **launching_commit(),
        **storage.remote_forwarding(cfg.storage),
    }
    return {"env": env, "gpu_count": gpus_for(stage, cfg)}


def launching_commit(root: Path | None = None) -> dict[str, str]:
    """``NPR_GIT_COMMIT`` (HEAD of this checkout) and ``NPR_GIT_REMOTE`` (its origin), for the worker.

    Refuses a checkout whose tracked code differs from HEAD: a GPU worker runs a commit, so uncommitted
    code would silently not run there (params.yaml and dvc.lock travel as flow parameters instead)."""

    def git(*args: str) -> str:
        return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True).stdout

    try:
        commit = git("rev-parse", "HEAD").strip()
    except (OSError, subprocess.CalledProcessError):
        return {}  # not a git checkout: the worker runs the code its image holds
    entries = git("status", "--porcelain=v1", "-z", "--untracked-files=no").split("\0")
    changed = [e[3:] for e in entries if e and e[3:] not in ("params.yaml", "dvc.lock")]
    if changed:
        raise RuntimeError(
            f"uncommitted changes to {changed[:5]}{' ...' if len(changed) > 5 else ''}: the gpu pool runs "
            f"commit {commit[:12]}, not this working tree; commit (and push) them first"
        )
    out = {"NPR_GIT_COMMIT": commit}
    with contextlib.suppress(subprocess.CalledProcessError):
        out["NPR_GIT_REMOTE"] = git("remote", "get-url", "origin").strip()
    return out


def _publish(
    stage: str, fingerprint: str, metrics: dict[str, Any], outcome: str = RAN, wall_s: float = 0.0
) -> None:
    key = stage.replace("_", "-")
    create_markdown_artifact(
        key=f"{key}-metrics",
        markdown=stage_markdown(stage, metrics, _outcome_header(outcome, metrics, wall_s)),
        description=f"{stage}: {outcome} (version {fingerprint})",
    )
    report = Path("artifacts") / stage / "report" / "report.md"
    if report.exists():
        create_markdown_artifact(
            key=f"{key}-report",
            markdown=embed_images(report.read_text(encoding="utf-8"), report.parent),
            description=f"{stage} report ({outcome})",
        )


def record_timing(run_id: str, profile: str, stage_wall_s: dict[str, float], total_s: float) -> Path:
    """Write ``artifacts/pipeline/timing-<run>.json`` (and a Prefect artifact inside a flow run)."""
    out = Path("artifacts") / "pipeline" / f"timing-{run_id}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    payload = {"run_id": run_id, "profile": profile, "stages_wall_s": stage_wall_s, "total_wall_s": total_s}
    out.write_text(json.dumps(payload, indent=2) + "\n")
    markdown = timing_markdown(stage_wall_s, total_s)
    print(markdown)
    if flow_run.get_id():
        create_markdown_artifact(
            key="pipeline-timing", markdown=markdown, description=f"{profile} run {run_id}"
        )
    return out


def plan(cfg: PipelineConfig, stages: list[str], current: PipelineConfig | None = None) -> list[str]:
    """Human-readable plan for `npr run --dry-run`: each stage, where it runs, whether it is stale.

    DVC's view (``dvc status``) is of params.yaml as it is on disk; when ``cfg`` (the profile and overrides
    asked for, not written) differs from ``current`` (params.yaml), the stages whose params change and every
    stage downstream of them are stale too.
    """
    proc = subprocess.run([storage.dvc_executable(), "status", "--json"], capture_output=True, text=True, check=False)
    try:
        stale = set(json.loads(proc.stdout or "{}"))
    except json.JSONDecodeError:
        stale = set()
    specs = load_stages()
    changed: set[str] = set()
    if current is not None:
        changed = {
            n for n in specs if stage_fingerprint(specs[n], cfg) != stage_fingerprint(specs[n], current)
        }
        changed |= {n for n in specs if ancestors(specs, n) & changed}
    lines = [f"profile {cfg.profile}; {len(stages)} stage(s)"]
    if changed:
        lines[0] += "; params.yaml not written (dry run)"
    for name in stages:
        where = "gpu pool" if name in cfg.orchestration.gpu_stages else "local"
        if name in changed:
            state = "stale (params)"
        elif any(s == name or s.endswith(f":{name}") for s in stale):
            state = "stale"
        else:
            state = "up to date"
        lines.append(
            f"  {name:<18} {where:<8} {state:<14} version {stage_fingerprint(specs[name], cfg)}  $ {specs[name].cmd}"
        )
    return lines


@flow(name="npr-pipeline", log_prints=True, task_runner=ThreadPoolTaskRunner(max_workers=MAX_WORKERS))
def npr_pipeline(
    profile: ProfileName = "tiny",  # type: ignore[assignment]
    stages: list[StageName] | None = None,
    overrides: list[str] | None = None,
) -> dict:
    """Run the NPR pipeline (all stages, or the selected ones) for a profile; each stage starts when its
    upstream stages are done, independent branches at once up to orchestration.max_parallel_stages.

    Args:
        profile: the profile to run, one of the files in configs/ (materialised into params.yaml when it
            differs from the current one).
        stages: stages of dvc.yaml to run; empty = all of them.
        overrides: `section.key=value` config overrides applied on top of the profile.
    """
    cfg = ensure_profile(profile, overrides)
    order = stage_order()
    selected = [s for s in order if not stages or s in stages]
    unknown = sorted(set(stages or []) - set(order))
    if unknown:
        raise ValueError(f"unknown stage(s) {unknown}; dvc.yaml has {order}")
    specs = load_stages()
    run_id = str(flow_run.get_id() or "local")
    parallel = cfg.orchestration.max_parallel_stages
    threads = stage_threads(cfg, selected, specs)
    _SLOTS[run_id] = threading.BoundedSemaphore(parallel)
    futures: dict[str, Any] = {}
    started = time.perf_counter()
    try:
        for k, name in enumerate(selected):
            fingerprint = stage_fingerprint(specs[name], cfg)
            # One task object per stage so its version (code + params fingerprint) is recorded on the run.
            # No Prefect timeout_seconds: in a worker thread it cannot interrupt the running stage; the task
            # enforces orchestration.timeout_for(stage) itself (flows/stage.py kills the stage's processes).
            runner = task(
                stage_task_body,
                name=f"stage-{name}",
                version=fingerprint,
                retries=cfg.orchestration.retries,
                retry_delay_seconds=cfg.orchestration.retry_delay_s,
                log_prints=True,
            )
            # one at a time: after the previous stage; in parallel: after the upstream stages only
            after = [futures[u] for u in specs[name].upstream if u in futures] if parallel > 1 else []
            if parallel == 1 and k:
                after = [futures[selected[k - 1]]]
            gpu = name in cfg.orchestration.gpu_stages
            futures[name] = runner.submit(
                name, cfg.profile, fingerprint, gpu, run_id, threads.get(name), wait_for=after
            )
        outcomes = {name: future.result() for name, future in futures.items()}
    finally:
        _SLOTS.pop(run_id, None)
    stage_wall_s = {name: outcomes[name]["wall_s"] for name in selected}
    record_timing(run_id, cfg.profile, stage_wall_s, round(time.perf_counter() - started, 1))
    return {name: outcomes[name]["metrics"] for name in selected}


def stage_threads(cfg: PipelineConfig, selected: list[str], specs: dict[str, Any]) -> dict[str, int]:
    """Torch threads of the stages that may run beside another one (the rest use run.torch_threads)."""
    parallel = cfg.orchestration.max_parallel_stages
    if parallel == 1:
        return {}
    chosen = {name: specs[name] for name in selected}
    share = max(1, cfg.run.torch_threads // parallel)
    return {name: share for name in independent_stages(chosen)}


if __name__ == "__main__":
    npr_pipeline(profile=sys.argv[1] if len(sys.argv) > 1 else "tiny")
