"""Which distilled trajectories the rejection filter accepts: one rule for ``distill`` and ``reject_filter``.

``reject_filter`` applies it to write the accepted set; ``distill`` applies the same rule while it samples,
to stop once enough problems have an accepted trajectory (``distill.target_accepted``), so the amount of
training data does not depend on how well NPR-Zero happened to train. Every record lands in exactly one
bucket, by the first rule it fails (the stage's docstring lists them), and the buckets reconcile.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

from components.data.config import RejectFilterConfig

REQUIRED_FIELDS: dict[str, type | tuple[type, ...]] = {
    "problem_id": str,
    "sample_idx": int,
    "problem": str,
    "answer": (str, int, float, list),
    "prompt": str,
    "response": str,
    "n_tokens": int,
    "correct": bool,
    "format_score": (int, float),
    "valid": bool,
    "finish_reason": str,
    "structure": dict,
}
BUCKETS = ("accepted", "rejected_wrong", "rejected_format", "rejected_other")


class ReconciliationError(RuntimeError):
    """The buckets do not add up to the sampled count: a record was lost or counted twice."""


def record_problems(rec: dict[str, Any]) -> list[str]:
    """Schema violations of one record (empty list = well formed)."""
    out = []
    for name, kind in REQUIRED_FIELDS.items():
        if name not in rec:
            out.append(f"missing:{name}")
        elif not isinstance(rec[name], kind) or (kind is int and isinstance(rec[name], bool)):
            out.append(f"type:{name}")
    return out


def own_reasons(rec: dict[str, Any], cfg: RejectFilterConfig) -> list[str]:
    """Every rule a well-formed record fails on its own (before per-problem rules)."""
    reasons = []
    if not rec["correct"]:
        reasons.append("wrong")
    if not rec["valid"]:
        reasons.append("format")
    if not rec["response"].strip():
        reasons.append("empty")
    if rec["n_tokens"] < cfg.min_response_tokens:
        reasons.append("too_short")
    if rec["n_tokens"] > cfg.max_response_tokens:
        reasons.append("too_long")
    if rec["finish_reason"] != "stop":
        reasons.append("truncated")
    return reasons


def bucket_of(reasons: list[str]) -> str:
    if not reasons:
        return "accepted"
    if reasons[0].startswith(("missing:", "type:")):
        return "rejected_other"
    if "wrong" in reasons:
        return "rejected_wrong"
    if "format" in reasons:
        return "rejected_format"
    return "rejected_other"


def filter_trajectories(
    records: list[dict[str, Any]], cfg: RejectFilterConfig
) -> tuple[list[dict[str, Any]], list[dict[str, Any]], dict[str, int]]:
    """Split records into accepted and quarantined (each quarantined one carries ``reject_reasons`` and
    ``bucket``); returns ``(accepted, quarantined, counts)`` with the reconciliation already checked."""
    accepted: list[dict[str, Any]] = []
    quarantined: list[dict[str, Any]] = []
    kept_texts: dict[str, set[str]] = defaultdict(set)
    # File order: distill writes each problem's samples in sample_idx order, so "first M" is well defined.
    for rec in records:
        reasons = record_problems(rec)
        if not reasons:
            reasons = own_reasons(rec, cfg)
            if not reasons:
                texts = kept_texts[rec["problem_id"]]
                if rec["response"] in texts:
                    reasons.append("duplicate")
                elif len(texts) >= cfg.max_accepted_per_problem:
                    reasons.append("over_cap")
        bucket = bucket_of(reasons)
        if bucket == "accepted":
            kept_texts[rec["problem_id"]].add(rec["response"])
            accepted.append(rec)
        else:
            quarantined.append({**rec, "bucket": bucket, "reject_reasons": reasons})
    counts = Counter(q["bucket"] for q in quarantined)
    result = {
        "sampled": len(records),
        "accepted": len(accepted),
        **{b: counts.get(b, 0) for b in BUCKETS[1:]},
    }
    total = sum(result[b] for b in BUCKETS)
    if total != result["sampled"]:
        raise ReconciliationError(f"sampled {result['sampled']} != accepted + rejected ({total}): {result}")
    return accepted, quarantined, result


def accepted_problem_prefix(
    problem_ids: Sequence[str], records: list[dict[str, Any]], cfg: RejectFilterConfig, target: int
) -> tuple[int, int]:
    """The shortest prefix of ``problem_ids`` (in sampling order) whose records give ``target`` problems with
    an accepted trajectory: ``(prefix length, accepted problems in it)``; the whole list when it falls short.

    The rule is per problem (a problem's own records decide whether it has an accepted trajectory), so the
    accepted count of a prefix is the count over the problems in it.
    """
    accepted, _, _ = filter_trajectories(records, cfg)
    hit = {str(r["problem_id"]) for r in accepted}
    count = 0
    for i, pid in enumerate(problem_ids):
        count += str(pid) in hit
        if count >= target:
            return i + 1, count
    return len(problem_ids), count
