"""Stage ``reject_filter``: keep a trajectory only if it is correct AND format-valid (NPR stage 2).

Every sampled trajectory lands in exactly one bucket, by the first rule it fails:

1. ``rejected_other`` / ``bad_record``: fields missing or of the wrong type;
2. ``rejected_wrong``: the answer is not correct;
3. ``rejected_format``: correct but the format is not valid;
4. ``rejected_other``: ``empty``, ``too_short`` / ``too_long`` (``min/max_response_tokens``), ``truncated``
   (not ended by end-of-turn), ``duplicate`` (same response text as an accepted one of that problem),
   ``over_cap`` (the problem already has ``max_accepted_per_problem``);

and ``sampled == accepted + rejected_wrong + rejected_format + rejected_other`` is checked before anything
is written. Rejected records go to ``audit/quarantine-NNNNN.jsonl`` with their reasons (every failing
rule, not only the first). A Great Expectations suite then checks the accepted set (schema, non-empty,
token bounds, no duplicates, acceptance rate per difficulty >= ``min_acceptance_rate``); its report is
written to ``audit/gx_report.json`` and a failing suite fails the stage. ``accepted/part-NNNNN.jsonl`` holds
the accepted trajectory records unchanged: the input of ``parallel_warmup`` and ``sequential_warmup``.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

from components.artifacts import atomic_dir, read_shards, write_json, write_shards
from components.config import PipelineConfig
from components.dag import StageIO
from components.data.acceptance import filter_trajectories
from components.data.config import RejectFilterConfig
from components.errors import UserError
from components.progress import track


class QualityGateError(UserError, RuntimeError):
    """The accepted set failed its Great Expectations suite."""


def acceptance_by_difficulty(
    records: list[dict[str, Any]], accepted: list[dict[str, Any]]
) -> dict[str, float]:
    """Per difficulty: the fraction of PROBLEMS with at least one accepted trajectory."""
    problems: dict[str, set[str]] = defaultdict(set)
    for r in records:
        problems[str(r.get("difficulty"))].add(str(r.get("problem_id")))
    hit = {str(r["problem_id"]) for r in accepted}
    return {d: len(ids & hit) / len(ids) for d, ids in sorted(problems.items())}


def validate_accepted(
    accepted: list[dict[str, Any]], rates: dict[str, float], cfg: RejectFilterConfig
) -> dict[str, Any]:
    """Run the Great Expectations suite on the accepted set; returns a JSON-ready report."""
    import great_expectations as gx  # lazy: great_expectations
    import great_expectations.expectations as gxe  # lazy: great_expectations
    import pandas as pd  # lazy: pandas
    from great_expectations.data_context.types.base import ProgressBarsConfig  # lazy: great_expectations

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = ProgressBarsConfig(globally=False)
    source = context.data_sources.add_pandas(name="reject_filter")
    frame = pd.DataFrame(
        [
            {
                "problem_id": r["problem_id"],
                "sample_idx": r["sample_idx"],
                "response": r["response"],
                "n_tokens": r["n_tokens"],
                "correct": r["correct"],
                "valid": r["valid"],
                "key": f"{r['problem_id']}#{r['sample_idx']}",
                "dedup": f"{r['problem_id']}\n{r['response']}",
            }
            for r in accepted
        ],
        columns=["problem_id", "sample_idx", "response", "n_tokens", "correct", "valid", "key", "dedup"],
    )
    suite = gx.ExpectationSuite(
        name="accepted_trajectories",
        expectations=[
            gxe.ExpectTableRowCountToBeBetween(min_value=1),
            *[
                gxe.ExpectColumnToExist(column=c)
                for c in ("problem_id", "sample_idx", "response", "n_tokens")
            ],
            gxe.ExpectColumnValuesToNotBeNull(column="response"),
            gxe.ExpectColumnValueLengthsToBeBetween(column="response", min_value=1),
            gxe.ExpectColumnValuesToBeBetween(
                column="n_tokens", min_value=cfg.min_response_tokens, max_value=cfg.max_response_tokens
            ),
            gxe.ExpectColumnValuesToBeInSet(column="correct", value_set=[True]),
            gxe.ExpectColumnValuesToBeInSet(column="valid", value_set=[True]),
            gxe.ExpectColumnValuesToBeUnique(column="key"),
            gxe.ExpectColumnValuesToBeUnique(column="dedup"),
        ],
    )
    batch = source.add_dataframe_asset(name="accepted").add_batch_definition_whole_dataframe("all")
    result = batch.get_batch(batch_parameters={"dataframe": frame}).validate(suite)
    rate_frame = pd.DataFrame({"difficulty": list(rates), "rate": list(rates.values())})
    rate_batch = source.add_dataframe_asset(name="rates").add_batch_definition_whole_dataframe("all")
    rate_result = rate_batch.get_batch(batch_parameters={"dataframe": rate_frame}).validate(
        gxe.ExpectColumnValuesToBeBetween(column="rate", min_value=cfg.min_acceptance_rate, max_value=1.0)
    )
    checks = [
        {
            "expectation": r.expectation_config.type,
            "column": r.expectation_config.kwargs.get("column"),
            "success": bool(r.success),
            "unexpected_count": (r.result or {}).get("unexpected_count"),
        }
        for r in result.results
    ]
    checks.append(
        {
            "expectation": "acceptance_rate_per_difficulty",
            "column": "rate",
            "success": bool(rate_result.success),
            "unexpected_count": (rate_result.result or {}).get("unexpected_count"),
        }
    )
    return {
        "success": all(c["success"] for c in checks),
        "checks": checks,
        "acceptance_rate_by_difficulty": rates,
    }


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    fcfg = cfg.reject_filter
    with track("reject_filter: reading trajectories", total=3, unit="phases", eta=False) as progress:
        records = read_shards(io.input("distill/trajectories"))
        progress.advance(1, description=f"reject_filter: filtering {len(records)} trajectories")
        accepted, quarantined, counts = filter_trajectories(records, fcfg)
        rates = acceptance_by_difficulty(records, accepted)
        progress.advance(
            1, description=f"reject_filter: validating {len(accepted)} accepted (Great Expectations)"
        )
        if accepted:
            report = validate_accepted(accepted, rates, fcfg)
        else:
            report = {"success": False, "checks": [], "acceptance_rate_by_difficulty": rates}
        progress.advance(1, description="reject_filter", accepted=len(accepted))
    reasons = Counter(reason for q in quarantined for reason in q["reject_reasons"])
    with atomic_dir(io.output("audit")) as audit:
        write_shards(
            audit, quarantined, n_shards=max(1, math.ceil(len(quarantined) / 4096)), stem="quarantine"
        )
        write_json(audit / "reconciliation.json", counts | {"reasons": dict(reasons)})
        write_json(audit / "gx_report.json", report)
    if not report["success"]:
        failed = [c["expectation"] for c in report["checks"] if not c["success"]] or [
            "no accepted trajectories"
        ]
        raise QualityGateError(f"accepted set failed its quality suite: {failed}; see {io.output('audit')}")
    with atomic_dir(io.output("accepted")) as out:
        write_shards(out, accepted, n_shards=max(1, math.ceil(len(accepted) / 4096)))
    return counts | {
        "acceptance_rate": counts["accepted"] / counts["sampled"] if counts["sampled"] else 0.0,
        "problems": len({str(r.get("problem_id")) for r in records}),
        "problems_accepted": len({r["problem_id"] for r in accepted}),
        "reasons": dict(reasons),
        "acceptance_rate_by_difficulty": rates,
        "gx_success": report["success"],
    }
