"""The symbolic fallback: equivalence of two expressions by simplification, for what math-verify misses.

Runs inside a grading worker (``mv_worker.verify_pair``), after math-verify has said "not equal", under the
same per-pair deadline; it can only turn that False into True, never the reverse. It exists for golds that
are expressions written in plain / CAS notation (``3*cos(2*t)-1``, ``3**20``, ``(a^3)**2``: math-verify's
LaTeX parser reads ``cos(2*t)`` as letters) and for identities that need simplification
(``\\sin^2 t+\\cos^2 t`` = ``1``, ``(1+i)^2`` = ``2i``).

Reading: a text with a backslash or a brace is LaTeX (``latex2sympy``, the parser math-verify uses, with its
default of lower-casing symbols); anything else is plain notation (``sympy.parse_expr`` on a whitelisted
text: digits, single letters, the usual function names, ``+ - * / ^ ** ( ) .``; ``^`` is a power, products
may be implicit). Nothing else reaches ``parse_expr`` (it evaluates Python), so a response cannot run code.

Assumptions, stated because they decide verdicts:

- every variable is **real** (``\\sqrt{x^2}`` = ``|x|``, not ``x``); identities that hold only on part of the
  real line are refused: ``\\sqrt{x}\\sqrt{y}`` vs ``\\sqrt{xy}``, ``\\log(x^2)`` vs ``2\\log x``, because sympy
  keeps the principal branches of roots and logarithms and does not combine them;
- ``i`` is the imaginary unit and ``e`` Euler's number (as math-verify reads LaTeX; plain ``I`` / ``E`` too);
- equal means ``simplify(gold - pred) == 0`` (with ``i`` in it, also after splitting real and imaginary parts); a difference that random real points show to be non-zero is
  refused at once (most unequal pairs), and one that simplification cannot bring to 0 is refused too
  (no guess from numbers alone).

It refuses (returns None: "no opinion", the verdict stays math-verify's False) for anything that is not a
single expression: relations (``=``, ``<``, ``\\le`` ...), lists and tuples (a comma), sets, intervals,
matrices, ``\\pm``, text, infinity, percent; for texts over ``MAX_CHARS``; for power towers and exponents over
``MAX_EXPONENT``, and plain-notation powers whose value would exceed ``MAX_DIGITS`` digits (an exact power of
that size is a long computation no deadline can interrupt); and when
either side does not parse.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

MAX_CHARS = 300
MAX_EXPONENT = 1000
MAX_DIGITS = 10_000  # a plain-notation power whose value would have more digits is refused
# Anything that makes an answer more than one expression (or not an expression at all).
_NOT_AN_EXPRESSION = re.compile(
    r"[=<>,;\[\]%|!]|\\[{}]|\\(?:le|ge|leq|geq|ne|neq|lt|gt|cup|cap|in|notin|subset|pm|mp|infty|text|mbox|"
    r"textbf|mathrm|begin|end|matrix|approx|sim|equiv|to|rightarrow|Rightarrow|forall|exists|land|lor|"
    r"quad|qquad|circ|degree)(?![A-Za-z])|\b(?:and|or)\b"
)
_PLAIN_FUNCTIONS = (
    "asin|acos|atan|arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|cot|sec|csc|log|ln|exp|sqrt|abs"
)
_PLAIN_TEXT = re.compile(r"^[0-9A-Za-z+\-*/^().\s]+$")
_IDENTIFIER = re.compile(r"[A-Za-z]+")
_KNOWN_NAME = re.compile(rf"^(?:{_PLAIN_FUNCTIONS}|pi)$")
_HAS_KNOWN_NAME = re.compile(rf"(?:{_PLAIN_FUNCTIONS}|pi)")
# Single letters glued to a function name that is called: `isin(` is `i * sin(`.
_GLUED_CALL = re.compile(rf"^([a-z]+?)({_PLAIN_FUNCTIONS})$")
# `2^{3^{4}}`, `3**20**20`, `2^(3^4)`: a number's power in an exponent; `x^{12345}`: a large exponent.
_TOWER = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*[\d.]+\s*(?:\^|\*\*)")
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*-?\d{4,}")
_SAMPLE_POINTS = 3
_TOLERANCE = 1e-9


def _plain_source(text: str) -> str | None:
    """The plain-notation text made safe for ``parse_expr``: known names kept, two-letter words split into
    products (``xy`` -> ``x y``), letters glued to a call split off (``isin(`` -> ``i sin(``), or None when
    it holds anything else (a longer word among them)."""
    if not _PLAIN_TEXT.match(text) or "__" in text:
        return None
    out: list[str] = []
    last = 0
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        out.append(text[last : match.start()])
        glued = _GLUED_CALL.match(word.lower()) if text[match.end() : match.end() + 1] == "(" else None
        if _KNOWN_NAME.match(word.lower()):
            out.append(word.lower())
        elif len(word) <= 2 and not _HAS_KNOWN_NAME.search(word.lower()):
            out.append(" ".join(word))  # `xy`: a product of two variables
        elif glued is not None:  # `isin(x)`, `Bcos(x)`: letters times a function call
            out.append(" ".join(word[: glued.start(2)]) + " " + glued.group(2))
        else:
            # `cosx`, `2sint`: a name glued to its argument, ambiguous; `north`, `odd`: a word, and as a
            # product of letters it would equal its anagrams (`thorn`, `dod`)
            return None
        last = match.end()
    out.append(text[last:])
    return "".join(out).replace("^", "**")


def _parse_plain(text: str) -> Any:
    import sympy  # lazy: sympy
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )  # lazy: sympy

    source = _plain_source(text)
    if source is None:
        return None
    letters = {chr(c): sympy.Symbol(chr(c)) for c in range(ord("a"), ord("z") + 1)}
    letters.update({chr(c): sympy.Symbol(chr(c).lower()) for c in range(ord("A"), ord("Z") + 1)})
    names: dict[str, Any] = {
        "Integer": sympy.Integer,
        "Float": sympy.Float,
        "Rational": sympy.Rational,
        "Symbol": sympy.Symbol,
        "Add": sympy.Add,  # the unevaluated parse names the operations
        "Mul": sympy.Mul,
        "Pow": sympy.Pow,
        "pi": sympy.pi,
        "asin": sympy.asin,
        "acos": sympy.acos,
        "atan": sympy.atan,
        "arcsin": sympy.asin,
        "arccos": sympy.acos,
        "arctan": sympy.atan,
        "sinh": sympy.sinh,
        "cosh": sympy.cosh,
        "tanh": sympy.tanh,
        "sin": sympy.sin,
        "cos": sympy.cos,
        "tan": sympy.tan,
        "cot": sympy.cot,
        "sec": sympy.sec,
        "csc": sympy.csc,
        "log": sympy.log,
        "ln": sympy.log,
        "exp": sympy.exp,
        "sqrt": sympy.sqrt,
        "abs": sympy.Abs,
        "__builtins__": {},
    }
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    # First unevaluated, to size its powers: `((9**99)**99)**99` is small text and a number no deadline stops.
    shape = parse_expr(
        source, local_dict=letters, global_dict=names, transformations=transformations, evaluate=False
    )
    if _digits(shape) > MAX_DIGITS:
        return None
    return parse_expr(source, local_dict=letters, global_dict=names, transformations=transformations)


def _digits(expr: Any) -> float:
    """An upper bound on the decimal digits of the numbers an unevaluated expression would compute."""
    import sympy  # lazy: sympy

    if isinstance(expr, sympy.Pow):
        base, exponent = _digits(expr.base), _magnitude(expr.exp)
        return max(base, 1.0) * max(exponent, 1.0)
    if isinstance(expr, sympy.Number):
        return math.log10(abs(float(expr)) + 1.0) + 1.0 if abs(expr) < 10**300 else float("inf")
    if not expr.args:
        return 1.0
    return max(_digits(arg) for arg in expr.args) + len(expr.args)


def _magnitude(expr: Any) -> float:
    """An upper bound on the absolute value of an unevaluated exponent (1 for a symbolic one)."""
    import sympy  # lazy: sympy

    if isinstance(expr, sympy.Number):
        return abs(float(expr)) if abs(expr) < 10**300 else float("inf")
    if isinstance(expr, sympy.Pow):
        digits = _digits(expr)
        return 10.0**digits if digits < 300 else float("inf")
    if not expr.args:
        return 1.0
    if isinstance(expr, sympy.Mul):
        out = 1.0
        for arg in expr.args:
            out *= max(_magnitude(arg), 1.0)
        return out
    return sum(max(_magnitude(arg), 1.0) for arg in expr.args)


def _parse_latex(text: str) -> Any:
    from latex2sympy2_extended import latex2sympy  # lazy: latex2sympy2_extended

    return latex2sympy(text)


def parse_expression(text: str) -> Any:
    """A sympy expression for one answer (LaTeX or plain notation) under the module's assumptions, or None
    when the fallback refuses it (see the module docstring)."""
    import sympy  # lazy: sympy

    text = text.strip()
    if not text or len(text) > MAX_CHARS or _NOT_AN_EXPRESSION.search(text):
        return None
    if _TOWER.search(text) or _BIG_EXPONENT.search(text):
        return None
    try:
        expr = _parse_latex(text) if ("\\" in text or "{" in text) else _parse_plain(text)
    except Exception:  # a parser's error on an odd answer is a refusal, not a crash
        return None
    if not isinstance(expr, sympy.Expr):
        return None
    # The assumptions: real variables, `i` the imaginary unit, `e` Euler's number.
    substitutions: dict[Any, Any] = {}
    for symbol in expr.free_symbols:
        if symbol.name == "i":
            substitutions[symbol] = sympy.I
        elif symbol.name == "e":
            substitutions[symbol] = sympy.E
        else:
            substitutions[symbol] = sympy.Symbol(symbol.name, real=True)
    return expr.xreplace(substitutions) if substitutions else expr


def _differs_somewhere(diff: Any) -> bool:
    """True when the difference is visibly non-zero at a few random real points (a cheap refusal)."""
    import sympy  # lazy: sympy

    symbols = sorted(diff.free_symbols, key=lambda s: s.name)
    rng = random.Random(0)  # fixed points: the same pair always gets the same verdict
    for _ in range(_SAMPLE_POINTS):
        point = {s: sympy.Float(rng.uniform(0.3, 2.7)) for s in symbols}
        try:
            value = complex(diff.evalf(30, subs=point))
        except (TypeError, ValueError, ZeroDivisionError):
            continue  # a pole or an undefined point says nothing
        if value != value:  # nan
            continue
        if abs(value) > _TOLERANCE:
            return True
    return False


def symbolic_equal(gold: str, pred: str) -> bool | None:
    """True when ``gold`` and ``pred`` simplify to the same expression; False when they provably differ or
    simplification cannot show it; None when the fallback refuses the pair (see the module docstring)."""
    import sympy  # lazy: sympy

    a, b = parse_expression(gold), parse_expression(pred)
    if a is None or b is None:
        return None
    diff = a - b
    if diff == 0:
        return True
    if _differs_somewhere(diff):
        return False
    if sympy.simplify(diff) == 0:
        return True
    # `6 e^{5\pi i/6}` against `6(\cos(5\pi/6) + i \sin(5\pi/6))`: simplify leaves roots of unity; writing
    # both as real and imaginary parts settles it.
    return bool(diff.has(sympy.I) and sympy.simplify(sympy.expand_complex(diff)) == 0)
