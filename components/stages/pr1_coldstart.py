"""Stage `pr1_coldstart` (Parallel-R1's cold start): SFT on parallel trajectories of the easy problems.

Data (``components.data.pr1_coldstart``): with ``pr1_coldstart.data.source: sample_orz`` the easy problems
of ``sample_orz``'s train split (``data.difficulties``), each rendered as a Parallel-R1 trajectory by the
synthetic task family (tiny profile); with ``local``, a GSM8K-style set with its trajectories from
``data.local_path`` (GPU profile). Both go through one gate (the ``sample_orz`` quality suite on the
problems, then well-formed-and-correct on the trajectories); the audit is an output, as ``sample_orz``'s.

Training: the warmups' SFT (``components.training.warmup.train_warmup``) from ``<init_from>/model`` with the
``parallel_r1`` tags made single special tokens, the Parallel-R1 instruction, and the mask and positions of
``parallel_r1.attention`` (unseen: the structure module's parallel ones; seen: causal).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from components.artifacts import atomic_dir
from components.config import PipelineConfig
from components.dag import StageIO
from components.data.pr1_coldstart import check_coldstart, load_rows, synthetic_rows, write_coldstart_audit
from components.data.pr1_problems import rules_of, seeded_subset
from components.data.problems import load_problems
from components.training.distributed import is_main_process
from components.training.warmup import WarmupPaths, train_warmup, warmup_job


def coldstart_rows(cfg: PipelineConfig, io: StageIO) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The rows the gate checks, and where they came from."""
    src = cfg.pr1_coldstart.data
    if src.source == "sample_orz":
        if cfg.sample_orz.source != "synthetic":
            raise ValueError(
                "pr1_coldstart.data.source=sample_orz renders trajectories with the synthetic task family, "
                f"but sample_orz.source is {cfg.sample_orz.source!r}; use pr1_coldstart.data.source=local "
                "with a cold-start set at pr1_coldstart.data.local_path"
            )
        problems = load_problems(io.input("sample_orz/problems"), "train")
        difficulties = src.difficulties or sorted({str(p.get("difficulty")) for p in problems})
        rows = synthetic_rows(problems, difficulties, src.n, cfg.parallel_r1.paths, src.seed)
        return rows, {"source": "sample_orz", "rendered": "synthetic", "difficulties": difficulties}
    rows, infos = load_rows(Path(src.local_path))
    return rows, {"source": "local", "path": src.local_path, "files": infos}


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # its mode follows parallel_r1.attention (components.config); its schema is parallel_r1's
    job = warmup_job("pr1_coldstart", cfg, WarmupPaths.of(io, cfg.pr1_coldstart.init_from))
    src = cfg.pr1_coldstart.data
    work = job.paths.work_dir
    rows, provenance = coldstart_rows(cfg, io)
    # every rank of a torchrun job gates the same rows (deterministic); only rank 0 writes the audit
    report = check_coldstart(rows, rules_of(src), cfg.grading)
    main = is_main_process()
    failed_dir = work / "audit-failed"
    try:
        report.raise_for_floor()
    except Exception:
        if main:
            shutil.rmtree(failed_dir, ignore_errors=True)
            write_coldstart_audit(report, failed_dir)
        raise
    reconciliation = report.reconciliation()
    if main:
        shutil.rmtree(failed_dir, ignore_errors=True)
        with atomic_dir(io.output("audit")) as tmp:
            reconciliation = write_coldstart_audit(report, tmp)
    kept = report.kept if src.source == "sample_orz" else seeded_subset(report.kept, src.n, src.seed)
    metrics = train_warmup(job, kept)
    return {
        "attention": cfg.parallel_r1.attention,
        "data": {
            **provenance,
            "rows_in": reconciliation["rows_in"],
            "kept": reconciliation["kept"],
            "quarantined": reconciliation["quarantined"],
            "duplicates": reconciliation["duplicates"],
            "trajectory_rejected": reconciliation["trajectory_rejected"],
            "trajectory_reasons": reconciliation["trajectory_reasons"],
            "trained_on": len(kept),
        },
        **metrics,
    }
