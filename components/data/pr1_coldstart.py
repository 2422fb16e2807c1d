"""The Parallel-R1 cold-start set: parallel trajectories, through one quality gate (the paper: of easy
problems; the tiny profile: of every difficulty).

Parallel-R1 (arXiv 2509.07980) starts its curriculum with SFT on parallel traces that a strong model wrote
for easy problems when prompted with the parallel format (their GSM8K set), kept when well formed. Rows are
``{id, problem, answer, source, difficulty, response, origin}``; ``response`` is the assistant text in the
``parallel_r1`` schema (``<Parallel><Path>...</Path>...</Parallel><Summary>...</Summary>`` blocks, then a
``Final Answer:`` line) without the end-of-turn token.

Two sources, one gate (``check_coldstart``):

- ``synthetic`` (tiny profile): the problems of ``sample_orz``'s train split of the configured
  difficulties, each rendered by ``render_trajectory`` with the synthetic generator's public API
  (``expression_of``, ``Expression.step_text``, ``Expression.takeaway``): one block whose paths each solve
  the whole problem on their own (bracket by bracket, named ``Bracket i:``), a summary that reconciles
  them, the answer line. The paths of a block are decoded from the same context (that is what makes them
  parallel), so they can only differ by sampling: they are alternative attempts, as Parallel-R1's are, not
  a split of the work;
- ``local`` (GPU profile): JSON / JSONL files under a directory, GSM8K-style
  (``question``/``problem``, ``answer`` (GSM8K's ``... #### 42`` reduced to ``42``), ``response``/
  ``trajectory``).

The gate: the problem rows pass the same Great Expectations suite as ``sample_orz`` (present, lengths, text,
unique ids and problems; ``components.data.quality``), then each response must be a well-formed trace of
the schema (no format violation, so at least one complete block) whose final answer the grader finds equal
to the gold. Rejected rows are kept with their reasons (``quarantine.jsonl``); counts reconcile and a kept
fraction below the floor raises ``DataQualityError``.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.artifacts import write_json
from components.data.problem_files import PROBLEM_KEYS, first_field, gold_of, problem_text, read_files
from components.data.problems import content_id
from components.data.quality import (
    DataQualityError,
    QualityReport,
    QualityRules,
    validate_problems,
    write_audit,
    write_escaped_jsonl,
)
from components.data.synthetic import expression_of

SOURCE = "pr1_coldstart"
SCHEMA = "parallel_r1"
_RESPONSE_KEYS = ("response", "trajectory")


# ----------------------------------------------------------------------------------------- rendering
def _attempt(expr: Any) -> str:
    """One path: every bracket worked out to its named value, in order and named as the seed's sequential
    solutions name them (``Bracket 2: ...``), then the combination of the named values. Paths drawn from
    the last bracket, without the names, were copied wrong: a 240-step cold start on them scored 9% on val
    (issue 27, docs/results.md)."""
    steps = " ".join(f"Bracket {i}: {expr.step_text(i)}." for i in range(1, len(expr.parts) + 1))
    return f"{steps} So {expr.takeaway}"


def render_trajectory(record: Mapping[str, Any], paths: int, rng: random.Random) -> str:
    """The Parallel-R1 response to a synthetic problem record (module docstring), in canonical layout.

    ``paths`` independent attempts in one block (each solving the whole problem, see ``_attempt``), a summary
    that states their common value, then ``Final Answer: <value>``. ``rng`` is kept for the call's symmetry
    with the other renderers; the rendering has one form (its paths differ only when sampled).
    """
    if paths < 2:
        raise ValueError(f"a Parallel-R1 block needs at least 2 paths, got {paths}")
    expr = expression_of(record)
    body = "".join(f"<Path>{_attempt(expr)}</Path>" for _ in range(paths))
    who = "both paths" if paths == 2 else f"all {paths} paths"
    return (
        f"<Parallel>{body}</Parallel><Summary>{who} give {expr.value}</Summary>\nFinal Answer: {expr.value}"
    )


def synthetic_rows(
    problems: Sequence[Mapping[str, Any]],
    difficulties: Sequence[str],
    n: int | None,
    paths: int,
    seed: int,
) -> list[dict[str, Any]]:
    """Cold-start rows rendered for the problems of the given difficulties (at most ``n``, seeded choice)."""
    chosen = [dict(p) for p in problems if p.get("difficulty") in set(difficulties)]
    if not chosen:
        raise ValueError(
            f"no problem of difficulty {list(difficulties)} among {len(problems)} training problems "
            "(pr1_coldstart.difficulties)"
        )
    rng = random.Random(seed)
    chosen.sort(key=lambda p: str(p["id"]))
    rng.shuffle(chosen)
    if n is not None:
        chosen = chosen[:n]
    rows = []
    for p in chosen:
        rows.append(
            {
                "id": str(p["id"]),
                "problem": p["problem"],
                "answer": str(p["answer"]),
                "source": SOURCE,
                "difficulty": p.get("difficulty"),
                "response": render_trajectory(p, paths, rng),
                "origin": f"synthetic#{p['id']}",
            }
        )
    return rows


# ----------------------------------------------------------------------------------------- local files
def normalise_item(item: Any, origin: str) -> dict[str, Any]:
    """One raw record as a cold-start row; fields it lacks are None (quarantined by the gate, never dropped)."""
    problem = answer = response = None
    difficulty = None
    if isinstance(item, Mapping):
        problem = problem_text(first_field(item, PROBLEM_KEYS))
        answer = gold_of(item)
        raw_response = first_field(item, _RESPONSE_KEYS)
        response = raw_response if isinstance(raw_response, str) else None
        difficulty = item.get("difficulty")
    return {
        "id": content_id(problem or "", answer or ""),
        "problem": problem,
        "answer": answer,
        "source": SOURCE,
        "difficulty": difficulty,
        "response": response,
        "origin": origin,
    }


def load_rows(path: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Rows of every cold-start file at ``path`` (JSON, JSONL, parquet) in file order, and per-file info."""
    records, infos = read_files(Path(path), "cold-start")
    return [normalise_item(item, origin) for origin, item in records], infos


# ----------------------------------------------------------------------------------------- the gate
@dataclass
class ColdStartReport:
    """The problem gate's report plus the trajectory checks: ``kept`` rows are the SFT set."""

    problems: QualityReport
    kept: list[dict[str, Any]]
    rejected: list[dict[str, Any]]
    min_kept_fraction: float

    @property
    def rows_in(self) -> int:
        return self.problems.rows_in

    def reconciliation(self) -> dict[str, Any]:
        rec = self.problems.reconciliation()
        reasons = Counter(r for row in self.rejected for r in row["reasons"])
        removed = len(self.problems.quarantined) + len(self.problems.duplicates) + len(self.rejected)
        n_out = len(self.kept) + removed
        return {
            **rec,
            "kept": len(self.kept),
            "trajectory_rejected": len(self.rejected),
            "trajectory_reasons": dict(sorted(reasons.items())),
            "balanced": self.rows_in == n_out,
            "kept_fraction": round(len(self.kept) / self.rows_in, 6) if self.rows_in else 0.0,
            "min_kept_fraction": self.min_kept_fraction,
        }

    def raise_for_floor(self) -> None:
        rec = self.reconciliation()
        if not rec["balanced"]:
            raise DataQualityError(f"cold-start counts do not reconcile: {rec}")
        if rec["kept_fraction"] < self.min_kept_fraction:
            raise DataQualityError(
                f"only {len(self.kept)}/{self.rows_in} cold-start rows ({rec['kept_fraction']:.1%}) passed, "
                f"below pr1_coldstart.min_kept_fraction={self.min_kept_fraction}; problems quarantined by reason: "
                f"{rec['quarantine_reasons']}, trajectories rejected by reason: {rec['trajectory_reasons']}"
            )


def check_coldstart(rows: list[dict[str, Any]], rules: QualityRules, grading: Any) -> ColdStartReport:
    """The problem suite (``quality.validate_problems``), then the trajectory checks on what it kept."""
    from components.grading.judge import judge_many  # lazy: torch

    problems = validate_problems(rows, rules)
    candidates: list[dict[str, Any]] = []
    rejected: list[dict[str, Any]] = []
    for row in problems.kept:
        if isinstance(row.get("response"), str) and row["response"].strip():
            candidates.append(row)
        else:
            rejected.append({**row, "reasons": ["response_missing"]})
    responses, golds = [r["response"] for r in candidates], [r["answer"] for r in candidates]
    judgements = judge_many(responses, golds, SCHEMA, grading, purpose="distill") if candidates else []
    kept = []
    for row, j in zip(candidates, judgements, strict=True):
        reasons = []
        if not j.valid:
            reasons.append(f"response_format:{j.violations[0]}")
        if not j.correct:
            reasons.append("response_wrong_answer")
        if reasons:
            rejected.append({**row, "reasons": reasons, "answer_pred": j.pred})
        else:
            kept.append(row)
    return ColdStartReport(problems, kept, rejected, rules.min_kept_fraction)


def write_coldstart_audit(report: ColdStartReport, audit_dir: Path) -> dict[str, Any]:
    """The problem gate's audit (``quality.write_audit``) plus ``trajectory_rejected.jsonl``, and the
    reconciliation of both in ``reconciliation.json``."""
    write_audit(report.problems, audit_dir)
    write_escaped_jsonl(Path(audit_dir) / "trajectory_rejected.jsonl", report.rejected)
    rec = report.reconciliation()
    write_json(Path(audit_dir) / "reconciliation.json", rec)
    return rec
