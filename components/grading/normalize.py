"""The fast path of answer equivalence: string normalisation and plain-number reading.

Both are pure and cached. ``normalize_answer`` maps notational variants of the same answer to one string
(``\\dfrac`` and ``\\frac``, ``\\left(`` and ``(``, ``$x$`` and ``x``, ``995\\text{ dollars}`` and ``995``,
``36^\\circ`` and ``36``, ``50\\%`` and ``50``, spacing); ``read_number`` reads a normalised answer that is a
plain number (integer, decimal, scientific, ``a/b``, ``\\frac{a}{b}``, ``a\\times10^{b}``) as an exact
``Fraction``. Anything more (radicals, intervals, expressions) is left to math-verify.

Before either, ``clean_answer`` rewrites what models and answer keys write around a value into one form
(both sides, and what math-verify is given): currency (``\\$``, a lone ``$``, ``€``), LaTeX thousands
separators (``14{,}916``, ``16,\\!386.20``), percent words (``28 pct`` -> ``28\\%``), unit words after a
number (``36 dollars``) and unit expressions after a number that is the whole answer (``10 cm^2``,
``10\\text{ cm}^{2}``, ``5 m/s``, ``10 weeks``; a lone one-letter unit, ``0.64N``, may be a variable and is
kept), a mixed number (``1 1/2`` -> ``3/2``, not the digits glued together), Python's ``==`` (the equation
sign), a stray trailing backslash, ``\\\\frac`` written with a doubled backslash.

Degree signs are dropped, as math-verify's own parser does. A percent sign is dropped by
``normalize_answer`` (MATH's convention: ``10\\%`` and ``10`` are the same answer); the fast path also
accepts the value over 100 for a number written with a percent sign (``10\\%`` = 0.1, as OlympiadBench's
judge does). ``reduce_relation`` reads the value of ``x = 3``, ``f(x) = 1``, ``|AB| = 1``, ``(p,q) = (3,2)``,
of a chain ``x = 5 + 6 = 11`` (the last right-hand side) and of ``x \\approx 1.3`` / ``1/3 \\approx 0.33``
(the exact value wins over the approximation); an equation whose left side is not a label stays one.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from fractions import Fraction
from functools import lru_cache
from typing import Any

from components.grading.answers import extract_answer

# Math delimiters around the whole answer.
_DELIMITERS = (("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]"))
# Wrappers whose content is the answer when they span the whole string.
_WRAPPERS = (
    "\\boxed",
    "\\fbox",
    "\\framebox",
    "\\text",
    "\\textbf",
    "\\mathrm",
    "\\mathbf",
    "\\mbox",
    "\\textnormal",
)
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
_UNIT_WORD = (
    r"(?:dollars?|cents?|euros?|units?|degrees?|percent(?:age)?|pct|inches|inch|feet|foot|miles?|meters?|"
    r"metres?|centimeters?|cm|km|mm|hours?|minutes?|seconds?|days?|years?|yuan|square\s+units|sq\s+units)"
)
_PERCENT_WORD = re.compile(
    r"(\d|\})(\$?)\s*(?:\\text\{\s*|\\mbox\{\s*)?(?:percent(?:age)?|pct)\b\s*\}?", re.I
)
# `6 \text{ and } 8`, `$1$ and $2$`: two values joined by a word are a list of both.
_TEXT_CONNECTOR = re.compile(
    r"\s*,?\s*\\(?:text|mbox|textnormal)\{\s*,?\s*(?:and|or)\s*\}\s*|(?<=[\d})$])\s*,?\s+(?:and|or)\s+(?=[-\d\\($])"
)
_UNIT_AFTER_NUMBER = re.compile(
    r"(?<=[\d}$])\s*(?:\\(?:text|mbox|textnormal|mathrm)\{\s*~?\s*)?" + _UNIT_WORD + r"\.?\s*\}?\s*$", re.I
)
# A unit expression after a number: unit words (and SI symbols) with powers, products and quotients, in or
# out of `\text{}` / `\mathrm{}` (`10 cm^2`, `10\text{ cm}^{2}`, `5 m/s`, `9.8 \mathrm{m/s^2}`, `10 weeks`).
_UNIT_NAMES = (
    r"(?:square\s+|sq\.?\s+|cubic\s+|cu\.?\s+)?(?:dollars?|cents?|euros?|units?|degrees?|inches|inch|feet|foot|"
    r"ft|yards?|yd|miles?|mi|meters?|metres?|centimeters?|centimetres?|millimeters?|kilometers?|cm|km|mm|m|"
    r"seconds?|secs?|minutes?|mins?|hours?|hrs?|h|s|days?|weeks?|months?|years?|yrs?|grams?|kilograms?|kg|g|"
    r"mg|pounds?|lbs?|ounces?|oz|liters?|litres?|ml|mL|L|gallons?|gal|mph|kph|km/h|newtons?|N|joules?|J|"
    r"watts?|W|volts?|V|hertz|Hz|pascals?|Pa|kPa|ohms?|amperes?|amps?|A|calories?|cal|kcal|acres?|hectares?)"
)
_UNIT_ATOM = (
    r"(?:\\(?:text|mbox|textnormal|mathrm|rm)\s*\{\s*~?\s*)?" + _UNIT_NAMES + r"(?![A-Za-z])\s*\}?"
    r"(?:\s*\^\s*\{?\s*-?\d\s*\}?)?"
)
_UNIT_EXPRESSION = re.compile(
    r"(?:(?<=[\d}$])|(?<=\d\s))\s*~?\s*"
    + _UNIT_ATOM
    + r"(?:\s*(?:/|\\cdot|\*|\\,|\s)?\s*"
    + _UNIT_ATOM
    + r")*\s*\.?\s*$"
)
_LATEX_THOUSANDS = re.compile(r"(?<=\d)(?:\s*\{\s*,\s*\}|,\s*\\!|,\\,|,\\ )\s*(?=\d{3}(?!\d))")
_PERCENT_AFTER_MATH = re.compile(r"(?<!\\)\$\s*(\\?%)")
# A unit mark after a number: degrees Celsius/Fahrenheit, arcminutes/arcseconds (or feet/inches) as primes.
_NUMBER_MARKS = re.compile(
    r"(?<=[\d}])\s*(?:\^\s*\{?\s*\\circ\s*\}?|°)\s*(?:\\mathrm\{\s*([CF])\s*\}|\\text\{\s*([CF])\s*\}|([CF])(?![A-Za-z]))"
    r"|(?<=\d)\s*\^\s*\{\s*\\prime(?:\s*\\prime)?\s*\}|(?<=\d)\s*\^\s*\\prime(?![A-Za-z])"
)
_SPACED_CONNECTIVE = re.compile(r"\s+(?:\\text\{\s*(?:or|and)\s*\}|or|and)\s+|\\text\{\s+(?:or|and)\s+\}")
_INEQUALITY = re.compile(r"[<>≤≥]|\\(?:le|ge|leq|geq|lt|gt|leqslant|geqslant)(?![A-Za-z])")
_MIXED_NUMBER = re.compile(r"^(-?)(\d+)\s+(\d+)\s*/\s*(\d+)$")
_LETTER_RUN = re.compile(r"[A-Za-z]{2,}")
# `x == 2` (Python's equality) is the equation `x = 2`
_DOUBLE_EQUALS = re.compile(r"(?<![<>!=])==(?!=)")
_DOLLAR_LIST = re.compile(r"\$\s*([,;])\s*\$")
_DOLLAR_GAP = re.compile(r"(?<=.)\$\s+\$(?=.)")
_CURRENCY = re.compile(r"\\\$|\\euro\b|[€£¥]|\\pounds\b")
_DOUBLED_COMMAND = re.compile(
    r"\\\\(?=(?:frac|dfrac|tfrac|sqrt|left|right|boxed|text|cdot|times|pi|le|ge|infty|in)\b)"
)
_ONE_SPAN = re.compile(r"\$([^$]+)\$")
_SPANS = re.compile(r"^\$[^$]+\$(?:\s*(?:,|;|and|or)\s*\$[^$]+\$)+\s*\.?$")
_TEXT_CHOICE = re.compile(r"^\\text(?:bf)?\{\s*\(?([A-Ea-e])\)?\s*\}$")
_CHOICE = re.compile(r"^\(?([A-Ea-e])\)?$")
_THOUSANDS = re.compile(r"^-?[1-9]\d{0,2}(?:,\d{3})+(?:\.\d+)?$")

# Exponents are capped at three digits: `1e99999999` must not build a 100-million-digit integer.
_DECIMAL = re.compile(r"^[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d{1,3})?$")
_RATIO = re.compile(r"^([+-]?(?:\d+\.?\d*|\.\d+))/([+-]?(?:\d+\.?\d*|\.\d+))$")
_LATEX_FRAC = re.compile(r"^([+-]?)\\frac\{([+-]?(?:\d+\.?\d*|\.\d+))\}\{([+-]?(?:\d+\.?\d*|\.\d+))\}$")
_SCIENTIFIC = re.compile(
    r"^([+-]?(?:\d+\.?\d*|\.\d+))(?:\\times|\\cdot|\*)10\^(?:[{(]([+-]?\d{1,3})[})]|([+-]?\d))$"
)
_POWER_OF_TEN = re.compile(r"^10\^(?:[{(]([+-]?\d{1,3})[})]|([+-]?\d))$")


def strip_delimiters(s: str) -> str:
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
def clean_answer(answer: str) -> str:
    """Canonical writing of what surrounds a value (see the module docstring); the value is untouched."""
    s = answer.replace("\u2212", "-").strip()
    if _SPANS.match(s):  # `$f(x)=-1$,$f(x)=x+1$` (OlympiadBench): several formulas form one answer
        s = ", ".join(m.group(1).strip() for m in _ONE_SPAN.finditer(s))
    elif s.count("$") > 2:
        s = _DOLLAR_LIST.sub(r"\1 ", s)  # `$$69$,$84$$`: formulas closed and reopened around a comma
        s = _DOLLAR_GAP.sub(" ", s)  # `$a +$ $b$`: one formula split in two
    if "matrix" not in s and "array" not in s:
        s = _DOUBLED_COMMAND.sub(r"\\", s)
    s = _LATEX_THOUSANDS.sub(",", s)
    s = _DOUBLE_EQUALS.sub("=", s)
    s = _NUMBER_MARKS.sub("", s)
    s = _PERCENT_AFTER_MATH.sub(r"\1$", s)  # `$28$ %` -> `$28%$`
    s = _CURRENCY.sub("", s)
    if s.count("$") == 1:  # a lone dollar is currency (`$1,000.99`, `1,000.99$`), never a math delimiter
        s = s.replace("$", "")
    s = _PERCENT_WORD.sub(r"\1\\%\2", s)
    if not _INEQUALITY.search(s):  # `x > 1 or x < -3`: relations joined by a word stay joined (relations)
        s = _TEXT_CONNECTOR.sub(", ", s)
    while s.endswith("\\") and not s.endswith("\\\\"):
        s = s[:-1].rstrip()
    unit = _UNIT_AFTER_NUMBER.search(s)
    if unit is not None and unit.start() > 0:
        s = s[: unit.start()]
    inner = strip_delimiters(s.strip())
    stripped = _strip_unit_expression(inner)
    if stripped != inner:
        s = stripped  # `$15\mbox{ cm}^2$`: the unit inside the math delimiters
    return _MIXED_NUMBER.sub(_mixed_number, s.strip())


def _strip_unit_expression(s: str) -> str:
    """``10 cm^2`` -> ``10``: a unit expression after a number, when what remains is a number (a letter left
    in it would make the "unit" a variable: ``2 m`` may be the product of 2 and m only if m is a unit)."""
    unit = _UNIT_EXPRESSION.search(s)
    if unit is None or unit.start() == 0:
        return s
    if re.fullmatch(r"[\s~]*[A-Za-z]\.?\s*", unit.group()):
        return s  # a lone one-letter unit (`0.64N`, `0.64 N`) may as well be a variable: both sides keep it
    rest = s[: unit.start()].strip()
    if not rest or has_free_symbols(strip_delimiters(rest)) or _LETTER_RUN.search(_COMMAND.sub("", rest)):
        return s
    return rest


def _mixed_number(match: re.Match[str]) -> str:
    """``1 1/2`` -> ``3/2``: a whole number and a proper fraction separated by a space."""
    whole, numerator, denominator = int(match.group(2)), int(match.group(3)), int(match.group(4))
    if denominator == 0 or numerator >= denominator:
        return match.group(0)
    return f"{match.group(1)}{whole * denominator + numerator}/{denominator}"


def _top_level(s: str, needle: str) -> list[int]:
    """Positions of ``needle`` in ``s`` outside any (), [], {} group."""
    out: list[int] = []
    depth = 0
    i = 0
    while i < len(s):
        ch = s[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif depth == 0 and s.startswith(needle, i):
            out.append(i)
            i += len(needle)
            continue
        i += 1
    return out


def top_level_split(s: str, sep: str) -> list[str]:
    """``s`` split at ``sep`` outside any (), [], {} group (a one-element list when there is none)."""
    parts, last = [], 0
    for i in _top_level(s, sep):
        parts.append(s[last:i])
        last = i + len(sep)
    parts.append(s[last:])
    return parts


def split_equals(s: str) -> list[str]:
    """``s`` split at top-level ``=`` (not ``<=``, ``>=``, ``!=``, ``==``)."""
    cuts = [
        i
        for i in _top_level(s, "=")
        if (i == 0 or s[i - 1] not in "<>!=\\") and (i + 1 >= len(s) or s[i + 1] != "=")
    ]
    parts, last = [], 0
    for i in cuts:
        parts.append(s[last:i])
        last = i + 1
    parts.append(s[last:])
    return parts


_LABEL_NOISE = re.compile(
    r"_\{[^{}]*\}|_[A-Za-z0-9]|\^\{?\\prime\}?|'|\\(?:left|right|mathrm|text|operatorname)"
)
_RELATION_WORDS = (re.compile(r"\\approx(?![A-Za-z])"), re.compile(r"\\in(?![A-Za-z])"))
_PAREN_NUMBER = re.compile(r"^\((-?\d+(?:\.\d+)?)\)$")
_LABEL = re.compile(r"^[A-Za-z\\{}()|:,;\s\[\]]+$")


def is_label(text: str) -> bool:
    """True when ``text`` names a quantity (``x``, ``a_n``, ``f(x)``, ``|AB|``, ``(p,q)``, ``\\angle A``, ``A:B``)
    rather than being a value: letters, commands, grouping and subscripts only, no digit or operator."""
    t = text.strip()
    if not t or len(t) > 40:
        return False
    t = _LABEL_NOISE.sub("", t)
    return bool(t.strip()) and _LABEL.match(t) is not None and any(c.isalpha() for c in t)


def one_parenthesised_group(s: str) -> bool:
    """True when one pair of parentheses spans the whole of ``s``."""
    if len(s) < 2 or s[0] != "(" or s[-1] != ")":
        return False
    depth = 0
    for i, ch in enumerate(s):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and i < len(s) - 1:
            return False
    return True


def reduce_relation(s: str) -> str:
    """The value a relation states: ``x = 3`` -> ``3``; a chain -> its last right-hand side; ``x \\approx 1.3``
    -> ``1.3``; ``1/3 \\approx 0.33`` -> ``1/3``. A list, an inequality, relations joined by ``or`` / ``and``,
    or an equation between expressions or quantities (``2x + y = 1``, ``x = y``, ``y - b = mx``: no side is a
    label against a value, ``_assignment``) is returned unchanged."""
    if _top_level(s, ",") or _top_level(s, ";") or _compound(s):
        return s
    if one_parenthesised_group(s) and len(split_equals(s[1:-1])) > 1:
        s = s[1:-1]  # `(35 + 70 = 105)`: a computation in parentheses is the computation
    parts = split_equals(s)
    if len(parts) >= 3 and all(p.strip() for p in parts):
        s = parts[-1]
    elif len(parts) == 2 and _assignment(parts) == 0:
        s = parts[1]
    elif len(parts) == 2 and _assignment(parts) == 1:
        s = parts[0]  # `2 = x`: the same assignment written the other way round
    elif (
        len(parts) == 2
        and parts[1].strip()
        and parts[0].strip()
        and not (has_free_symbols(parts[0]) or has_free_symbols(parts[1]))
    ):
        s = parts[1]  # a computation `3 + 4 = 7`: its result
    for word in _RELATION_WORDS:
        matches = list(word.finditer(s))
        top = set(_top_level(s, matches[0].group())) if matches else set()
        where = [m.start() for m in matches if m.start() in top]
        if where:
            match = word.match(s, where[0])
            left, right = s[: where[0]], s[match.end() :] if match else ""
            if right.strip() and is_label(left):
                s = right
            elif right.strip() and left.strip() and word is _RELATION_WORDS[0]:
                s = left  # `1/3 \approx 0.33`: the exact value is the answer
    return s.strip()


_LABEL_GROUPING = re.compile(r"[{}()\s]")


def relation_label(relation: str) -> str | None:
    """The quantity an assignment names (``x`` in ``x = 2``, ``2 = x`` or ``x = 5 + 6 = 11``), written so that
    ``\\tan(t)`` and ``\\tan t`` agree; None for a bare value, a list or an equation between expressions.

    The grader compares it when both answers are assignments: ``y = 2`` is not the answer ``x = 2``.
    """
    if _top_level(relation, ",") or _top_level(relation, ";") or _compound(relation):
        return None
    parts = split_equals(relation)
    if len(parts) < 2 or not all(p.strip() for p in parts):
        return None
    side = _assignment(parts)
    if side is None:
        return None
    return _LABEL_GROUPING.sub("", _LEFT_RIGHT.sub("", parts[side]))


# `x = 1 or x = 2`, `x > 1 and x < 5`: relations joined by a connective, read whole by `relations`
_CONNECTIVE_WORD = re.compile(r"\\(?:lor|land|vee|wedge)(?![A-Za-z])|(?<![A-Za-z\\])(?:or|and)(?![A-Za-z])")


def _compound(s: str) -> bool:
    return any(match.start() in set(_top_level(s, match.group())) for match in _CONNECTIVE_WORD.finditer(s))


def _assignment(parts: list[str]) -> int | None:
    """Which side of an equation names the quantity it assigns (``x`` in ``x = 2x+1``, ``2 = x``), or None
    for an equation between quantities (``x = y``, ``y - b = mx``): a label against a side that is not one,
    and on the right only against a value (the reversed form ``2 = x``)."""
    left, right = parts[0], parts[-1]
    if is_label(left) and not (len(parts) == 2 and is_label(right)):
        return 0
    if len(parts) == 2 and is_label(right) and not is_label(left) and not has_free_symbols(left):
        return 1
    return None


@lru_cache(maxsize=1 << 16)
def answer_label(answer: str) -> str | None:
    """``relation_label`` of a whole answer after the notational normalisation (see ``normalize_answer``)."""
    return relation_label(notation(answer)[0])


@lru_cache(maxsize=1 << 16)
def normalize_answer(answer: str) -> str:
    """A canonical string for ``answer``: equal outputs mean the answers are written-variants of each other.

    All whitespace is removed last, so ``[1, 2)`` and ``[1,2)`` agree. The result is for comparison only;
    math-verify gets the original text (removing spaces can glue LaTeX commands to letters). An assignment
    is reduced to its value (``reduce_relation``); its label is ``answer_label``.
    """
    s, spaced_list = notation(answer)
    s = reduce_relation(s)
    choice = _CHOICE.match(s)
    if choice:
        s = choice.group(1).upper()
    elif number := _PAREN_NUMBER.match(s):  # `\textbf{(211)}`: an answer choice written as a number
        s = number.group(1)
    if not spaced_list and _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


@lru_cache(maxsize=1 << 16)
def notation(answer: str) -> tuple[str, bool]:
    """The notational part of ``normalize_answer`` (everything before a relation is reduced), and whether
    the answer separated list items with spaces."""
    s = strip_delimiters(clean_answer(answer))
    previous = None
    while s != previous:  # peel nested wrappers and stacked units: `$\boxed{\text{(C)}}$`, `$5$\text{ cm}`
        previous = s
        s = _strip_sign_off(strip_delimiters(_unwrap_whole(s.strip())))
    choice = _TEXT_CHOICE.match(s)
    if choice:
        return choice.group(1).upper(), False
    s = _TEXT_WRAPPED.sub(r"\1", s)
    s = _LEFT_RIGHT.sub("", s)
    s = _SPACING.sub("", s)
    s = _DEGREES.sub("", s)
    s = _PERCENT.sub("", s)
    s = _FRAC_VARIANT.sub(r"\\frac", s)
    # `a=0 or b=0`: the connective is kept as a command, so it survives the removal of spaces
    s = _SPACED_CONNECTIVE.sub(lambda m: " \\lor " if "or" in m.group() else " \\land ", s)
    s = _COMMAND_BEFORE_LETTER.sub(r"\1{}", s)  # `\pi c` must not become the command `\pic`
    spaced_list = re.search(r",\s", s) is not None  # `32, 349` is a list, `32,349` a number
    s = "".join(s.split())
    s = _FRAC_SHORT.sub(r"\\frac{\1}{\2}", s)
    s = _SQRT_SHORT.sub(r"\\sqrt{\1}", s)
    s = s.rstrip(".")
    return s, spaced_list


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
_ENVIRONMENT = re.compile(r"\\(?:begin|end)\{[A-Za-z*]+\}")  # `\begin{vmatrix}`: a name, not variables
# Function and constant names written without a backslash, and the letters sympy reads as constants.
_NOT_VARIABLES = re.compile(
    r"arc(?:sin|cos|tan|cot|sec|csc)h?|a?(?:sinh|cosh|tanh|coth|sech|csch)|a(?:sin|cos|tan|cot|sec|csc)(?![a-z])"
    r"|cosech?|sqrt|sin|cos|tan|cot|sec|csc|log|ln|exp|pi|inf|oo|factorial|binomial|binom|floor|ceil"
    r"|(?<![A-Za-z])[eEiI](?![A-Za-z])"
)
_LETTER = re.compile(r"[A-Za-z]")


@lru_cache(maxsize=1 << 16)
def has_free_symbols(normalized: str) -> bool:
    """True when a normalised answer contains a letter that is a variable (not a command or constant).

    Used to decide "plain number vs an expression in variables" as unequal without math-verify: such a
    pair can only be equal through an assignment (``x=3``), which normalisation has already removed.
    """
    stripped = _COMMAND.sub("", _ENVIRONMENT.sub("", normalized))
    return _LETTER.search(_NOT_VARIABLES.sub("", stripped)) is not None


@lru_cache(maxsize=1 << 16)
def variable_free_relation(answer: str) -> bool:
    """True when ``answer`` is an equation (or chain) whose sides have no variable (``2=3+4``, ``1=1``): a
    statement, which ``relations`` reads by truth value and sides, never reduced to one side on the fast path."""
    s = notation(answer)[0]
    if _top_level(s, ",") or _top_level(s, ";"):
        return False
    parts = split_equals(s)
    return len(parts) >= 2 and all(p.strip() for p in parts) and not any(has_free_symbols(p) for p in parts)


_VARIABLE_LETTER = re.compile(r"[A-Za-z]")


def variable_letters(normalized: str) -> frozenset[str] | None:
    """The letters a normalised math answer uses as variables (commands, function names and the constants
    ``e``/``i`` left out), case kept; None when it has a word (a run of letters that is no known name), so
    text answers (``Yes``) are not read as variables."""
    stripped = _NOT_VARIABLES.sub(" ", _COMMAND.sub(" ", _ENVIRONMENT.sub("", normalized)))
    if re.search(r"[A-Za-z]{2,}", stripped):
        return None
    return frozenset(_VARIABLE_LETTER.findall(stripped))


def numbers_equal(a: Fraction, b: Fraction, rel_tol: float) -> bool:
    """Exact for two integers (so 1000000 != 1000001 at any tolerance), else within ``rel_tol``."""
    if a == b:
        return True
    if a.denominator == 1 and b.denominator == 1:
        return False
    return math.isclose(float(a), float(b), rel_tol=rel_tol, abs_tol=0.0)


_ANSWER_WORD = re.compile(r"(?i)\banswer\b")


def _answer_in_gold_text(text: str) -> str:
    """A gold that is a solution text (a box, an answer label or Minerva's sentence inside it) -> that answer."""
    boxed = "\\boxed" in text or "\\fbox" in text or "\\framebox" in text
    labelled = _ANSWER_WORD.search(text) is not None
    if not (boxed or labelled or len(text) >= 80):
        return text

    found = extract_answer(text, ["answer_line"] if (labelled or len(text) >= 80) else [])
    return found if found else text


def gold_candidates(gold: Any) -> tuple[str, ...]:
    """Every acceptable gold answer as a string: a list/tuple/array gold is any-of; floats lose ``.0``;
    a gold written as a solution text stands for the answer boxed (or stated) in it.

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
            text = _answer_in_gold_text(str(item).strip())
        else:
            raise ValueError(
                f"gold answer of type {type(item).__name__} is not a str, number or list of them"
            )
        if text and text not in out:
            out.append(text)
    if not out:
        raise ValueError(f"gold {gold!r} holds no answer")
    return tuple(out)
