"""What ``npr grade`` and ``npr check-format`` do (components/cli.py calls these by name).

``--pred`` may be a bare answer (``\\frac{1}{2}``) or a whole response. The answer is read from it with the
``cli`` extraction settings (``grading.extraction.cli``): a box, Minerva's sentence or an answer line when
there is one; otherwise a single-line text is taken as the answer itself (so ``\\frac{1}{2}`` is not cut to
its last number), and only a multi-line text falls back to its last number (when ``last_number`` is among
the ``cli`` fallbacks). A JSONL record may carry a ``finish_reason``; a truncated response has no answer.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, TextIO

from components.grading.answers import extract_final
from components.grading.config import ExtractionConfig, GradingConfig
from components.grading.equivalence import grade_many_verdicts
from components.grading.normalize import gold_candidates
from components.structure.parse import parse_text
from components.structure.schemas import get_schema
from components.structure.score import is_valid, score_trace


def answer_of(pred: str, cfg: GradingConfig, finish_reason: str | None = None) -> str | None:
    """The answer in ``pred`` (a bare answer or a full response); see the module docstring."""
    settings = cfg.extraction.cli
    labelled = extract_final(
        pred,
        ExtractionConfig(
            fallbacks=[f for f in settings.fallbacks if f == "answer_line"],
            require_complete=settings.require_complete,
            labels=settings.labels,
        ),
        finish_reason,
    )
    if labelled.answer is not None or labelled.truncated:
        return labelled.answer
    text = pred.strip()
    if text and "\n" not in text:
        return text
    if "last_number" in settings.fallbacks:
        return extract_final(pred, ExtractionConfig(fallbacks=["last_number"], require_complete=False)).answer
    return None


def grade_pair(pred: str, gold: Any, cfg: GradingConfig | None = None) -> bool:
    """True when the answer in ``pred`` equals ``gold``."""
    cfg = cfg or GradingConfig()
    return grade_many_verdicts([(answer_of(pred, cfg), gold)], cfg)[0].equal


def _line_error(line_no: int, raw: str, error: str) -> dict[str, Any]:
    return {"line": line_no, "raw": raw, "error": error}


def grade_jsonl(path: Path | str, out: TextIO, cfg: GradingConfig | None = None) -> dict[str, int]:
    """Grade every line of a JSONL file with ``pred`` and ``gold`` fields; write each line back to ``out``.

    Each record is written in input order with ``equal`` added (and ``grade_reason`` when a pair could not
    be graded: timeout or worker crash; it is then False). A line that is not a JSON object, lacks a field,
    or has an unusable gold is written with an ``error`` field instead and grading carries on. Blank lines
    are skipped; a line that is not UTF-8 is an error row too. Returns counts: ``lines`` (non-blank),
    ``graded``, ``equal``, ``errors``, ``grade_failures``.
    """
    cfg = cfg or GradingConfig()
    rows: list[dict[str, Any]] = []
    pairs: list[tuple[str | None, Any]] = []
    where: list[int] = []  # rows[i] of the i-th gradeable pair
    with open(path, "rb") as handle:  # lines decoded one by one: a bad byte fails its line, not the batch
        for line_no, raw_bytes in enumerate(handle, start=1):
            raw_bytes = raw_bytes.rstrip(b"\r\n")
            try:
                raw = raw_bytes.decode("utf-8")
            except UnicodeDecodeError as err:
                text = raw_bytes.decode("utf-8", errors="backslashreplace")
                rows.append(
                    _line_error(
                        line_no,
                        text,
                        f"not UTF-8: byte 0x{raw_bytes[err.start]:02x} at column {err.start + 1}",
                    )
                )
                continue
            if not raw.strip():
                continue
            try:
                record = json.loads(raw)
            except json.JSONDecodeError as err:
                rows.append(_line_error(line_no, raw, f"not JSON: {err.msg} at column {err.colno}"))
                continue
            if not isinstance(record, dict):
                rows.append(_line_error(line_no, raw, f"not a JSON object but a {type(record).__name__}"))
                continue
            missing = [key for key in ("pred", "gold") if key not in record]
            if missing:
                rows.append({**record, "error": f"missing field(s): {', '.join(missing)}"})
                continue
            pred = record["pred"]
            if pred is not None and not isinstance(pred, str):
                rows.append({**record, "error": f"pred must be a string, got {type(pred).__name__}"})
                continue
            try:
                gold_candidates(record["gold"])  # checked here so one bad gold cannot fail the batch below
            except ValueError as err:
                rows.append({**record, "error": str(err)})
                continue
            where.append(len(rows))
            rows.append(record)
            reason = record.get("finish_reason")
            pairs.append(
                (
                    None if pred is None else answer_of(pred, cfg, None if reason is None else str(reason)),
                    record["gold"],
                )
            )

    verdicts = grade_many_verdicts(pairs, cfg)
    for row_index, verdict in zip(where, verdicts, strict=True):
        rows[row_index]["equal"] = verdict.equal
        if verdict.reason is not None:
            rows[row_index]["grade_reason"] = verdict.reason
    for row in rows:
        out.write(json.dumps(row, ensure_ascii=False) + "\n")
    out.flush()
    return {
        "lines": len(rows),
        "graded": len(verdicts),
        "equal": sum(v.equal for v in verdicts),
        "errors": sum("error" in row for row in rows),
        "grade_failures": sum(v.reason is not None for v in verdicts),
    }


def check_format_text(text: str, schema: str = "npr") -> dict[str, Any]:
    """``{"valid", "score", "violations": [{"code", "position", "reason"}]}`` for one response."""
    trace = parse_text(text, get_schema(schema))
    return {
        "valid": is_valid(trace),
        "score": score_trace(trace),
        "violations": [
            {"code": v.code, "position": v.position, "reason": v.reason} for v in trace.violations
        ],
    }
