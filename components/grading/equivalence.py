"""Is a predicted answer equal to the gold answer? A cached fast path first, math-verify for the rest.

Order of decision for one (pred, gold candidate):

1. no prediction -> False (``no_answer``);
2. normalised strings equal -> True (``exact``, see ``normalize.normalize_answer``);
3. both plain numbers -> compared exactly or within ``cfg.float_rel_tol`` (``numeric``), decisive either
   way: math-verify reads plain numbers the same way, so it could not disagree;
4. one side a plain number, the other an expression in free variables or a tuple / list / interval (a
   comma) -> False (``number_vs_expression``);
5. otherwise math-verify ``verify(parse(gold), parse(pred))`` in the process pool (``math_verify``), with a
   per-pair deadline; a pair that times out or whose worker dies is False with the reason.

A list gold (Minerva, OlympiadBench) is any-of over its candidates. ``grade_many`` is the batch form RL and
evaluation use: it decides what it can on the fast path, deduplicates the rest, and sends only that to the
pool in chunks. math-verify verdicts are cached in this process (timeouts and crashes are not).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.grading.config import GradingConfig
from components.grading.normalize import (
    gold_candidates,
    has_free_symbols,
    normalize_answer,
    numbers_equal,
    read_number,
)

# Bounded memo of math-verify verdicts keyed by (gold, pred) text; cleared when full (simple and enough:
# within one RL step or eval run the same pairs repeat, across runs they rarely do).
_VERDICT_CACHE: dict[tuple[str, str], bool] = {}
_VERDICT_CACHE_MAX = 1 << 17


@dataclass(frozen=True)
class Verdict:
    """The grade of one (pred, gold): ``equal``, the deciding ``method``, and ``reason`` when not graded.

    ``method`` is ``no_answer``, ``exact``, ``numeric``, ``number_vs_expression``, ``math_verify`` or
    ``failed`` (timeout / worker crash / parser error; ``reason`` says which).
    """

    equal: bool
    method: str
    reason: str | None = None


def fast_verdict(pred: str, gold: str, rel_tol: float) -> Verdict | None:
    """The fast-path verdict of one (pred, gold candidate), or None when math-verify has to decide."""
    pred_norm = normalize_answer(pred)
    if not pred_norm:
        return Verdict(False, "no_answer")
    gold_norm = normalize_answer(gold)
    if pred_norm == gold_norm:
        return Verdict(True, "exact")
    pred_value = read_number(pred_norm)
    gold_value = read_number(gold_norm)
    if pred_value is not None and gold_value is not None:
        return Verdict(numbers_equal(pred_value, gold_value, rel_tol), "numeric")
    # A plain number never equals an expression in free variables or a tuple/list/interval; math-verify
    # would try to simplify the difference to prove it, which costs up to seconds per pair on
    # physics-style answers.
    if (pred_value is not None and _not_a_scalar(gold_norm)) or (
        gold_value is not None and _not_a_scalar(pred_norm)
    ):
        return Verdict(False, "number_vs_expression")
    return None


def _not_a_scalar(normalized: str) -> bool:
    return "," in normalized or has_free_symbols(normalized)


def _combine(verdicts: Sequence[Verdict]) -> Verdict:
    """Any-of over gold candidates: the first True, else the most informative False."""
    for verdict in verdicts:
        if verdict.equal:
            return verdict
    for verdict in verdicts:
        if verdict.reason is not None:
            return verdict
    return verdicts[0]


def grade_many_verdicts(
    pairs: Sequence[tuple[str | None, Any]], cfg: GradingConfig | None = None
) -> list[Verdict]:
    """Verdicts for (pred, gold) pairs in order; gold may be str, number or a list of alternatives.

    Raises ValueError (naming the pair index) for a gold that holds no answer or a pred that is not a str.
    """
    cfg = cfg or GradingConfig()
    per_pair: list[list[Verdict | tuple[str, str]]] = []
    to_verify: dict[tuple[str, str], None] = {}  # ordered set of (gold, pred) for math-verify
    for index, (pred, gold) in enumerate(pairs):
        if pred is not None and not isinstance(pred, str):
            raise ValueError(f"pair {index}: pred must be a str or None, got {type(pred).__name__}")
        try:
            candidates = gold_candidates(gold)
        except ValueError as err:
            raise ValueError(f"pair {index}: {err}") from None
        slots: list[Verdict | tuple[str, str]] = []
        if pred is None or not pred.strip():
            slots.append(Verdict(False, "no_answer"))
        else:
            fast = [fast_verdict(pred, candidate, cfg.float_rel_tol) for candidate in candidates]
            hit = next((v for v in fast if v is not None and v.equal), None)
            for candidate, verdict in zip(candidates, fast, strict=True):
                if hit is not None:
                    slots = [hit]  # any-of: one fast hit decides, nothing goes to the pool
                    break
                if verdict is not None:
                    slots.append(verdict)
                    continue
                key = (candidate, pred)
                if key in _VERDICT_CACHE:
                    slots.append(Verdict(_VERDICT_CACHE[key], "math_verify"))
                else:
                    slots.append(key)
                    to_verify[key] = None
        per_pair.append(slots)

    slow: dict[tuple[str, str], Verdict] = {}
    if to_verify:
        from components.grading.verify_pool import get_pool  # no pool (or math-verify) until needed

        keys = list(to_verify)
        pool = get_pool(cfg.workers, cfg.pool_start_timeout_s)
        for key, (equal, reason) in zip(keys, pool.verify(keys, cfg.timeout_s, cfg.chunk_size), strict=True):
            if reason is None:
                slow[key] = Verdict(equal, "math_verify")
                if len(_VERDICT_CACHE) >= _VERDICT_CACHE_MAX:
                    _VERDICT_CACHE.clear()
                _VERDICT_CACHE[key] = equal
            else:
                slow[key] = Verdict(False, "failed", reason)
    return [_combine([s if isinstance(s, Verdict) else slow[s] for s in slots]) for slots in per_pair]


def grade_many(pairs: Sequence[tuple[str | None, Any]], cfg: GradingConfig | None = None) -> list[bool]:
    """``answers_equal`` over many (pred, gold) pairs at once (fast path first, the rest to the pool)."""
    return [v.equal for v in grade_many_verdicts(pairs, cfg)]


def answers_equal(pred: str | None, gold: Any, cfg: GradingConfig | None = None) -> bool:
    """True when the extracted answer ``pred`` equals ``gold`` (str, number, or list = any of)."""
    return grade_many_verdicts([(pred, gold)], cfg)[0].equal


def clear_caches() -> None:
    """Forget cached verdicts and normalisations (tests and benchmarks measure cold paths with it)."""
    from components.grading.answers import _extract

    _VERDICT_CACHE.clear()
    normalize_answer.cache_clear()
    read_number.cache_clear()
    has_free_symbols.cache_clear()
    _extract.cache_clear()
