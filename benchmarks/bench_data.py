"""Data stage costs on the full real ORZ subset available offline, measured side by side in one run.

1. Stage `sample_orz` (source=local) on the 2048-record ORZ file plus the 2725 complete records of the
   truncated 72k file, after `npr data fetch --from` copied them: wall time and rows/s, split into
   read, quality gate and sample+write.
2. The quality checks done two ways on the same rows: the GX suites (two validations, as in the gate) and
   the same checks in plain pandas (isnull / str.len / str.contains / duplicated); printed as a ratio,
   plus the one-off GX import and the data-docs rendering the gate also does.

Run: ``.venv/bin/python benchmarks/bench_data.py [--from ../shared/data] [--repeats 3]``; ``--smoke``
(benchmarks/_smoke.py): the same rows, one repeat of the check timings.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402
from components.config import load_config  # noqa: E402
from components.dag import StageIO  # noqa: E402
from components.data.fetch import fetch_data  # noqa: E402
from components.data.orz import load_orz_rows  # noqa: E402
from components.data.quality import (  # noqa: E402
    INVALID_TEXT_REGEX,
    QualityRules,
    _Validator,
    checked_frame,
    row_expectations,
    uniqueness_expectations,
    validate_problems,
)
from components.stages import sample_orz  # noqa: E402


def pandas_checks(frame, rules: QualityRules) -> dict[str, int]:
    """The gate's checks in plain pandas: failing-row counts per reason (for the timing comparison)."""
    problem, answer = frame["problem"], frame["answer"]
    ptype, atype = frame["problem_type"], frame["answer_type"]
    plen, alen = problem.str.len(), answer.str.len()
    out = {
        "problem_missing": int((ptype == "missing").sum()),
        "problem_not_text": int((~ptype.isin(["text", "missing"])).sum()),
        "answer_missing": int((atype == "missing").sum()),
        "answer_not_finite": int((atype == "non_finite").sum()),
        "answer_wrong_type": int((~atype.isin(["text", "number", "non_finite", "missing"])).sum()),
        "problem_empty": int((plen < 1).sum()),
        "answer_empty": int((alen < 1).sum()),
        "problem_too_short": int((plen < rules.min_problem_chars).sum()),
        "problem_too_long": int((plen > rules.max_problem_chars).sum()),
        "answer_too_long": int((alen > rules.max_answer_chars).sum()),
        "problem_invalid_text": int(problem.str.contains(INVALID_TEXT_REGEX, regex=True, na=False).sum()),
        "answer_invalid_text": int(answer.str.contains(INVALID_TEXT_REGEX, regex=True, na=False).sum()),
        "duplicate_id": int(frame["id"].duplicated(keep=False).sum()),
        "duplicate_problem": int(problem.dropna().duplicated(keep=False).sum()),
    }
    return out


def _best(fn, repeats: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return min(times), result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--from", dest="source", type=Path, default=Path(__file__).resolve().parents[2] / "shared" / "data"
    )
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, None, repeats=1)

    cfg = load_config(profile="tiny")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        fetched = fetch_data(cfg.sample_orz, tmp / "data", args.source)
        orz_dir = tmp / "data" / "orz"

        t0 = time.perf_counter()
        rows, infos = load_orz_rows(orz_dir, recover_truncated=True)
        read_s = time.perf_counter() - t0

        t0 = time.perf_counter()
        import great_expectations  # noqa: F401  (one-off import cost, reported separately)

        import_s = time.perf_counter() - t0
        rules = QualityRules(5, 8000, 200, 0.9)
        t0 = time.perf_counter()
        report = validate_problems(rows, rules)
        gate_s = time.perf_counter() - t0

        cfg.sample_orz = cfg.sample_orz.model_copy(
            update={
                "source": "local",
                "local_path": str(orz_dir),
                "recover_truncated": True,
                "test_n": 200,
                # every kept row is sampled: train = what the test and validation splits leave
                "n": len(report.kept) - 200 - cfg.sample_orz.val_n,
                "max_problem_chars": 8000,
                "max_answer_chars": 200,
                "n_shards": 4,
            }
        )
        io = StageIO(
            stage="sample_orz", outputs={"problems": tmp / "out" / "problems", "audit": tmp / "out" / "audit"}
        )
        t0 = time.perf_counter()
        metrics = sample_orz.run(cfg, io)
        stage_s = time.perf_counter() - t0

        frame = checked_frame(rows)
        validator = _Validator()

        def gx_checks():
            # Suite names must be unique within a context; the run counter keeps them so.
            tag = time.perf_counter_ns()
            _, rows_failed = validator.run(f"rows_{tag}", row_expectations(rules), frame)
            _, unique_failed = validator.run(f"unique_{tag}", uniqueness_expectations(), frame)
            return {k: len(v) for k, v in {**rows_failed, **unique_failed}.items()}

        gx_s, gx_counts = _best(gx_checks, args.repeats)
        pd_s, pd_counts = _best(lambda: pandas_checks(frame, rules), args.repeats)

    result = {
        "rows_in": len(rows),
        "files": [{"file": Path(i.path).name, "items": i.items, "truncated": i.truncated} for i in infos],
        "fetch_copied": len(fetched["copied"]) + len(fetched["unchanged"]),
        "stage": {
            "wall_s": round(stage_s, 3),
            "rows_per_s": round(len(rows) / stage_s, 1),
            "kept": metrics["kept"],
            "quarantined": metrics["quarantined"],
            "duplicates": metrics["duplicates"],
            "quarantine_reasons": metrics["quarantine_reasons"],
            "n_train": metrics["n_train"],
            "n_test": metrics["n_test"],
        },
        "phases_s": {
            "read": round(read_s, 3),
            "quality_gate_with_docs": round(gate_s, 3),
            "gx_import_once": round(import_s, 3),
        },
        "checks": {
            "gx_two_suites_s": round(gx_s, 4),
            "pandas_same_checks_s": round(pd_s, 4),
            "gx_over_pandas": round(gx_s / pd_s, 1),
            "gate_with_docs_over_pandas": round(gate_s / pd_s, 1),
            "same_failure_counts": gx_counts == pd_counts,
        },
    }
    print(json.dumps(result, indent=2))
    if gx_counts != pd_counts:
        print("MISMATCH gx vs pandas:", json.dumps({"gx": gx_counts, "pandas": pd_counts}), file=sys.stderr)
        raise SystemExit(1)
    print(
        f"\nsample_orz on {len(rows)} real ORZ rows: {result['stage']['rows_per_s']} rows/s "
        f"({stage_s:.2f} s); GX checks are {result['checks']['gx_over_pandas']}x plain pandas "
        f"({gx_s * 1e3:.0f} ms vs {pd_s * 1e3:.1f} ms); GX import {import_s:.1f} s once per process."
    )


if __name__ == "__main__":
    main()
