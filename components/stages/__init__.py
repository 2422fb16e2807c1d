"""One module per stage: ``components/stages/<name>.py`` exposes ``run(cfg, io) -> dict`` (metrics).

``run_stage`` is the only caller: it resolves the stage's paths from dvc.yaml, applies the run-wide
settings, opens the stage's W&B run, calls ``run`` and writes what the stage reports: ``metrics.json``
(everything it returned, with the provenance every run records: profile, prompt hash, the lock the
environment was installed from and its sha256, Python, threads, the compute precision), the flat DVC metrics file and the
training curves (``components.reporting``); then it logs to W&B the flat metrics, the rejection categories
and references to the datasets and checkpoints the stage consumed and produced.
"""

from __future__ import annotations

import importlib
import logging
import platform
import time
from contextlib import nullcontext
from pathlib import Path
from typing import Any

import torch

from components import reporting, storage
from components.artifacts import prepare_work_dir, write_json
from components.config import PipelineConfig
from components.dag import StageIO, stage_io
from components.engine.server_env import server_environment
from components.env import torch_threads
from components.envlock import environment
from components.fingerprint import work_fingerprint
from components.ops.plots_html import ensure_offline_template
from components.prompts import prompt_fingerprint
from components.tracking import stage_run
from components.training.distributed import is_main_process
from components.training.memory import check_before_run
from components.training.precision import run_precision

log = logging.getLogger(__name__)


def stage_module(name: str) -> Any:
    try:
        return importlib.import_module(f"components.stages.{name}")
    except ModuleNotFoundError as err:
        if err.name == f"components.stages.{name}":
            raise ValueError(
                f"stage {name!r} has no implementation module components/stages/{name}.py"
            ) from None
        raise


def apply_run_settings(cfg: PipelineConfig) -> int:
    """Torch threads (run.torch_threads, or the pipeline flow's share) and the seed; returns the threads."""
    threads = torch_threads(cfg.run.torch_threads)
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.run.seed)
    return threads


def run_stage(name: str, cfg: PipelineConfig, io: StageIO | None = None) -> dict[str, Any]:
    """Run one stage, write its metrics.json, flat metrics and plot rows; returns the metrics."""
    io = io or stage_io(name)
    module = stage_module(name)
    # a stage whose memory plan cannot fit its GPU fails here, naming the setting, before any work
    check_before_run(name, cfg, io)
    threads = apply_run_settings(cfg)
    # Resumable stages keep checkpoints in artifacts/<stage>/work; it is reset when the stage's code,
    # params or inputs changed, so a rerun never resumes from a checkpoint of a different run.
    resumed_work = None
    main = is_main_process()  # in a torchrun job only rank 0 prepares the work dir and writes metrics
    if io.outputs and main and io.work_dir is not None:
        resumed_work = prepare_work_dir(io.work_dir, work_fingerprint(name, cfg))
    # One W&B run per stage, every stage; the trainers' and the evaluation's stage_run log into it.
    tracked = main and io.work_dir is not None
    with stage_run(cfg, name, io.work_dir) if tracked else nullcontext() as tracker:
        start = time.perf_counter()
        metrics = dict(module.run(cfg, io) or {})
        metrics["wall_time_s"] = round(time.perf_counter() - start, 3)
        if resumed_work is not None:
            metrics["work_dir_kept"] = resumed_work
        metrics["provenance"] = {
            "stage": name,
            "profile": cfg.profile,
            "prompt": prompt_fingerprint(cfg.prompts),
            # the lock the installed packages came from (its sha256) and anything that differs from it
            "environment": environment(),
            "python": platform.python_version(),
            "torch_threads": threads,
            # what run.autocast resolved to here (auto: bf16 only on a device that computes it natively)
            "precision": run_precision(cfg.run).as_dict(cfg.run.dtype),
        }
        # a stage decoding on a server in a locked environment of its own (vLLM's): that one too
        served_env = server_environment(getattr(cfg, name, None))
        if served_env is not None:
            metrics["provenance"]["server_environment"] = served_env
        if main:
            write_reports(name, io, metrics, own_plots=getattr(module, "WRITES_PLOTS", False))
        if tracker is not None:
            publish_stage(tracker, name, cfg, io, metrics)
    return metrics


def write_reports(name: str, io: StageIO, metrics: dict[str, Any], own_plots: bool = False) -> None:
    """metrics.json, the flat DVC metrics and (unless the stage drew its own) its training curves."""
    if io.metrics is not None:
        write_json(io.metrics, metrics)
    if io.summary is not None:
        reporting.write_summary(name, metrics, io.summary)
    if io.plots is not None:
        if not own_plots:
            reporting.write_training_curves(io.work_dir, io.plots)
        try:  # so `dvc plots show` renders offline (components/ops/plots_html.py)
            ensure_offline_template()
        except ImportError as err:  # an environment without vl-convert-python: the stage's results stand
            log.warning("offline plots page not written (%s); `npr plots template` writes it", err)


def publish_stage(tracker: Any, name: str, cfg: PipelineConfig, io: StageIO, metrics: dict[str, Any]) -> None:
    """The stage's W&B run gets its flat metrics and rejection categories (summary) and references to the
    inputs it consumed and the outputs it produced. A reference that cannot be resolved is logged as a
    warning: the stage's results stand."""
    try:
        tracker.summary(reporting.wandb_summary(name, metrics, io.work_dir))
    except ValueError as err:  # too many rejection categories: free text in a reason (a bug to fix)
        log.warning("W&B summary of %s without rejection categories: %s", name, err)
        tracker.summary(reporting.wandb_summary(name, metrics, None, categories=False))
    for key, path in io.inputs.items():
        _reference(tracker, key, path, cfg, consumed=True)
    for key, path in io.outputs.items():
        _reference(tracker, f"{name}/{key}", path, cfg, consumed=False)


def _reference(tracker: Any, key: str, path: Path, cfg: PipelineConfig, consumed: bool) -> None:
    try:
        entry = None
        if consumed:  # under `dvc repro` an input is the upstream output dvc.lock recorded
            entry = next(
                (o for o in storage.locked_outputs(key.split("/")[0]) if o["path"] == str(path)), None
            )
        if entry is None:
            if not Path(path).exists():
                return
            entry = storage.dvc_md5(path)
        uri = storage.content_uri(entry["md5"], cfg.storage)
        kind = "model" if Path(path).name == "model" else "dataset"
        meta = {"dvc_path": str(path), **{k: entry[k] for k in ("md5", "size", "nfiles") if k in entry}}
        if consumed:
            tracker.use_reference(key, uri, kind, meta)
        else:
            tracker.log_reference(key, uri, kind, meta)
    except Exception as err:  # tracking must not undo a stage that succeeded
        log.warning("W&B reference for %s not logged: %s", path, err)
