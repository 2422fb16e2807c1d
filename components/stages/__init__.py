"""One module per stage: ``components/stages/<name>.py`` exposes ``run(cfg, io) -> dict`` (metrics).

``run_stage`` is the only caller: it resolves the stage's paths from dvc.yaml, applies the run-wide
settings, calls ``run`` and writes ``metrics.json`` with the provenance every run records.
"""

from __future__ import annotations

import importlib
import platform
import time
from typing import Any

from components.artifacts import prepare_work_dir, write_json
from components.config import PipelineConfig
from components.dag import StageIO, stage_io
from components.env import torch_threads
from components.fingerprint import work_fingerprint
from components.prompts import prompt_fingerprint
from components.training.distributed import is_main_process
from components.training.memory import check_before_run


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
    import torch

    threads = torch_threads(cfg.run.torch_threads)
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.run.seed)
    return threads


def run_stage(name: str, cfg: PipelineConfig, io: StageIO | None = None) -> dict[str, Any]:
    """Run one stage and write its metrics.json; returns the metrics."""
    io = io or stage_io(name)
    module = stage_module(name)
    # a stage whose memory plan cannot fit its GPU fails here, naming the setting, before any work
    check_before_run(name, cfg, io)
    threads = apply_run_settings(cfg)
    # Resumable stages keep checkpoints in artifacts/<stage>/work; it is reset when the stage's code,
    # params or inputs changed, so a rerun never resumes from a checkpoint of a different run.
    resumed_work = None
    main = is_main_process()  # in a torchrun job only rank 0 prepares the work dir and writes metrics
    if io.outputs and main:
        work = next(iter(io.outputs.values())).parent / "work"
        resumed_work = prepare_work_dir(work, work_fingerprint(name, cfg))
    start = time.perf_counter()
    metrics = dict(module.run(cfg, io) or {})
    metrics["wall_time_s"] = round(time.perf_counter() - start, 3)
    if resumed_work is not None:
        metrics["work_dir_kept"] = resumed_work
    metrics["provenance"] = {
        "stage": name,
        "profile": cfg.profile,
        "prompt": prompt_fingerprint(cfg.prompts),
        "python": platform.python_version(),
        "torch_threads": threads,
    }
    if io.metrics is not None and main:
        write_json(io.metrics, metrics)
    return metrics
