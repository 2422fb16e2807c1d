"""The training problems of a Parallel-R1 RL stage: the pipeline's own, or DAPO-17k-style files, gated.

``source: sample_orz`` takes ``sample_orz``'s train split (already through the quality gate) restricted to
the configured difficulties: the tiny profile's "hard" problems. ``source: local`` reads JSON / JSONL /
parquet files (DAPO-Math-17k's layout: ``prompt`` as text or chat messages, ``reward_model.ground_truth``;
or plain ``problem`` / ``answer``) and puts them through the same Great Expectations suite as
``sample_orz`` (``components.data.quality``), floor included. Either way ``n`` (None = all) problems are
chosen by a seeded shuffle of the content ids, so the choice does not depend on file order.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.data.problem_files import PROBLEM_KEYS, first_field, gold_of, problem_text, read_files
from components.data.problems import content_id, load_problems
from components.data.quality import QualityReport, QualityRules, validate_problems

SOURCE = "pr1_rl"


def rules_of(src: Any) -> QualityRules:
    """The quality floors of a ``ProblemSourceConfig``."""
    return QualityRules(
        src.min_problem_chars, src.max_problem_chars, src.max_answer_chars, src.min_kept_fraction
    )


def normalise_item(item: Any, origin: str, source: str = SOURCE) -> dict[str, Any]:
    """One raw record as a problem row; fields it lacks are None (quarantined by the gate, never dropped)."""
    problem = answer = None
    if isinstance(item, Mapping):
        problem = problem_text(first_field(item, PROBLEM_KEYS))
        answer = gold_of(item)
    return {
        "id": content_id(problem or "", answer or ""),
        "problem": problem,
        "answer": answer,
        "source": source,
        "difficulty": item.get("difficulty") if isinstance(item, Mapping) else None,
        "origin": origin,
    }


def seeded_subset(rows: Sequence[dict[str, Any]], n: int | None, seed: int) -> list[dict[str, Any]]:
    """``n`` rows (all when None) by a seeded shuffle of the rows sorted by id."""
    ordered = sorted(rows, key=lambda r: str(r["id"]))
    random.Random(seed).shuffle(ordered)
    return ordered if n is None else ordered[:n]


def of_difficulty(rows: Sequence[dict[str, Any]], difficulties: Sequence[str] | None) -> list[dict[str, Any]]:
    """The rows of the given difficulty levels (None = every row)."""
    if difficulties is None:
        return list(rows)
    wanted = set(difficulties)
    return [dict(r) for r in rows if r.get("difficulty") in wanted]


def training_problems(
    src: Any, problems_dir: Path | None
) -> tuple[list[dict[str, Any]], dict[str, Any], QualityReport | None]:
    """``(problems, provenance, quality report or None)`` for a ``ProblemSourceConfig``.

    Raises ValueError when no problem of the configured difficulties exists, and the gate's
    ``DataQualityError`` when too few local rows pass it.
    """
    if src.source == "sample_orz":
        if problems_dir is None:
            raise ValueError("source sample_orz needs the sample_orz problems directory")
        train = load_problems(problems_dir, "train")
        chosen = of_difficulty(train, src.difficulties)
        if not chosen:
            raise ValueError(
                f"no training problem of difficulty {src.difficulties} among {len(train)} in {problems_dir}"
            )
        rows = seeded_subset(chosen, src.n, src.seed)
        return (
            rows,
            {"source": "sample_orz", "difficulties": src.difficulties, "available": len(chosen)},
            None,
        )
    records, infos = read_files(Path(src.local_path), "RL problem")
    raw = [normalise_item(item, origin) for origin, item in records]
    report = validate_problems(raw, rules_of(src))
    report.raise_for_floor()
    chosen = of_difficulty(report.kept, src.difficulties)
    if not chosen:
        raise ValueError(f"no problem of difficulty {src.difficulties} among the {len(report.kept)} kept")
    rows = [{**r, "split": "train"} for r in seeded_subset(chosen, src.n, src.seed)]
    provenance = {
        "source": "local",
        "path": src.local_path,
        "files": infos,
        "kept": len(report.kept),
        "rows_in": report.rows_in,
    }
    return rows, provenance, report
