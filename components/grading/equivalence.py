"""Is a predicted answer equal to the gold answer? A cached fast path first, math-verify for the rest.

Order of decision for one (pred, gold candidate):

1. no prediction -> False (``no_answer``);
2. both answers assignments to different quantities -> False (``relation``): ``y = 2`` is not the answer
   ``x = 2``, nor ``\\cot t = 2`` the answer ``\\tan t = 2`` (``normalize.answer_label``); an assignment
   against a bare value compares the value (``x = 2`` and ``2``; ``2 = x`` is the same assignment), and an
   equation between expressions (``2x + y = 1``) goes to math-verify whole, which compares both sides;
3. a statement without variables (``2=3+4``, ``1=1``; ``normalize.variable_free_relation``): against a relation
   with variables False (``relation``: ``1=1`` says nothing about ``x``), otherwise left to the pool, where
   ``relations`` reads it by truth and sides, never by its last side;
   normalised strings equal -> True (``exact``, see ``normalize.normalize_answer``); the same letters in
   another case -> False (``variables``: ``X^2+1`` is not ``x^2+1``); two times of day (``20:34`` =
   ``08:34 P.M.``, when seconds or a half-day mark make one a time) -> compared (``numeric``);
4. both plain numbers -> compared exactly or within ``cfg.float_rel_tol`` (``numeric``), decisive either
   way: math-verify reads plain numbers the same way, so it could not disagree. A number written with a
   percent sign also reads as its value over 100 (``10\\%`` = 10 = 0.1); one written with a decimal comma
   (``1000,99``, ``0,111``: not a group of three digits) reads as the decimal;
5. both lists of plain numbers (``list``): a gold that assigns distinct quantities (``x=2, y=3``) by quantity
   (a labelled prediction) or in order (an unlabelled one); an ordered tuple or interval when the gold is one group in
   parentheses or brackets (``(6,31,-1)``, ``(3,4]``: same order and brackets), else an "all solutions"
   answer compared as a set (``1,-2`` = ``-2, 1``; a bare list and ``\\{...\\}`` are sets);
6. one side a plain number, the other an expression in free variables without a function whose variables
   are each written once and no zero factor (a polynomial or rational expression that cannot cancel: it
   equals no constant) or a tuple / list / interval (a comma outside a function's arguments) -> False
   (``number_vs_expression``); a function of a variable (``\\sin^2 t + \\cos^2 t``), an expression that
   may cancel (``x/x``, ``x^2-x^2``, ``0y``) or a relation goes on;
7. otherwise the process pool (``math_verify``) on the cleaned texts (``normalize.clean_answer``): a pair in
   which either text is a relation by ``relations.relation_equal`` first (equations and inequalities by both
   sides, systems and solution sets, statements by truth); the rest math-verify
   ``verify(parse(gold), parse(pred))``, and when it says False the symbolic fallback
   (``symbolic.symbolic_equal``: sympy simplification, plain/CAS notation too; its assumptions and refusals
   are in that module), both under one per-pair deadline; a pair that times out or whose worker dies is
   False with the reason.

A list gold (Minerva, OlympiadBench) is any-of over its candidates. ``grade_many`` is the batch form RL and
evaluation use: it decides what it can on the fast path, deduplicates the rest, and sends only that to the
pool in chunks. math-verify verdicts are cached in this process (timeouts and crashes are not).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from components.grading import verify_pool
from components.grading.answers import _extract
from components.grading.config import GradingConfig
from components.grading.normalize import (
    answer_label,
    clean_answer,
    gold_candidates,
    has_free_symbols,
    normalize_answer,
    notation,
    numbers_equal,
    read_number,
    reduce_relation,
    relation_label,
    split_equals,
    strip_delimiters,
    top_level_split,
    variable_free_relation,
    variable_letters,
)
from components.grading.relations import is_relation
from components.grading.symbolic import list_comma

_DECIMAL_COMMA = re.compile(r"^-?\d+,\d+$")
_GROUP_OF_THREE = re.compile(r"^-?[1-9]\d{0,2},\d{3}$")

# Bounded memo of math-verify verdicts keyed by (gold, pred) text; cleared when full (simple and enough:
# within one RL step or eval run the same pairs repeat, across runs they rarely do).
_VERDICT_CACHE: dict[tuple[str, str], bool] = {}
_VERDICT_CACHE_MAX = 1 << 17


@dataclass(frozen=True)
class Verdict:
    """The grade of one (pred, gold): ``equal``, the deciding ``method``, and ``reason`` when not graded.

    ``method`` is ``no_answer``, ``relation``, ``exact``, ``numeric``, ``list``, ``number_vs_expression``,
    ``math_verify`` (the pool's verdict: math-verify, then the symbolic fallback when it said unequal) or
    ``failed`` (timeout / worker crash / parser error; ``reason`` says which).
    """

    equal: bool
    method: str
    reason: str | None = None


def _readings(raw: str, normalized: str) -> tuple[Fraction, ...]:
    """The values a plain-number answer can mean (a percent also over 100)."""
    value = read_number(normalized)
    if value is None:
        return ()
    return (value, value / 100) if "%" in clean_answer(raw) else (value,)


def _decimal_comma(raw: str, normalized: str, other: tuple[Fraction, ...]) -> tuple[Fraction, ...]:
    """``1000,99`` read as 1000.99, only against a number with a fractional part: next to anything else the
    comma separates a list (``69,84`` is two answers), and a group of three digits is a thousands mark."""
    if not other or all(v.denominator == 1 for v in other):
        return ()
    if not _DECIMAL_COMMA.match(normalized) or _GROUP_OF_THREE.match(normalized):
        return ()
    return _readings(raw, normalized.replace(",", "."))


def _element_values(normalized: str) -> list[Fraction] | None:
    """A list answer's elements as numbers (labels like ``x=1`` dropped), or None unless all are numbers."""
    parts = top_level_split(normalized, ",")
    if len(parts) < 2:
        return None
    values = [read_number(reduce_relation(part)) for part in parts]
    return None if any(v is None for v in values) else values  # type: ignore[return-value]


def _element_labels(normalized: str) -> list[str | None]:
    return [relation_label(part) for part in top_level_split(normalized, ",")]


def labelled_list_verdict(pred_norm: str, gold_norm: str, rel_tol: float) -> Verdict | None:
    """A gold that assigns values to distinct quantities (``x=2, y=3``): a labelled prediction must give each
    quantity its value (``y=3, x=2`` yes, ``x=3, y=2`` no), an unlabelled one must list them in order."""
    gold_labels = _element_labels(gold_norm)
    if len(gold_labels) < 2 or None in gold_labels or len(set(gold_labels)) != len(gold_labels):
        return None
    gold_values, pred_values = _element_values(gold_norm), _element_values(_set_inside(pred_norm))
    if gold_values is None or pred_values is None:
        return None
    pred_labels = _element_labels(_set_inside(pred_norm))
    if len(pred_values) != len(gold_values):
        return Verdict(False, "list")
    if all(label is None for label in pred_labels):
        pairs = list(zip(pred_values, gold_values, strict=True))
    elif None in pred_labels or sorted(pred_labels) != sorted(gold_labels):  # type: ignore[type-var]
        return Verdict(False, "relation")
    else:
        by_label = dict(zip(pred_labels, pred_values, strict=True))
        pairs = [(by_label[label], value) for label, value in zip(gold_labels, gold_values, strict=True)]
    return Verdict(all(numbers_equal(p, g, rel_tol) for p, g in pairs), "list")


def _brackets(normalized: str) -> tuple[str, str, str] | None:
    """(open, close, inside) when one () / [] group spans the whole answer."""
    if len(normalized) < 2 or normalized[0] not in "([" or normalized[-1] not in ")]":
        return None
    depth = 0
    for i, ch in enumerate(normalized):
        depth += ch in "(["
        depth -= ch in ")]"
        if depth == 0 and i < len(normalized) - 1:
            return None
    return normalized[0], normalized[-1], normalized[1:-1]


def _set_inside(normalized: str) -> str:
    return normalized[2:-2] if normalized.startswith("\\{") and normalized.endswith("\\}") else normalized


def list_verdict(pred_norm: str, gold_norm: str, rel_tol: float) -> Verdict | None:
    """Both answers lists of plain numbers -> ordered (gold is a tuple/interval) or set comparison."""
    gold_group = _brackets(gold_norm)
    pred_group = _brackets(pred_norm)
    if gold_group is not None:
        gold_values = _element_values(gold_group[2])
        if pred_group is not None:
            if pred_group[:2] != gold_group[:2]:
                return None  # `(1,2)` vs `[1,2]`: tuple, list or interval? math-verify decides
            pred_values = _element_values(pred_group[2])
        else:
            pred_values = _element_values(_set_inside(pred_norm))
        if gold_values is None or pred_values is None:
            return None
        same = len(gold_values) == len(pred_values) and all(
            numbers_equal(p, g, rel_tol) for p, g in zip(pred_values, gold_values, strict=True)
        )
        return Verdict(same, "list")
    gold_values = _element_values(_set_inside(gold_norm))
    pred_values = _element_values(_set_inside(pred_group[2] if pred_group is not None else pred_norm))
    if gold_values is None or pred_values is None:
        return None
    covered = all(any(numbers_equal(p, g, rel_tol) for g in gold_values) for p in pred_values) and all(
        any(numbers_equal(p, g, rel_tol) for p in pred_values) for g in gold_values
    )
    return Verdict(covered, "list")


def verify_form(gold: str, pred: str) -> tuple[str, str]:
    """The (gold, pred) texts math-verify is given: cleaned, and a labelled relation (``I_{\\max} = ...``)
    reduced to its value when the other side states a bare value (math-verify only knows simple labels)."""
    g, p = strip_delimiters(clean_answer(gold)), strip_delimiters(clean_answer(pred))
    g_rel, p_rel = is_relation(g), is_relation(p)
    # a statement without variables (`2=3+4`) is judged whole, by its truth (relations.relation_equal)
    if g_rel and not p_rel and not variable_free_relation(gold):
        g = reduce_relation(g)
    elif p_rel and not g_rel and not variable_free_relation(pred):
        p = reduce_relation(p)
    return g, p


def fast_verdict(pred: str, gold: str, rel_tol: float) -> Verdict | None:
    """The fast-path verdict of one (pred, gold candidate), or None when math-verify has to decide."""
    pred_norm = normalize_answer(pred)
    if not pred_norm:
        return Verdict(False, "no_answer")
    gold_label, pred_label = answer_label(gold), answer_label(pred)
    if gold_label is not None and pred_label is not None and gold_label != pred_label:
        # Two assignments to different quantities (`y = 2` for `x = 2`, `\cot t = 2` for `\tan t = 2`)
        # are different answers whatever their values.
        return Verdict(False, "relation")
    gold_norm = normalize_answer(gold)
    statement = variable_free_relation(pred), variable_free_relation(gold)
    if any(statement):
        if not all(statement) and (
            has_free_symbols(_notation_of(gold if statement[0] else pred))
            and len(split_equals(_notation_of(gold if statement[0] else pred))) > 1
        ):
            # `1=1` against `x=1`: a statement without variables says nothing about the gold's variables
            return Verdict(False, "relation")
        return None  # judged by truth and sides in the pool (relations.relation_equal)
    if pred_norm == gold_norm:
        return Verdict(True, "exact")
    gold_letters, pred_letters = variable_letters(gold_norm), variable_letters(pred_norm)
    if (
        gold_letters is not None
        and pred_letters is not None
        and gold_letters != pred_letters
        and {c.lower() for c in gold_letters} == {c.lower() for c in pred_letters}
    ):
        # `X^2+1` for `x^2+1`: the same letters in another case are other variables (math-verify's parser
        # lower-cases symbols, so only the text can tell them apart)
        return Verdict(False, "variables")
    pred_clock, gold_clock = _clock(_clock_text(pred)), _clock(_clock_text(gold))
    if pred_clock is not None and gold_clock is not None and (pred_clock[1] or gold_clock[1]):
        return Verdict(pred_clock[0] == gold_clock[0], "numeric")
    pred_values = _readings(pred, pred_norm)
    gold_values = _readings(gold, gold_norm)
    pred_values = pred_values or _decimal_comma(pred, pred_norm, gold_values)
    gold_values = gold_values or _decimal_comma(gold, gold_norm, pred_values)
    if pred_values and gold_values:
        equal = any(numbers_equal(p, g, rel_tol) for p in pred_values for g in gold_values)
        return Verdict(equal, "numeric")
    listed = labelled_list_verdict(_notation_of(pred), _notation_of(gold), rel_tol)
    if listed is None:
        listed = list_verdict(pred_norm, gold_norm, rel_tol)
    if listed is not None:
        return listed
    # A plain number never equals an expression in free variables or a tuple/list/interval; math-verify
    # would try to simplify the difference to prove it, which costs up to seconds per pair on
    # physics-style answers.
    if (pred_values and _not_a_scalar(gold_norm)) or (gold_values and _not_a_scalar(pred_norm)):
        return Verdict(False, "number_vs_expression")
    return None


# A time of day: `20:34`, `20:34:00`, `08:34 P.M.` (normalised: no spaces, `\text{}` unwrapped). Read as one
# only when seconds or a half-day mark say so: `3:4` alone is a ratio.
_CLOCK = re.compile(r"^(\d{1,2}):(\d{2})(?::(\d{2}))?((?:a|p)\.?m\.?)?$", re.I)


def _clock_text(answer: str) -> str:
    """The answer with delimiters, ``\text{}`` wrappers and spaces gone (``08:34 \text{P.M.}`` -> ``08:34P.M.``):
    ``normalize_answer`` would drop the half-day mark as a unit."""
    return "".join(re.sub(r"\\(?:text|mbox|mathrm)\s*\{([^{}]*)\}", r"\1", strip_delimiters(answer)).split())


def _clock(normalized: str) -> tuple[int, bool] | None:
    """(seconds after midnight, whether seconds or a half-day mark make it unmistakably a time)."""
    match = _CLOCK.match(normalized)
    if match is None:
        return None
    hours, minutes, seconds, half = int(match.group(1)), int(match.group(2)), match.group(3), match.group(4)
    if minutes > 59 or (seconds is not None and int(seconds) > 59):
        return None
    if half is not None:
        if not 1 <= hours <= 12:
            return None
        hours = hours % 12 + (12 if half.lower().startswith("p") else 0)
    elif hours > 23:
        return None
    return hours * 3600 + minutes * 60 + int(seconds or 0), seconds is not None or half is not None


# A function of a variable can equal a constant through an identity (`\sin^2 t + \cos^2 t` = 1), which the
# symbolic fallback decides; a polynomial or rational expression in free variables cannot without cancelling
# to a number, which no answer writes, so it stays on the fast path.
_FUNCTION = re.compile(
    r"\\(?:sin|cos|tan|cot|sec|csc|sinh|cosh|tanh|coth|sech|csch|arcsin|arccos|arctan|arcsec|arccsc|arccot|"
    r"log|ln|exp|operatorname)(?![A-Za-z])"
    r"|\b(?:a|arc)?(?:sin|cos|tan|cot|sec|csc)h?(?:\(|\^|\s)|\b(?:cosech?|log|ln|exp|abs|floor|ceil)(?:\(|\^|_)"
)


def _notation_of(answer: str) -> str:
    return notation(answer)[0]


def _not_a_scalar(normalized: str) -> bool:
    """True when ``normalized`` cannot equal a number: a list, or an expression in free variables with no
    function (which an identity could turn constant) and no way for its variables to cancel."""
    if len(split_equals(normalized)) > 1 or _INEQUALITY_SIGN.search(normalized):
        return False  # a relation is not an expression; `relations` compares it whole
    if "," in normalized and list_comma(normalized):
        return True  # `binom(8,3)`: a comma between a function's arguments is no list
    return (
        has_free_symbols(normalized) and _FUNCTION.search(normalized) is None and not _may_cancel(normalized)
    )


_INEQUALITY_SIGN = re.compile(r"[<>]|\\(?:le|ge|lt|gt|leq|geq|lor|land)(?![A-Za-z])")


# A zero factor or exponent (`0x`, `0\cdot y`, `x^0`): a variable times nothing.
_ZERO_FACTOR = re.compile(
    r"(?<![\d.])0(?![\d.])\s*(?:\*|\\cdot|\\times)?\s*[A-Za-z(\\]|\^\s*\{?\s*0\s*\}?(?![\d.])"
)


def _may_cancel(normalized: str) -> bool:
    """Whether the variables of a rational expression may cancel (``x-x``, ``x/x``, ``\frac{2x}{x}``, ``0x``):
    a variable written twice, or a zero factor. Written once each, they cannot."""
    if variable_letters(normalized) is None:
        return False  # a word (`4 apples`), not an expression
    letters = [c for c in re.sub(r"\\[A-Za-z]+", " ", normalized) if c.isalpha()]
    return len(letters) != len(set(letters)) or _ZERO_FACTOR.search(normalized) is not None


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
                key = verify_form(candidate, pred)
                if key in _VERDICT_CACHE:
                    slots.append(Verdict(_VERDICT_CACHE[key], "math_verify"))
                else:
                    slots.append(key)
                    to_verify[key] = None
        per_pair.append(slots)

    slow: dict[tuple[str, str], Verdict] = {}
    if to_verify:
        keys = list(to_verify)
        # through the module (not a name bound at import), so a test can refuse the pool with monkeypatch
        pool = verify_pool.get_pool(cfg.workers, cfg.pool_start_timeout_s)
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
    _VERDICT_CACHE.clear()
    normalize_answer.cache_clear()
    clean_answer.cache_clear()
    answer_label.cache_clear()
    notation.cache_clear()
    read_number.cache_clear()
    has_free_symbols.cache_clear()
    _extract.cache_clear()
