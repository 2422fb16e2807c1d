"""The fast path of answer equivalence: string normalisation and plain-number reading.

Both are pure and cached. ``normalize_answer`` maps notational variants of the same answer to one string
(``\\dfrac`` and ``\\frac``, ``\\left(`` and ``(``, ``$x$`` and ``x``, ``995\\text{ dollars}`` and ``995``,
``36^\\circ`` and ``36``, ``50\\%`` and ``50``, spacing); ``read_number`` reads a normalised answer that is a
plain number (integer, decimal, scientific, ``a/b``, ``\\frac{a}{b}``, ``a\\times10^{b}``) as an exact
``Fraction``. Anything more (radicals, intervals, expressions) is left to math-verify.

Percent and degree signs are dropped, as math-verify's own parser does (``10\\%`` reads as 10), so the
fast path never contradicts the slow one on those.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

# Math delimiters around the whole answer.
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# Wrappers whose content is the answer when they span the whole string.
_WRAPPERS = ("\\boxed", "\\fbox", "\\text", "\\textbf", "\\mathrm", "\\mathbf", "\\mbox", "\\textnormal")
_TEXT_COMMANDS = r"\\(?:text|textbf|textnormal|mathrm|mbox)"
# A trailing unit: `\text{ cm}`, `\mbox{dollars}`, `\text{ square units}` after a non-empty answer.
_TRAILING_UNIT = re.compile(_TEXT_COMMANDS + r"\{\s*[A-Za-z][A-Za-z .]*\}\s*$")
_TEXT_WRAPPED = re.compile(_TEXT_COMMANDS + r"\{([^{}]*)\}")
_LEFT_RIGHT = re.compile(r"\\(?:left|right|big|Big|bigg|Bigg)(?![A-Za-z])")
# `(?<!\\)` so the row break `\\` followed by a space is not read as the spacing command `\ `.
_SPACING = re.compile(r"(?<!\\)\\[,;:! ]|\\q?quad(?![A-Za-z])|\\displaystyle(?![A-Za-z])|~")
_DEGREES = re.compile(
    r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|\\circ(?![A-Za-z])|\\degree(?![A-Za-z])|°"
)
_PERCENT = re.compile(r"\\%|%")
_FRAC_SHORT = re.compile(r"\\[dt]?frac([0-9A-Za-z])([0-9A-Za-z])")
_SQRT_SHORT = re.compile(r"\\sqrt([0-9]+|[A-Za-z])")
_COMMAND_BEFORE_LETTER = re.compile(r"(\\[A-Za-z]+)\s+(?=[A-Za-z])")
_FRAC_VARIANT = re.compile(r"\\[dt]frac(?![A-Za-z])")
# `x = 3`, `k=5`, `a_n = ...`: a single-symbol left side is notation, not part of the answer.
_ASSIGNMENT = re.compile(r"^[A-Za-z](?:_\{?[A-Za-z0-9]+\}?)?=(?!=)")
_CHOICE = re.compile(r"^\(?([A-Ea-e])\)?$")
_THOUSANDS = re.compile(r"^-?\d{1,3}(?:,\d{3})+(?:\.\d+)?$")

# Exponents are capped at three digits: `1e99999999` must not build a 100-million-digit integer.
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?$")
_RATIO = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))/([+-]?(?:\d+\.?\d*|\.\d+))$")
_LATEX_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?(?:\d+\.?\d*|\.\d+))\}\{([+-]?(?:\d+\.?\d*|\.\d+))\}$")
_SCIENTIFIC = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:\\times|\\cdot|\*)10\^(?:\{([+-]?\d{1,3})\}|([+-]?\d))$"
)
_POWER_OF_TEN = re.compile(r"^10\^(?:\{([+-]?\d{1,3})\}|([+-]?\d))$")


def _strip_delimiters(s: str) -> str:
    changed = True
    while changed:
        changed = False
        s = s.strip()
        for left, right in _DELIMITERS:
            if len(s) >= len(left) + len(right) and s.startswith(left) and s.endswith(right):
                s = s[len(left) : len(s) - len(right)]
                changed = True
                break
    return s


def _unwrap_whole(s: str) -> str:
    """``\\boxed{x}`` / ``\\text{x}`` -> ``x`` when the wrapper spans the whole string (braces balanced)."""
    for command in _WRAPPERS:
        if not (s.startswith(command + "{") and s.endswith("}")):
            continue
        depth = 0
        body_start = len(command) + 1
        for i in range(len(command), len(s)):
            ch = s[i]
            if ch == "{":
                depth += 1
            elif ch == "}":
                depth -= 1
                if depth == 0:
                    if i == len(s) - 1:
                        return s[body_start:i]
                    break
    return s


def _strip_sign_off(s: str) -> str:
    """Drop trailing full stops and a trailing unit in text mode (``5\\text{ cm}`` -> ``5``)."""
    s = s.rstrip().rstrip(".").rstrip()
    unit = _TRAILING_UNIT.search(s)
    if unit is not None and s[: unit.start()].strip():
        s = s[: unit.start()]
    return s


@lru_cache(maxsize=1 << 16)
def normalize_answer(answer: str) -> str:
    """A canonical string for ``answer``: equal outputs mean the answers are written-variants of each other.

    All whitespace is removed last, so ``[1, 2)`` and ``[1,2)`` agree. The result is for comparison only;
    math-verify gets the original text (removing spaces can glue LaTeX commands to letters).
    """
    s = _strip_delimiters(answer.replace("\u2212", "-"))
    previous = None
    while s != previous:  # peel nested wrappers and stacked units: `$\boxed{\text{(C)}}$`, `$5$\text{ cm}`
        previous = s
        s = _strip_sign_off(_strip_delimiters(_unwrap_whole(s.strip())))
    s = _TEXT_WRAPPED.sub(r"\1", s)
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACING.sub("", s)
    s = _DEGREES.sub("", s)
    s = _PERCENT.sub("", s)
    s = _FRAC_VARIANT.sub(r"\\frac", s)
    s = _COMMAND_BEFORE_LETTER.sub(r"\1{}", s)  # `\pi c` must not become the command `\pic`
    s = "".join(s.split())
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    if s.count("=") == 1:
        s = _ASSIGNMENT.sub("", s)
    choice = _CHOICE.match(s)
    if choice:
        s = choice.group(1).upper()
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


@lru_cache(maxsize=1 << 16)
def read_number(normalized: str) -> Fraction | None:
    """The exact value of a normalised answer that is a plain number, else None.

    Reads ``27``, ``27.0``, ``-0.5``, ``3.3e12``, ``1/2``, ``-\\frac{1}{2}``, ``2.26\\times10^{-10}``, ``10^{5}``.
    """
    s = normalized
    if not s or len(s) > 64:
        return None
    try:
        if _DECIMAL.match(s):
            return Fraction(s)
        if m := _RATIO.match(s):
            den = Fraction(m.group(2))
            return None if den == 0 else Fraction(m.group(1)) / den
        if m := _LATEX_FRAC.match(s):
            den = Fraction(m.group(3))
            if den == 0:
                return None
            value = Fraction(m.group(2)) / den
            return -value if m.group(1) == "-" else value
        if m := _SCIENTIFIC.match(s):
            return Fraction(m.group(1)) * Fraction(10) ** int(m.group(2) or m.group(3))
        if m := _POWER_OF_TEN.match(s):
            return Fraction(10) ** int(m.group(1) or m.group(2))
    except (ValueError, ZeroDivisionError, OverflowError):
        return None
    return None


_COMMAND = re.compile(r"\\[A-Za-z]+")
# Function and constant names written without a backslash, and the letters sympy reads as constants.
_NOT_VARIABLES = re.compile(r"sqrt|sin|cos|tan|cot|sec|csc|log|ln|exp|pi|inf|oo|[eEiI](?![A-Za-z])")
_LETTER = re.compile(r"[A-Za-z]")


@lru_cache(maxsize=1 << 16)
def has_free_symbols(normalized: str) -> bool:
    """True when a normalised answer contains a letter that is a variable (not a command or constant).

    Used to decide "plain number vs an expression in variables" as unequal without math-verify: such a
    pair can only be equal through an assignment (``x=3``), which normalisation has already removed.
    """
    return _LETTER.search(_NOT_VARIABLES.sub("", _COMMAND.sub("", normalized))) is not None


def numbers_equal(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    """Exact for two integers (so 1000000 != 1000001 at any tolerance), else within ``rel_tol``."""
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False
    return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=0.0)


def gold_candidates(gold: Any) -> tuple[str, ...]:
    """Every acceptable gold answer as a string: a list/tuple/array gold is any-of; floats lose ``.0``.

    Benchmarks store answers as str (MATH500), float (AMC: ``27.0``) or lists of alternatives (Minerva,
    OlympiadBench). Raises ValueError for a gold that holds no answer (None, empty list, blank string).
    """
    if hasattr(gold, "tolist") and not isinstance(gold, str | bytes):
        gold = gold.tolist()  # numpy arrays from verl's parquet rows
    items: Sequence[Any] = gold if isinstance(gold, list | tuple) else [gold]
    out: list[str] = []
    for item in items:
        if item is None:
            continue
        if isinstance(item, bool):
            raise ValueError(f"gold answer {item!r} is a bool, not an answer")
        if isinstance(item, float):
            if not math.isfinite(item):
                raise ValueError(f"gold answer {item!r} is not a finite number")
            text = str(int(item)) if item.is_integer() else repr(item)
        elif isinstance(item, int | str):
            text = str(item).strip()
        else:
            raise ValueError(
                f"gold answer of type {type(item).__name__} is not a str, number or list of them"
            )
        if text and text not in out:
            out.append(text)
    if not out:
        raise ValueError(f"gold {gold!r} holds no answer")
    return tuple(out)
