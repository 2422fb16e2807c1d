"""The symbolic fallback: equivalence of two expressions by simplification and sampling, for what math-verify
misses.

Runs inside a grading worker (``mv_worker.verify_pair``) under the pair's deadline. For two expressions it
runs after math-verify has said "not equal" and can only turn that False into True; relations are compared
first, by ``relations.relation_equal`` (which reads its sides with ``parse_expression``). It exists for golds
written in plain / CAS notation (``3*cos(2*t)-1``, ``3**20``, ``(a^3)**2``, ``sec^2 x``, ``arcsec(x)``,
``(n+1)*n!``: math-verify's LaTeX parser reads ``cos(2*t)`` as letters) and for identities that need
simplification (``\\sin^2 t+\\cos^2 t`` = ``1``, ``(1+i)^2`` = ``2i``, ``\\csch x`` = ``1/\\sinh x``).

Reading: a text with a backslash or a brace is LaTeX (``latex2sympy``, the parser math-verify uses, with its
default of lower-casing symbols), after the functions it does not know are rewritten into ones it does
(``\\operatorname{arcsec}``, ``\\csch``, ``\\sech``, ``\\coth`` and their inverses: it would read ``\\csch x`` as
``csc(h x)``) and, inside a trigonometric function, a degree mark is the angle ``pi/180`` (``\\sin(90^\\circ - x)``
= ``\\cos x``; a bare ``36^\\circ`` answer keeps MATH's convention, the degree mark dropped, see
``normalize``). Anything else is plain notation (``sympy.parse_expr`` on a whitelisted text: digits, single
letters, the function names of ``PLAIN_FUNCTIONS``, ``+ - * / ^ ** ( ) . !`` and ``%``; ``^`` is a power,
products and function application may be implicit: ``sin x``, ``sin^2(x)`` = ``sin(x)^2``, ``cos^(-1)(x)`` =
``acos(x)``, ``log_2(8)`` = ``log(8)/log(2)``, ``50%`` = ``1/2``). Nothing else reaches ``parse_expr`` (it
evaluates Python), so a response cannot run code.

Assumptions, stated because they decide verdicts:

- every variable is **real** (``\\sqrt{x^2}`` = ``|x|``, not ``x``); identities that hold only on part of the
  real line are refused: ``\\sqrt{x}\\sqrt{y}`` vs ``\\sqrt{xy}``, ``\\log(x^2)`` vs ``2\\log x``, because sympy
  keeps the principal branches of roots and logarithms, and sampled points of both signs show the
  difference;
- an odd root of a negative number is the real root (``(-8)^{1/3}`` = ``-2``, the school convention);
- ``i`` is the imaginary unit and ``e`` Euler's number (as math-verify reads LaTeX; plain ``I`` / ``E`` too);
- equal means: the difference is 0 after sympy's evaluation, or it vanishes at every sampled point
  (``SAMPLE_POINTS`` fixed points, variables drawn from both signs, 30 digits, relative tolerance
  ``EXACT_TOL``; a point where either side is undefined says nothing, and too few defined points leave it
  to ``simplify``). With a decimal in either text the numbers are approximations and the tolerance is
  ``APPROX_TOL`` relative (the fast path's ``float_rel_tol``): ``-1.709975946`` = ``(-5)^{1/3}``.

It refuses (returns None: "no opinion") for anything that is not a single expression: relations (``=``,
``<``, ``\\le`` ..., which ``relations`` reads), lists and tuples (a comma), sets, intervals, matrices, ``\\pm``,
text, infinity; for texts over ``MAX_CHARS``; for power towers and exponents over ``MAX_EXPONENT``, and
plain-notation powers whose value would exceed ``MAX_DIGITS`` digits (an exact power of that size is a long
computation no deadline can interrupt); and when either side does not parse.
"""

from __future__ import annotations

import math
import random
import re
from typing import Any

MAX_CHARS = 300
MAX_EXPONENT = 1000
MAX_DIGITS = 10_000  # a plain-notation power whose value would have more digits is refused
SAMPLE_POINTS = 12
MIN_DEFINED_POINTS = 3
EXACT_TOL = 1e-12
APPROX_TOL = 1e-6  # GradingConfig.float_rel_tol's default: a decimal is read as an approximation
ZERO_NOISE = 1e-25  # what 40-digit evaluation leaves of an expression that is exactly 0
# Anything that makes an answer more than one expression (or not an expression at all).
_NOT_AN_EXPRESSION = re.compile(
    r"[=<>;\[\]|]|!=|\\[{}%]|\\(?:le|ge|leq|geq|ne|neq|lt|gt|cup|cap|in|notin|subset|pm|mp|infty|text|mbox|"
    r"textbf|mathrm|begin|end|matrix|approx|sim|equiv|to|rightarrow|Rightarrow|forall|exists|land|lor|"
    r"quad|qquad)(?![A-Za-z])|\b(?:and|or)\b"
)
# Function names plain notation may use, and what each is in sympy (aliases of one function included).
PLAIN_FUNCTIONS: dict[str, str] = {
    "sin": "sin",
    "cos": "cos",
    "tan": "tan",
    "cot": "cot",
    "sec": "sec",
    "csc": "csc",
    "cosec": "csc",
    "sinh": "sinh",
    "cosh": "cosh",
    "tanh": "tanh",
    "coth": "coth",
    "sech": "sech",
    "csch": "csch",
    "cosech": "csch",
    "asin": "asin",
    "acos": "acos",
    "atan": "atan",
    "acot": "acot",
    "asec": "asec",
    "acsc": "acsc",
    "arcsin": "asin",
    "arccos": "acos",
    "arctan": "atan",
    "arccot": "acot",
    "arcsec": "asec",
    "arccsc": "acsc",
    "asinh": "asinh",
    "acosh": "acosh",
    "atanh": "atanh",
    "acoth": "acoth",
    "asech": "asech",
    "acsch": "acsch",
    "arcsinh": "asinh",
    "arccosh": "acosh",
    "arctanh": "atanh",
    "arccoth": "acoth",
    "arcsech": "asech",
    "arccsch": "acsch",
    "log": "log",
    "ln": "log",
    "exp": "exp",
    "sqrt": "sqrt",
    "abs": "Abs",
    "factorial": "factorial",
    "binomial": "binomial",
    "binom": "binomial",
    "floor": "floor",
    "ceil": "ceiling",
    "ceiling": "ceiling",
}
# The inverse of each function an `f^(-1)` / `f^{-1}` may name.
_INVERSES = {
    name: "a" + name
    for name in ("sin", "cos", "tan", "cot", "sec", "csc", "sinh", "cosh", "tanh", "coth", "sech", "csch")
}
_NAMES = "|".join(sorted(PLAIN_FUNCTIONS, key=len, reverse=True))
_PLAIN_TEXT = re.compile(r"^[0-9A-Za-z+\-*/^().,!%_\s]+$")
_IDENTIFIER = re.compile(r"[A-Za-z]+")
_KNOWN_NAME = re.compile(rf"^(?:{_NAMES}|pi)$")
_HAS_KNOWN_NAME = re.compile(rf"(?:{_NAMES}|pi)")
# Single letters glued to a function name that is called: `isin(` is `i * sin(`.
_GLUED_CALL = re.compile(rf"^([a-z]+?)({_NAMES})$")
# `sin^2(x)`, `sin^2 x`, `sin^(-1)(x)`, `sin^{-1} x`: a power (or the inverse) of a function, before its argument.
_FUNCTION_POWER = re.compile(rf"\b({_NAMES})\s*\^\s*(\(\s*-?\s*\w+\s*\)|\{{\s*-?\s*\w+\s*\}}|-?\w)\s*")
# `cos t sin(2 t)`: a function applied to one bare token is that token's function, not the rest's.
_BARE_ARGUMENT = re.compile(rf"\b({_NAMES}|(?:{_NAMES})_pow\w+)\s+([A-Za-z]|\d+(?:\.\d+)?)(?![\w.^(])")
_LOG_BASE = re.compile(r"\blog_\s*(\{[^{}]+\}|\([^()]+\)|\w+)\s*")
_PERCENT = re.compile(r"(\d+(?:\.\d+)?|[A-Za-z])\s*%")
# `2^{3^{4}}`, `3**20**20`, `2^(3^4)`: a number's power in an exponent; `x^{12345}`: a large exponent.
_TOWER = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*[\d.]+\s*(?:\^|\*\*)")
_BIG_EXPONENT = re.compile(r"(?:\^|\*\*)\s*[{(]?\s*-?\d{4,}")
_DECIMAL = re.compile(r"(?<![\w.])\d*\.\d+|\d+\.(?![\d.])")

# LaTeX functions latex2sympy does not read as functions (it would read `\csch x` as `csc(h x)`): each as a
# template around its argument, in functions it does read.
_LATEX_REWRITES = {
    "csch": r"\frac{{1}}{{\sinh\left({0}\right)}}",
    "sech": r"\frac{{1}}{{\cosh\left({0}\right)}}",
    "coth": r"\frac{{\cosh\left({0}\right)}}{{\sinh\left({0}\right)}}",
    "cosec": r"\frac{{1}}{{\sin\left({0}\right)}}",
    "arcsech": r"\cosh^{{-1}}\left(\frac{{1}}{{{0}}}\right)",
    "arccsch": r"\sinh^{{-1}}\left(\frac{{1}}{{{0}}}\right)",
    "arccoth": r"\tanh^{{-1}}\left(\frac{{1}}{{{0}}}\right)",
    "arsinh": r"\sinh^{{-1}}\left({0}\right)",
    "arcosh": r"\cosh^{{-1}}\left({0}\right)",
    "artanh": r"\tanh^{{-1}}\left({0}\right)",
    "asin": r"\arcsin\left({0}\right)",
    "acos": r"\arccos\left({0}\right)",
    "atan": r"\arctan\left({0}\right)",
}
_LATEX_FUNCTION = re.compile(
    r"\\operatorname\s*\{\s*([A-Za-z]+)\s*\}|\\("
    + "|".join(sorted(_LATEX_REWRITES, key=len, reverse=True))
    + r")(?![A-Za-z])"
)
# Functions latex2sympy reads natively when written as a command (`\operatorname{sin}` is `\sin`).
_LATEX_NATIVE = frozenset(
    [
        "sin",
        "cos",
        "tan",
        "cot",
        "sec",
        "csc",
        "sinh",
        "cosh",
        "tanh",
        "arcsin",
        "arccos",
        "arctan",
        "arcsec",
        "arccsc",
        "arccot",
        "log",
        "ln",
        "exp",
    ]
)
# `\frac1{\cos x}`: a one-character numerator without braces
_FRAC_SHORTHAND = re.compile(r"\\[dt]?frac\s*([0-9A-Za-z])(?=\s*\{)")
_TRIG = re.compile(r"\\(?:sin|cos|tan|cot|sec|csc)(?![A-Za-z])")
_DEGREE_MARK = re.compile(r"\^\s*\{\s*\\circ\s*\}|\^\s*\\circ(?![A-Za-z])|°")


def list_comma(text: str) -> bool:
    """True when a comma separates items (a list, a tuple) rather than a function's arguments."""
    calls: list[bool] = []
    for match in re.finditer(r"[(),]", text):
        token = match.group()
        if token == "(":
            before = re.search(r"([A-Za-z]+)\s*$", text[: match.start()])
            calls.append(before is not None and before.group(1).lower() in PLAIN_FUNCTIONS)
        elif token == ")":
            if calls:
                calls.pop()
        elif not (calls and calls[-1]):
            return True
    return False


def _plain_source(text: str) -> str | None:
    """The plain-notation text made safe for ``parse_expr``: known names kept (lower-cased), two-letter words
    split into products (``xy`` -> ``x y``), letters glued to a call split off (``isin(`` -> ``i sin(``), powers
    and inverses of functions moved after their argument, or None when it holds anything else (a longer
    word among them)."""
    if not _PLAIN_TEXT.match(text) or "__" in text:
        return None
    text = _LOG_BASE.sub(lambda m: f"logb[{m.group(1).strip('{}()')}]", text)
    text = _PERCENT.sub(r"(\1/100)", text)
    out: list[str] = []
    last = 0
    for match in _IDENTIFIER.finditer(text):
        word = match.group()
        out.append(text[last : match.start()])
        glued = _GLUED_CALL.match(word.lower()) if text[match.end() : match.end() + 1] == "(" else None
        if word == "logb" and text[match.end() : match.end() + 1] == "[":
            out.append(word)
        elif _KNOWN_NAME.match(word.lower()):
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
    source = _BARE_ARGUMENT.sub(r"\1(\2)", _FUNCTION_POWER.sub(_function_power, "".join(out)))
    source = source.replace("^", "**")
    # `logb[b](x)`: the logarithm to base b, as a call sympy's parser accepts
    return re.sub(r"logb\[([^\]]+)\]\s*", r"(1/log(\1))*log", source)


def _function_power(match: re.Match[str]) -> str:
    """``sin^2`` -> ``sin_pow2``, ``sin^n`` -> ``sin_powvn`` (functions ``_powers`` defines), ``sin^(-1)`` ->
    ``asin``; any other power of a function is left as written."""
    name, power = match.group(1).lower(), match.group(2).strip("(){} ").replace(" ", "")
    if power == "-1" and name in _INVERSES:
        return _INVERSES[name] + " "
    if re.fullmatch(r"\d+", power):
        return f"{name}_pow{power} "
    if re.fullmatch(r"[A-Za-z]", power):  # `sin^n x`: a symbolic power
        return f"{name}_powv{power} "
    return match.group(0)


def _parse_plain(text: str) -> Any:
    import sympy  # lazy: sympy (pool workers import it; the parent names this module only)
    from sympy.parsing.sympy_parser import (
        convert_xor,
        implicit_multiplication_application,
        parse_expr,
        standard_transformations,
    )  # lazy: sympy

    source = _plain_source(text)
    if source is None:
        return None
    powers = _powers(source)
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
        "__builtins__": {},
        **{name: getattr(sympy, attr) for name, attr in PLAIN_FUNCTIONS.items()},
        **powers,
    }
    transformations = (*standard_transformations, implicit_multiplication_application, convert_xor)
    # First unevaluated, to size its powers: `((9**99)**99)**99` is small text and a number no deadline stops.
    shape = parse_expr(
        source, local_dict=letters, global_dict=names, transformations=transformations, evaluate=False
    )
    if _digits(shape) > MAX_DIGITS:
        return None
    # odd roots of negative numbers read before evaluation turns `(-5)**0.2` into a complex float
    return _real_odd_roots(shape).doit()


def _powers(source: str) -> dict[str, Any]:
    """The functions ``_function_power`` named: ``sin_pow2(x)`` = ``sin(x)^2``, ``sin_powvn(x)`` = ``sin(x)^n``."""
    import sympy  # lazy: sympy

    powers: dict[str, Any] = {}
    for key, name, kind, exponent in re.findall(r"\b((\w+?)_pow(v?)(\w+))\b", source):
        function = getattr(sympy, PLAIN_FUNCTIONS[name])
        power: Any = sympy.Symbol(exponent, real=True) if kind else sympy.Integer(exponent)
        powers[key] = lambda *args, f=function, p=power: f(*args) ** p
    return powers


def _digits(expr: Any) -> float:
    """An upper bound on the decimal digits of the numbers an unevaluated expression would compute."""
    import sympy  # lazy: sympy

    if isinstance(expr, sympy.Pow):
        if expr.base.free_symbols and not expr.exp.free_symbols:
            return _digits(expr.base)  # `(x-a)^6000` computes no number: it is evaluated at points
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


def _latex_argument(text: str, start: int) -> tuple[str, int] | None:
    """The argument of a function call starting at ``start``: a parenthesised / braced group (``\\left(``
    too) or one token (a number, a letter, a command), and where it ends."""
    rest = text[start:]
    stripped = rest.lstrip()
    offset = start + len(rest) - len(stripped)
    if stripped.startswith("\\left("):
        depth = 0
        for i in range(offset, len(text)):
            if text.startswith("\\left", i):
                depth += 1
            elif text.startswith("\\right", i):
                depth -= 1
                if depth == 0:
                    close = i + len("\\right") + 1
                    return text[offset + len("\\left(") : i], close
        return None
    if stripped[:1] in ("(", "{"):
        opener, closer = stripped[0], ")" if stripped[0] == "(" else "}"
        depth = 0
        for i in range(offset, len(text)):
            depth += text[i] == opener
            depth -= text[i] == closer
            if depth == 0:
                return text[offset + 1 : i], i + 1
        return None
    token = re.match(r"\d+(?:\.\d+)?|[A-Za-z]|\\[A-Za-z]+", stripped)
    return (token.group(), offset + token.end()) if token else None


def _rewrite_latex_functions(text: str) -> str | None:
    """``\\operatorname{sec}`` -> ``\\sec``; ``\\csch^2 x`` -> ``(\\frac{1}{\\sinh(x)})^{2}`` ...; None when a
    function's argument cannot be found."""
    for _ in range(20):  # nested calls: one rewrite at a time, innermost arguments carried along
        match = _LATEX_FUNCTION.search(text)
        if match is None:
            return text
        name = (match.group(1) or match.group(2)).lower()
        if match.group(1) is not None and name in _LATEX_NATIVE:
            text = text[: match.start()] + "\\" + name + " " + text[match.end() :]
            continue
        if name not in _LATEX_REWRITES:
            return None  # `\operatorname{foo}`: a function nobody reads
        position = match.end()
        power = re.match(r"\s*\^\s*(\{[^{}]*\}|-?\d|[A-Za-z])", text[position:])
        if power is not None:
            position += power.end()
        argument = _latex_argument(text, position)
        if argument is None:
            return None
        value = _LATEX_REWRITES[name].format(argument[0])
        if power is not None:
            exponent = power.group(1).strip("{}").strip()
            if exponent == "-1":
                return None  # an inverse of a rewritten function: not read
            value = r"\left(" + value + r"\right)^{" + exponent + "}"
        text = text[: match.start()] + r"\left(" + value + r"\right)" + text[argument[1] :]
    return None


def _parse_latex(text: str) -> Any:
    from latex2sympy2_extended import latex2sympy  # lazy: latex2sympy2_extended

    rewritten = _rewrite_latex_functions(_FRAC_SHORTHAND.sub(r"\\frac{\1}", text))
    if rewritten is None:
        return None
    if _TRIG.search(rewritten):
        # inside a trigonometric function a degree is the angle pi/180 (`\sin(90^\circ - x)` = `\cos x`)
        rewritten = _DEGREE_MARK.sub(r"\\cdot\\frac{\\pi}{180}", rewritten)
    return latex2sympy(rewritten)


def _real_odd_roots(expr: Any) -> Any:
    """``(-5)^{1/3}`` -> ``-5^{1/3}``: an odd root of a negative number is its real root."""
    import sympy  # lazy: sympy

    def is_odd_root(e: Any) -> bool:
        if not (isinstance(e, sympy.Pow) and e.base.is_number and e.base.is_negative):
            return False
        exponent = e.exp
        if isinstance(exponent, sympy.Float):
            exponent = sympy.nsimplify(exponent, rational=True)
        return isinstance(exponent, sympy.Rational) and exponent.q % 2 == 1 and exponent.q > 1

    def real_root(e: Any) -> Any:
        exponent = e.exp
        if isinstance(exponent, sympy.Float):
            exponent = sympy.nsimplify(exponent, rational=True)
        sign = -1 if exponent.p % 2 else 1
        return sign * (-e.base) ** exponent

    return expr.replace(is_odd_root, real_root)


def parse_expression(text: str) -> Any:
    """A sympy expression for one answer (LaTeX or plain notation) under the module's assumptions, or None
    when the fallback refuses it (see the module docstring)."""
    import sympy  # lazy: sympy

    text = text.strip()
    if not text or len(text) > MAX_CHARS or _NOT_AN_EXPRESSION.search(text) or list_comma(text):
        return None
    latex = "\\" in text or "{" in text
    # a large exponent in plain notation is sized by `_digits` (a power of a number) or kept symbolic (a
    # power of an expression in variables is evaluated at points, never expanded: `big_powers`)
    if _TOWER.search(text) or (latex and _BIG_EXPONENT.search(text)):
        return None
    try:
        expr = _parse_latex(text) if latex else _parse_plain(text)
        if not isinstance(expr, sympy.Expr):
            return None
        expr = _real_odd_roots(expr)
    except Exception:  # a parser's error on an odd answer is a refusal, not a crash
        return None
    # The assumptions: real variables, `i` the imaginary unit, `e` Euler's number.
    substitutions: dict[Any, Any] = {}
    for symbol in expr.free_symbols:
        if symbol.name in ("i", "I"):
            substitutions[symbol] = sympy.I
        elif symbol.name in ("e", "E"):
            substitutions[symbol] = sympy.E
        else:
            substitutions[symbol] = sympy.Symbol(symbol.name, real=True)
    return expr.xreplace(substitutions) if substitutions else expr


def big_powers(expr: Any) -> bool:
    """Whether ``expr`` raises something to an exponent over ``MAX_EXPONENT``: simplify, expand and cancel
    would multiply it out (a degree-6000 polynomial), so only sampling decides."""
    import sympy  # lazy: sympy

    return any(
        e.exp.is_number and abs(e.exp) > MAX_EXPONENT for e in expr.atoms(sympy.Pow) if e.exp.is_number
    )


def has_decimal(text: str) -> bool:
    """True when a text writes a number with a decimal point: an approximation (``1E9`` is exact)."""
    return _DECIMAL.search(text) is not None


def sample_points(symbols: list[Any], count: int = SAMPLE_POINTS) -> list[dict[Any, Any]]:
    """Fixed points (the same pair always gets the same verdict) with every variable drawn from both signs:
    a branch identity that holds only for positive values shows up at a negative one."""
    import sympy  # lazy: sympy

    rng = random.Random(0)
    points = []
    for index in range(count):
        point = {}
        for position, symbol in enumerate(symbols):
            # points 4-7 are large (about 10^1.5 to 10^4.5, each sign pattern once): a kink or a constant that
            # only shows far out (`|x+1000|-1000` against `|x+1001|-1001`, `2x+10^9` against `x+10^9`)
            large = (index // 4) % 2 == 1
            spread = rng.uniform(1.0, 2.0)
            magnitude = (
                spread * 10 ** (1.5 + (index % 4) * (position % 3 + 1) * 0.5)
                if large
                else rng.uniform(0.3, 2.7) * spread / 1.5
            )
            # the sign is one bit of the point's index: the points cover every sign pattern of the first three
            # variables (both negative at once included: `\sqrt{x}\sqrt{y}` differs from `\sqrt{xy}` only there)
            negative = ((index % 8) >> (position % 3)) & 1 == 1
            point[symbol] = sympy.Float(-magnitude if negative else magnitude, 30)
        points.append(point)
    return points


def value_at(expr: Any, point: dict[Any, Any]) -> Any:
    """``expr`` at ``point`` as an mpmath complex number (any exponent: ``(x-a)^{6000}`` at x = 1000 is no
    float), or None where it is undefined (a pole, nan)."""
    import mpmath  # lazy: mpmath (sympy's)
    import sympy  # lazy: sympy

    try:
        # adaptive precision (maxn): the cancellation far out (`tanh(x)/2 + 1/2` at x = -1500) is resolved
        value = expr.evalf(40, subs=point, maxn=2000)
        if not value.is_number or value.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo):
            return None
        real, imag = value.as_real_imag()
        out = mpmath.mpc(mpmath.mpf(sympy.Float(real, 40)._mpf_), mpmath.mpf(sympy.Float(imag, 40)._mpf_))
    except (TypeError, ValueError, ZeroDivisionError, OverflowError, AttributeError):
        return None
    if mpmath.isnan(out) or mpmath.isinf(out):
        return None
    return out


def close(a: Any, b: Any, tol: float) -> bool:
    """Equal within ``tol`` relative; against an exact 0, within the evaluation's noise (40 digits)."""
    if a == 0 or b == 0:
        return abs(a - b) <= ZERO_NOISE
    return abs(a - b) <= tol * max(abs(a), abs(b))


def sampled_equal(a: Any, b: Any, tol: float) -> bool | None:
    """Do ``a`` and ``b`` agree at every sampled point? None when too few points are defined for both."""
    symbols = sorted((a - b).free_symbols, key=lambda s: s.name)
    defined = 0
    for point in sample_points(symbols):
        left, right = value_at(a, point), value_at(b, point)
        if left is None or right is None:
            continue
        defined += 1
        if not close(left, right, tol):
            return False
    return True if defined >= MIN_DEFINED_POINTS else None


def expressions_equal(a: Any, b: Any, approximate: bool) -> bool:
    """Two parsed expressions are equal (see the module docstring)."""
    import sympy  # lazy: sympy

    diff = a - b
    if diff == 0:
        return True
    if approximate and not diff.free_symbols:
        values = value_at(a, {}), value_at(b, {})
        if values[0] is not None and values[1] is not None and all(map(_integer_valued, values)):
            # two integers compare exactly, as on the fast path (`4.4 \times 10^7` is not 44000001)
            return round(values[0].real) == round(values[1].real)
    tol = APPROX_TOL if approximate else EXACT_TOL
    verdict = sampled_equal(a, b, tol)
    if verdict is not None:
        return verdict
    if big_powers(diff):
        return False  # too few points to decide, and simplify would expand it
    if sympy.simplify(diff) == 0:
        return True
    # `6 e^{5\pi i/6}` against `6(\cos(5\pi/6) + i \sin(5\pi/6))`: simplify leaves roots of unity; writing
    # both as real and imaginary parts settles it.
    return bool(diff.has(sympy.I) and sympy.simplify(sympy.expand_complex(diff)) == 0)


def _integer_valued(value: complex | None) -> bool:
    """A whole number a float holds exactly (below 2^53; above, every float looks whole: ``1.12 \\times 10^{200}``
    is an approximation)."""
    return (
        value is not None
        and value.imag == 0
        and 1 <= abs(value.real) < 2**53
        and value.real == round(value.real)
    )


def symbolic_equal(gold: str, pred: str) -> bool | None:
    """True when ``gold`` and ``pred`` are the same expression; False when they provably differ or nothing
    shows them equal; None when the fallback refuses the pair (see the module docstring)."""
    a, b = parse_expression(gold), parse_expression(pred)
    if a is None or b is None:
        return None
    return expressions_equal(a, b, has_decimal(gold) or has_decimal(pred))
