"""One judgement per response: the extracted answer, correctness, and the structure's format verdict.

Every consumer of "was this response right and well formed" (seed eval, RL rewards and eval, the
reject filter, the evaluate stage) calls ``judge`` / ``judge_many`` and ``summarize`` so they all count
the same way. The structure side comes from ``components.structure`` (format score in [-2, 0], 0 =
perfect, violations with codes); the answer side from ``answers`` and ``equivalence``.

Each caller names its ``purpose`` (``reward``, ``evaluation``, ``distill``, ``cli``; settings in
``grading.extraction``) and passes the engine's finish reasons, so a truncated response is never credited.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

from components.grading.answers import extract_final
from components.grading.config import ExtractionConfig, GradingConfig
from components.grading.equivalence import grade_many_verdicts
from components.structure.parse import STRUCTURAL_CODES, parse_text
from components.structure.schemas import Schema, get_schema
from components.structure.score import is_valid, score_trace


@dataclass(frozen=True)
class Judgement:
    """The verdict on one response.

    ``pred``: extracted answer (None if none); ``correct``: pred equals the gold; ``format_score`` in
    [-2, 0]; ``valid``: no format violation at all (score 0); ``empty``: blank response; ``malformed``: the
    tag sequence breaks the grammar (no attention mask can be built, see ``structure.parse``);
    ``violations``: the violation codes in order; ``grade_reason``: why grading failed (timeout, crash), else
    None; ``truncated``: the response was cut off (finish reason or an unclosed box), so it has no answer;
    ``answer_method``: how the answer was found (``boxed``, ``minerva``, ``answer_line``, ``last_number``).
    """

    pred: str | None
    correct: bool
    format_score: float
    valid: bool
    empty: bool
    malformed: bool = False
    violations: tuple[str, ...] = ()
    grade_reason: str | None = None
    truncated: bool = False
    answer_method: str | None = None

    def as_record(self) -> dict[str, Any]:
        """The trajectory-record fields (``answer_pred``, ``correct``, ``format_score``, ``valid``)."""
        return {
            "answer_pred": self.pred,
            "correct": self.correct,
            "format_score": self.format_score,
            "valid": self.valid,
        }

    def to_dict(self) -> dict[str, Any]:
        out = asdict(self)
        out["violations"] = list(self.violations)
        return out


def _structure_of(response: str, schema: Schema) -> tuple[float, bool, bool, tuple[str, ...]]:
    trace = parse_text(response, schema)
    codes = tuple(v.code for v in trace.violations)
    return score_trace(trace), is_valid(trace), any(c in STRUCTURAL_CODES for c in codes), codes


def schema_extraction(extraction: ExtractionConfig, schema: Schema) -> ExtractionConfig:
    """The purpose's settings plus the schema's own answer convention.

    A schema whose responses end with a labelled answer line (Parallel-R1: ``Final Answer: 42``,
    ``Schema.answer_label``) states its answer there: for it the ``answer_line`` reading is an explicit
    answer, not a guess, so it is tried first whatever the purpose's fallbacks (boxes and Minerva's sentence
    are still read before it, as for every schema).
    """
    if schema.answer_label is None or "answer_line" in extraction.fallbacks:
        return extraction
    return extraction.model_copy(update={"fallbacks": ["answer_line", *extraction.fallbacks]})


def judge_many(
    responses: Sequence[str],
    golds: Sequence[Any],
    schema: str | Schema = "npr",
    cfg: GradingConfig | None = None,
    *,
    purpose: str = "evaluation",
    finish_reasons: Sequence[str | None] | None = None,
) -> list[Judgement]:
    """``judge`` over paired responses and golds; answers are graded in one batch (see ``grade_many``).

    ``purpose`` picks the extraction settings (``cfg.extraction.<purpose>``); ``finish_reasons`` (one per
    response, None = unknown) lets a response cut off by the token budget be recognised as truncated.
    """
    if len(responses) != len(golds):
        raise ValueError(f"judge_many got {len(responses)} responses but {len(golds)} golds")
    if finish_reasons is not None and len(finish_reasons) != len(responses):
        raise ValueError(
            f"judge_many got {len(responses)} responses but {len(finish_reasons)} finish reasons"
        )
    cfg = cfg or GradingConfig()
    resolved = get_schema(schema)
    extraction = schema_extraction(cfg.extraction.for_purpose(purpose), resolved)
    for index, response in enumerate(responses):
        if not isinstance(response, str):
            raise ValueError(f"response {index} is a {type(response).__name__}, not a str")
    reasons = list(finish_reasons) if finish_reasons is not None else [None] * len(responses)
    found = [extract_final(r, extraction, reason) for r, reason in zip(responses, reasons, strict=True)]
    verdicts = grade_many_verdicts([(f.answer, g) for f, g in zip(found, golds, strict=True)], cfg)
    out: list[Judgement] = []
    for response, extraction_result, verdict in zip(responses, found, verdicts, strict=True):
        pred = extraction_result.answer
        score, valid, malformed, codes = _structure_of(response, resolved)
        out.append(
            Judgement(
                pred=pred,
                correct=verdict.equal,
                format_score=score,
                valid=valid,
                empty=not response.strip(),
                malformed=malformed,
                violations=codes,
                grade_reason=verdict.reason,
                truncated=extraction_result.truncated,
                answer_method=extraction_result.method if pred is not None else None,
            )
        )
    return out


def judge(
    response: str,
    gold: Any,
    schema: str | Schema = "npr",
    cfg: GradingConfig | None = None,
    *,
    purpose: str = "evaluation",
    finish_reason: str | None = None,
) -> Judgement:
    """Judge one response against its gold answer (str, number, or list of alternatives)."""
    return judge_many([response], [gold], schema, cfg, purpose=purpose, finish_reasons=[finish_reason])[0]


def summarize(judgements: Sequence[Judgement]) -> dict[str, float | int]:
    """Fractions over the judgements: ``format_valid``, ``accuracy``, ``correct_and_valid``; and ``n``.

    Also ``mean_format_score``, ``empty`` and ``truncated`` (fractions) and ``grade_failures`` (count of
    pairs not graded because of a timeout or crash; they count as wrong). Raises ValueError on an empty sequence: a rate
    over nothing is a bug upstream, not 0.
    """
    n = len(judgements)
    if n == 0:
        raise ValueError("summarize needs at least one judgement")
    return {
        "n": n,
        "format_valid": sum(j.valid for j in judgements) / n,
        "accuracy": sum(j.correct for j in judgements) / n,
        "correct_and_valid": sum(j.correct and j.valid for j in judgements) / n,
        "mean_format_score": sum(j.format_score for j in judgements) / n,
        "empty": sum(j.empty for j in judgements) / n,
        "truncated": sum(j.truncated for j in judgements) / n,
        "grade_failures": sum(j.grade_reason is not None for j in judgements),
    }
