"""Stage `sample_orz`: problem rows from the configured source -> quality gate -> seeded train/val/test sample.

Outputs (atomic): ``problems/`` (train-NNNNN.jsonl, val-NNNNN.jsonl, test-NNNNN.jsonl, manifest.json) and ``audit/``
(quarantine.jsonl, duplicates.jsonl, reconciliation.json, gx_docs/*.html). When too few rows pass the gate
(below ``min_kept_fraction``, or fewer than ``n + val_n + test_n``) the audit is written to
``artifacts/sample_orz/work/audit-failed`` and the stage raises DataQualityError naming that directory;
neither output is touched (DVC outputs are replaced only by a run that passes).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from components.artifacts import atomic_dir
from components.config import PipelineConfig
from components.dag import StageIO
from components.data import synthetic
from components.data.quality import DataQualityError, QualityRules, validate_problems, write_audit
from components.data.sampling import difficulty_counts, rows_sha256, split_problems, write_problem_splits
from components.data.sources import load_source_rows
from components.progress import track


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    sc = cfg.sample_orz
    work_dir = Path(io.output("problems")).parent / "work"
    with track("sample_orz", total=4, unit="phases", eta=False) as progress:
        progress.update(f"sample_orz: loading rows ({sc.source})")
        rows, provenance = load_source_rows(sc, work_dir)
        progress.advance(1, description=f"sample_orz: validating {len(rows)} rows (Great Expectations)")
        report = validate_problems(rows, QualityRules(sc.min_problem_chars, sc.max_problem_chars, sc.max_answer_chars, sc.min_kept_fraction))
        progress.advance(
            1, description=f"sample_orz: sampling {sc.n} + {sc.val_n} + {sc.test_n} of {len(report.kept)} kept"
        )
        return _sample_and_write(cfg, io, rows, provenance, report, progress)


def _sample_and_write(
    cfg: PipelineConfig, io: StageIO, rows: list, provenance: dict, report: Any, progress: Any
) -> dict[str, Any]:
    sc = cfg.sample_orz
    problems_dir, audit_dir = io.output("problems"), io.output("audit")
    work_dir = Path(problems_dir).parent / "work"
    failed_dir = work_dir / "audit-failed"
    shutil.rmtree(failed_dir, ignore_errors=True)
    # Synthetic problems carry their split in their id (the partition the tiny seed was built outside of).
    partition_of = synthetic.partition if sc.source == "synthetic" else None
    try:
        report.raise_for_floor()
        splits = split_problems(report.kept, sc.n, sc.test_n, sc.seed, sc.val_n, partition_of)
    except (DataQualityError, ValueError) as err:
        write_audit(report, failed_dir)
        raise DataQualityError(
            f"{err}. The audit of this run (quarantine.jsonl with each row's reasons and raw values, "
            f"reconciliation.json, gx_docs/index.html) is in {failed_dir}"
        ) from None
    train, val, test = splits["train"], splits["val"], splits["test"]
    manifest = {
        "source": provenance,
        "seed": sc.seed,
        "input_sha256": rows_sha256(rows),
        "rows_in": report.rows_in,
        "kept": len(report.kept),
        "config": sc.model_dump(mode="json"),
    }
    progress.advance(1, description="sample_orz: writing problems and audit")
    with atomic_dir(audit_dir) as tmp_audit:
        reconciliation = write_audit(report, tmp_audit)
    with atomic_dir(problems_dir) as tmp_problems:
        write_problem_splits(tmp_problems, train, test, sc.n_shards, manifest, val=val)
    progress.advance(1, description="sample_orz")

    return {
        "rows_in": reconciliation["rows_in"],
        "kept": reconciliation["kept"],
        "quarantined": reconciliation["quarantined"],
        "duplicates": reconciliation["duplicates"],
        "kept_fraction": reconciliation["kept_fraction"],
        "n_train": len(train),
        "n_val": len(val),
        "n_test": len(test),
        "per_difficulty": {
            "train": difficulty_counts(train),
            "val": difficulty_counts(val),
            "test": difficulty_counts(test),
        },
        "quarantine_reasons": reconciliation["quarantine_reasons"],
    }
