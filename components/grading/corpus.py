"""The grading corpus: (gold, prediction, expected verdict) cases with their sources, and how to score them.

The cases live in ``tests/data/grading/`` (``corpus.jsonl``; ``heldout.jsonl``, ``blind.jsonl`` (issue 28) and
``blind2.jsonl`` (issue 44) were each graded once before the grader was tuned on them; see the README there). Each case is a bare answer (``kind: answer``, graded the way ``npr grade`` reads ``--pred``)
or a whole response (``kind: response``, graded as the evaluate stage grades it: the ``evaluation``
extraction settings and the case's finish reason). ``option`` names the one library option a case's verdict
depends on (math-verify's float rounding or anchorless free-text extraction, OlympiadBench's tolerances,
MATH's ordered string comparison of lists...); agreement is reported on the cases without one.

Used by the corpus test (``tests/integration/grading/test_grading_corpus.py``) and by
``benchmarks/bench_grading.py``, which also scores plain math-verify on the same cases.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.grading.config import GradingConfig
from components.grading.equivalence import grade_many_verdicts
from components.grading.normalize import gold_candidates

CORPUS_DIR = Path(__file__).resolve().parents[2] / "tests" / "data" / "grading"
SPLITS = {
    "tune": "corpus.jsonl",
    "heldout": "heldout.jsonl",
    "blind": "blind.jsonl",
    "blind2": "blind2.jsonl",
}


@dataclass(frozen=True)
class Case:
    """One corpus case (fields as in the JSONL file)."""

    id: str
    kind: str
    gold: Any
    pred: str
    expected: bool
    source: dict[str, Any]
    finish_reason: str | None = None
    option: str | None = None
    note: str | None = None
    origin: str = "grader_test"
    classes: tuple[str, ...] = field(default_factory=tuple)


def load_cases(split: str = "tune", directory: Path | None = None) -> list[Case]:
    """The cases of ``split`` (a key of ``SPLITS``); ValueError on a malformed case, naming its line."""
    if split not in SPLITS:
        raise ValueError(f"unknown corpus split {split!r}; known: {', '.join(SPLITS)}")
    path = (directory or CORPUS_DIR) / SPLITS[split]
    cases = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        raw = json.loads(line)
        if raw.get("kind") not in ("answer", "response") or not isinstance(raw.get("expected"), bool):
            raise ValueError(f"{path}:{line_no}: a case needs kind answer|response and a bool expected")
        if not raw.get("source"):
            raise ValueError(f"{path}:{line_no}: case {raw.get('id')} has no source")
        raw["classes"] = tuple(raw.get("classes") or ())
        cases.append(Case(**raw))
    return cases


def our_verdicts(cases: Sequence[Case], cfg: GradingConfig | None = None) -> list[bool]:
    """Our grader's verdict on every case, graded in one batch (answers through ``npr grade``'s reading,
    responses through ``judge_many`` with the ``evaluation`` settings and the case's finish reason)."""
    from components.grading.cli_ops import answer_of  # lazy: torch
    from components.grading.judge import judge_many  # lazy: torch

    cfg = cfg or GradingConfig()
    out: list[bool | None] = [None] * len(cases)
    answers = [(i, c) for i, c in enumerate(cases) if c.kind == "answer"]
    responses = [(i, c) for i, c in enumerate(cases) if c.kind == "response"]
    verdicts = grade_many_verdicts(
        [(answer_of(c.pred, cfg, c.finish_reason), c.gold) for _, c in answers], cfg
    )
    for (i, _), verdict in zip(answers, verdicts, strict=True):
        out[i] = verdict.equal
    judgements = judge_many(
        [c.pred for _, c in responses],
        [c.gold for _, c in responses],
        "npr",
        cfg,
        purpose="evaluation",
        finish_reasons=[c.finish_reason for _, c in responses],
    )
    for (i, _), judgement in zip(responses, judgements, strict=True):
        out[i] = judgement.correct
    return [bool(v) for v in out]


def math_verify_verdicts(cases: Sequence[Case], timeout_s: int = 5) -> list[bool]:
    """Plain math-verify with its default settings: ``verify(parse(gold), parse(pred))``, any-of over list
    golds. Must run in the main thread (math-verify's timeouts use SIGALRM)."""
    from math_verify import parse, verify  # lazy: math_verify

    logging.getLogger("math_verify").setLevel(logging.ERROR)
    out = []
    for case in cases:
        pred = parse(case.pred, parsing_timeout=timeout_s)
        out.append(
            any(
                verify(parse(g, parsing_timeout=timeout_s), pred, timeout_seconds=timeout_s)
                for g in _plain_golds(case.gold, gold_candidates)
            )
        )
    return out


def _plain_golds(gold: Any, candidates: Any) -> list[str]:
    # What a math-verify user passes: the gold text itself (a number as its string), alternatives any-of.
    if isinstance(gold, list):
        return [str(g) for g in gold]
    return [str(candidates(gold)[0]) if isinstance(gold, float) else str(gold)]


def agreement(cases: Sequence[Case], verdicts: Sequence[bool]) -> dict[str, Any]:
    """Agreement with the expected verdicts, overall and per kind, on the cases without a library option
    (``counted``) and on the flagged ones; plus the disagreeing counted cases' ids."""

    def rate(pairs: list[tuple[Case, bool]]) -> dict[str, Any]:
        hits = sum(c.expected == v for c, v in pairs)
        return {"n": len(pairs), "agree": hits, "rate": hits / len(pairs) if pairs else None}

    pairs = list(zip(cases, verdicts, strict=True))
    counted = [(c, v) for c, v in pairs if c.option is None]
    flagged = [(c, v) for c, v in pairs if c.option is not None]
    return {
        "counted": rate(counted),
        "counted_answer": rate([(c, v) for c, v in counted if c.kind == "answer"]),
        "counted_response": rate([(c, v) for c, v in counted if c.kind == "response"]),
        "flagged": rate(flagged),
        "all": rate(pairs),
        "misses": [c.id for c, v in counted if c.expected != v],
    }
