"""Data-quality gate for problem rows: a Great Expectations suite built in code, quarantine, reconciliation.

Two suites run on a pandas frame derived from the rows (ephemeral GX context, no files, no telemetry):

* ``problem_rows`` (every row): problem and answer present and of a usable type (the problem text, the
  answer text or a finite number: a numeric problem, a NaN, boolean, list or dict answer is quarantined as
  ``problem_not_text`` / ``answer_not_finite`` / ``answer_wrong_type`` with its raw value, which the reader
  keeps in ``raw_fields``), non-empty, problem length in bounds, answer not absurdly long, text free of NULs
  and undecodable bytes. A row failing any of them is quarantined with all its reasons.
* ``problem_uniqueness`` (rows that passed): unique ids and no duplicate problems after whitespace
  normalisation. GX flags every member of a duplicate group; the first occurrence is kept and the others
  are recorded as duplicates of it (counted separately from quarantine).

Finally both suites run again on the kept rows and must pass. ``rows_in == kept + quarantined +
duplicates`` is checked, and ``QualityReport.raise_for_floor`` fails loudly when too few rows survive.
Data docs: each validation result rendered to HTML with GX's own renderer.

GX is imported lazily (about 5 s) so that importing this module stays cheap.
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.artifacts import write_json
from components.data.problems import normalise_whitespace
from components.errors import UserError

# Lone surrogates (bytes that were not UTF-8, kept by surrogateescape) cannot enter pandas' Arrow strings;
# they become U+FFFD in the checked frame, and the text check flags U+FFFD and NUL.
_SURROGATES = re.compile("[\ud800-\udfff]")
INVALID_TEXT_REGEX = "[\x00\ufffd]"


class DataQualityError(UserError, RuntimeError):
    """Too few rows survived the quality gate, or the counts do not reconcile."""


@dataclass(frozen=True)
class QualityRules:
    min_problem_chars: int
    max_problem_chars: int
    max_answer_chars: int
    min_kept_fraction: float


@dataclass
class QualityReport:
    """The outcome of the gate: kept rows, removed rows with reasons, and the GX results."""

    kept: list[dict[str, Any]]
    quarantined: list[dict[str, Any]]
    duplicates: list[dict[str, Any]]
    rows_in: int
    rules: QualityRules
    expectations: list[dict[str, Any]] = field(default_factory=list)
    html: dict[str, str] = field(default_factory=dict)

    @property
    def kept_fraction(self) -> float:
        return len(self.kept) / self.rows_in if self.rows_in else 0.0

    def reconciliation(self) -> dict[str, Any]:
        reasons = Counter(r for row in self.quarantined for r in row["reasons"])
        dup_reasons = Counter(row["reason"] for row in self.duplicates)
        balanced = self.rows_in == len(self.kept) + len(self.quarantined) + len(self.duplicates)
        return {
            "rows_in": self.rows_in,
            "kept": len(self.kept),
            "quarantined": len(self.quarantined),
            "duplicates": len(self.duplicates),
            "balanced": balanced,
            "kept_fraction": round(self.kept_fraction, 6),
            "min_kept_fraction": self.rules.min_kept_fraction,
            "quarantine_reasons": dict(sorted(reasons.items())),
            "duplicate_reasons": dict(sorted(dup_reasons.items())),
            "rules": self.rules.__dict__,
            "expectations": self.expectations,
        }

    def raise_for_floor(self) -> None:
        """Raise DataQualityError when counts do not reconcile or the kept fraction is below the floor."""
        rec = self.reconciliation()
        if not rec["balanced"]:
            raise DataQualityError(f"counts do not reconcile: {rec}")
        if self.kept_fraction < self.rules.min_kept_fraction:
            raise DataQualityError(
                f"only {len(self.kept)}/{self.rows_in} rows ({self.kept_fraction:.1%}) passed the quality gate, "
                f"below sample_orz.min_kept_fraction={self.rules.min_kept_fraction}; quarantined by reason: "
                f"{rec['quarantine_reasons']}, duplicates: {rec['duplicate_reasons']}"
            )


def _checked_text(value: Any) -> str | None:
    if not isinstance(value, str):
        return None
    return normalise_whitespace(_SURROGATES.sub("\ufffd", value))


def value_type(row: dict[str, Any], field: str) -> str:
    """What ``row[field]`` held in the source: ``text``, ``number``, ``non_finite``, ``bool``, ``list``,
    ``dict``, ``missing``, ... (the raw value the reader set aside in ``raw_fields`` when there is one)."""
    raw = (row.get("raw_fields") or {}).get(field)
    if raw is not None:
        kind, value = raw["type"], raw["value"]
        if kind == "float" and value in ("NaN", "Infinity", "-Infinity"):
            return "non_finite"
        return {"int": "number", "float": "number", "str": "text"}.get(kind, kind)
    value = row.get(field)
    if value is None:
        return "missing"
    if isinstance(value, str):
        return "text"
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int | float):
        return "number" if math.isfinite(value) else "non_finite"
    return type(value).__name__


def checked_frame(rows: list[dict[str, Any]]) -> Any:
    """The frame the suites see: id, whitespace-normalised problem and answer text (None unless text) and
    what type each field had."""
    import pandas as pd  # lazy: pandas

    return pd.DataFrame(
        {
            "id": [r.get("id") for r in rows],
            "problem": [_checked_text(r.get("problem")) for r in rows],
            "answer": [_checked_text(r.get("answer")) for r in rows],
            "problem_type": [value_type(r, "problem") for r in rows],
            "answer_type": [value_type(r, "answer") for r in rows],
        },
        dtype=object,
    )


def row_expectations(rules: QualityRules) -> list[tuple[str, Any]]:
    """(reason, GX expectation) for every per-row check."""
    import great_expectations.expectations as gxe  # lazy: great_expectations

    return [
        ("problem_missing", gxe.ExpectColumnValuesToNotBeInSet(column="problem_type", value_set=["missing"])),
        (
            "problem_not_text",
            gxe.ExpectColumnValuesToBeInSet(column="problem_type", value_set=["text", "missing"]),
        ),
        ("answer_missing", gxe.ExpectColumnValuesToNotBeInSet(column="answer_type", value_set=["missing"])),
        (
            "answer_not_finite",
            gxe.ExpectColumnValuesToNotBeInSet(column="answer_type", value_set=["non_finite"]),
        ),
        (
            "answer_wrong_type",
            gxe.ExpectColumnValuesToBeInSet(
                column="answer_type", value_set=["text", "number", "non_finite", "missing"]
            ),
        ),
        ("problem_empty", gxe.ExpectColumnValueLengthsToBeBetween(column="problem", min_value=1)),
        ("answer_empty", gxe.ExpectColumnValueLengthsToBeBetween(column="answer", min_value=1)),
        (
            "problem_too_short",
            gxe.ExpectColumnValueLengthsToBeBetween(column="problem", min_value=rules.min_problem_chars),
        ),
        (
            "problem_too_long",
            gxe.ExpectColumnValueLengthsToBeBetween(column="problem", max_value=rules.max_problem_chars),
        ),
        (
            "answer_too_long",
            gxe.ExpectColumnValueLengthsToBeBetween(column="answer", max_value=rules.max_answer_chars),
        ),
        (
            "problem_invalid_text",
            gxe.ExpectColumnValuesToNotMatchRegex(column="problem", regex=INVALID_TEXT_REGEX),
        ),
        (
            "answer_invalid_text",
            gxe.ExpectColumnValuesToNotMatchRegex(column="answer", regex=INVALID_TEXT_REGEX),
        ),
    ]


def uniqueness_expectations() -> list[tuple[str, Any]]:
    import great_expectations.expectations as gxe  # lazy: great_expectations

    return [
        ("duplicate_id", gxe.ExpectColumnValuesToBeUnique(column="id")),
        ("duplicate_problem", gxe.ExpectColumnValuesToBeUnique(column="problem")),
    ]


class _Validator:
    """An ephemeral GX context with one pandas batch definition; validates frames against named suites."""

    def __init__(self) -> None:
        import great_expectations as gx  # lazy: great_expectations
        from great_expectations.data_context.types.base import ProgressBarsConfig  # lazy: great_expectations

        self._gx = gx
        self.context = gx.get_context(mode="ephemeral")
        # TQDM_DISABLE does not reach GX's bars; this does.
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        asset = self.context.data_sources.add_pandas(name="problems").add_dataframe_asset(name="rows")
        self.batch = asset.add_batch_definition_whole_dataframe("whole")

    def run(self, name: str, checks: list[tuple[str, Any]], frame: Any) -> tuple[Any, dict[str, list[int]]]:
        """Validate; returns the GX result and, per reason, the frame index labels that failed."""
        gx = self._gx
        for reason, expectation in checks:
            expectation.meta = {"reason": reason}
        suite = self.context.suites.add(gx.ExpectationSuite(name=name, expectations=[e for _, e in checks]))
        definition = self.context.validation_definitions.add(
            gx.ValidationDefinition(name=name, data=self.batch, suite=suite)
        )
        result = definition.run(batch_parameters={"dataframe": frame}, result_format="COMPLETE")
        failed: dict[str, list[int]] = {}
        for res in result.results:
            reason = res.expectation_config.meta["reason"]
            if res.exception_info and res.exception_info.get("raised_exception"):
                raise DataQualityError(f"GX expectation {reason} raised: {res.exception_info}")
            failed[reason] = [int(i) for i in (res.result.get("unexpected_index_list") or [])]
        return result, failed


def _summary(suite: str, result: Any) -> list[dict[str, Any]]:
    return [
        {
            "suite": suite,
            "reason": r.expectation_config.meta["reason"],
            "expectation": r.expectation_config.type,
            "column": r.expectation_config.kwargs.get("column"),
            "success": bool(r.success),
            "unexpected_count": int(r.result.get("unexpected_count") or 0),
        }
        for r in result.results
    ]


def render_html(result: Any) -> str:
    """One validation result as a standalone HTML page (GX's data-docs renderer)."""
    from great_expectations.render.renderer import ValidationResultsPageRenderer  # lazy: great_expectations
    from great_expectations.render.view import DefaultJinjaPageView  # lazy: great_expectations

    return DefaultJinjaPageView().render(ValidationResultsPageRenderer().render(result))


def validate_problems(rows: list[dict[str, Any]], rules: QualityRules) -> QualityReport:
    """Run the gate on rows (dicts with id, problem, answer, ...); nothing is dropped without a record."""
    validator = _Validator()
    frame = checked_frame(rows)
    rows_result, row_failures = validator.run("problem_rows", row_expectations(rules), frame)

    reasons: dict[int, list[str]] = defaultdict(list)
    for reason, idx in row_failures.items():
        for i in idx:
            reasons[i].append(reason)
    quarantined = [{**rows[i], "reasons": reasons[i]} for i in sorted(reasons)]
    survivors = frame.drop(index=list(reasons))

    unique_result, unique_failures = validator.run("problem_uniqueness", uniqueness_expectations(), survivors)
    duplicates: list[dict[str, Any]] = []
    dropped: set[int] = set()
    for reason, column in (("duplicate_id", "id"), ("duplicate_problem", "problem")):
        first_of: dict[Any, int] = {}
        for i in sorted(unique_failures[reason]):
            if i in dropped:
                continue
            key = frame.at[i, column]
            if key not in first_of:
                first_of[key] = i
                continue
            kept_row = rows[first_of[key]]
            dropped.add(i)
            duplicates.append(
                {
                    **rows[i],
                    "reason": reason,
                    "duplicate_of": kept_row["id"],
                    "answer_conflict": frame.at[i, "answer"] != frame.at[first_of[key], "answer"],
                }
            )
    kept_index = [i for i in survivors.index if i not in dropped]
    kept = [rows[i] for i in kept_index]

    # The kept rows must now pass everything: a failure here is a bug in the gate, not in the data.
    final_frame = frame.loc[kept_index]
    final_rows, _ = validator.run("kept_rows", row_expectations(rules), final_frame)
    final_unique, _ = validator.run("kept_uniqueness", uniqueness_expectations(), final_frame)
    if not (final_rows.success and final_unique.success):
        raise DataQualityError("kept rows fail the quality suites after quarantine and de-duplication")

    report = QualityReport(
        kept=kept, quarantined=quarantined, duplicates=duplicates, rows_in=len(rows), rules=rules
    )
    report.expectations = _summary("problem_rows", rows_result) + _summary(
        "problem_uniqueness", unique_result
    )
    results = {
        "problem_rows": rows_result,
        "problem_uniqueness": unique_result,
        "kept_rows": final_rows,
        "kept_uniqueness": final_unique,
    }
    report.html = {name: render_html(result) for name, result in results.items()}
    return report


def write_escaped_jsonl(path: Path, records: list[dict[str, Any]]) -> int:
    """JSONL with non-ASCII escaped, so rows holding lone surrogates are written exactly, not lost."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("w", encoding="ascii") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=True, sort_keys=True) + "\n")
    return len(records)


def write_audit(report: QualityReport, audit_dir: Path) -> dict[str, Any]:
    """quarantine.jsonl, duplicates.jsonl, reconciliation.json and gx_docs/*.html into ``audit_dir``."""
    audit_dir = Path(audit_dir)
    write_escaped_jsonl(audit_dir / "quarantine.jsonl", report.quarantined)
    write_escaped_jsonl(audit_dir / "duplicates.jsonl", report.duplicates)
    rec = report.reconciliation()
    write_json(audit_dir / "reconciliation.json", rec)
    docs = audit_dir / "gx_docs"
    docs.mkdir(parents=True, exist_ok=True)
    links = []
    for name, html in report.html.items():
        (docs / f"{name}.html").write_text(html, encoding="utf-8")
        links.append(f'<li><a href="{name}.html">{name}</a></li>')
    (docs / "index.html").write_text(
        "<!doctype html><html><head><meta charset='utf-8'><title>sample_orz data quality</title></head><body>"
        f"<h1>sample_orz data quality</h1><p>rows in {rec['rows_in']}, kept {rec['kept']}, quarantined "
        f"{rec['quarantined']}, duplicates {rec['duplicates']}</p><ul>{''.join(links)}</ul></body></html>\n",
        encoding="utf-8",
    )
    return rec
