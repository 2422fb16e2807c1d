"""Relations compared as relations: equations and inequalities by both sides, never by one side alone.

Runs inside a grading worker (``mv_worker.verify_pair``), before math-verify, for a pair in which either text
states a relation (``=``, ``==``, ``<``, ``>``, ``\\le``, ``\\ge``, ``\\ne``; several joined by ``or`` / ``and``).
The sides are read by ``symbolic.parse_expression`` (LaTeX or plain / CAS notation), decimals as the exact
numbers they write (``x=1.3^2`` is ``x=1.69``). The rules:

- **Equations with variables** are equal when their differences ``lhs - rhs`` are proportional: the ratio is a
  nonzero constant (``y=x`` and ``x=y``, ``2y=4x-10`` and ``y=2x-5``), or a ratio that vanishes nowhere and
  is undefined only where one of the equations is (``2w+50/w=25`` and ``w(12.5-w)=25``). Dividing by a
  variable is not an equivalence (``yz=2xz-5z`` is not ``y=2x-5``: it also holds on ``z=0``), and neither is
  squaring (``x^2=4`` is not ``x=2``). Where sympy cannot cancel the ratio (functions), it is sampled at
  fixed points of both signs (``symbolic.sample_points``): a constant ratio everywhere is equality. An
  ``or`` of equations is the product of their differences (``x=2 or x=-2`` is ``x^2=4``; a root listed twice
  counts twice, as in ``(x-2)^2=0``, which is not ``x=2``).
- **Inequalities** are equal when both are strict or both are not and the oriented differences have a
  positive ratio (``2<2x`` and ``x>1``; ``x^4\\ge16`` and ``x^2\\ge4``: the ratio ``x^2+4`` is positive).
  Inequalities joined by ``and`` / ``or``, or an inequality against an equation, in one variable: equal when
  their solution sets over the reals are (``x\\ge1 and x\\le1`` is ``x=1``; ``x^2>4`` is ``x>2 or x<-2``).
- **Variable-free relations** (``2=3+4``, ``23^{1.5}=110.304``) are statements, read by truth value and
  sides: two of them are equal when their sides have the same values (so two true computations of one
  value agree, ``3+4=7`` and ``5+2=7``, and a false statement is only itself: ``2=3+4`` is not ``5=7+4``); a
  side written as a decimal is that decimal's rounding (``110.304`` stands for anything within 0.0005).
  Against a relation with variables one is never equal (``1=1`` is not ``x=1``: it says nothing about
  ``x``). Against a bare value, a true one is its result (``3+4=7`` for ``7``) and a false one is nothing.

``relation_equal`` returns None ("no opinion", math-verify decides) when neither text is a relation, when a
side does not parse, or for what these rules do not cover (chains with variables, lists, systems).
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from components.grading.normalize import one_parenthesised_group
from components.grading.symbolic import (
    EXACT_TOL,
    MIN_DEFINED_POINTS,
    big_powers,
    close,
    expressions_equal,
    has_decimal,
    parse_expression,
    sample_points,
    value_at,
)

# Relation signs, longest first, each mapped to one of = != < <= > >=.
_SIGNS = (
    ("\\leqslant", "<="),
    ("\\geqslant", ">="),
    ("\\leq", "<="),
    ("\\geq", ">="),
    ("\\neq", "!="),
    ("\\le", "<="),
    ("\\ge", ">="),
    ("\\ne", "!="),
    ("\\lt", "<"),
    ("\\gt", ">"),
    ("<=", "<="),
    (">=", ">="),
    ("==", "="),
    ("!=", "!="),
    ("≤", "<="),
    ("≥", ">="),
    ("≠", "!="),
    ("=", "="),
    ("<", "<"),
    (">", ">"),
)
_CONNECTIVE = re.compile(
    r"\\text\s*\{\s*(or|and)\s*\}|\\(lor|vee|land|wedge)(?![A-Za-z])|(?<![A-Za-z\\])(or|and)(?![A-Za-z])"
)
_NOISE = re.compile(r"\\left(?![A-Za-z])|\\right(?![A-Za-z])|\\[,;:! ]|\\q?quad(?![A-Za-z])|\$")
_DECIMAL_LITERAL = re.compile(r"^\s*[+-]?(\d*)\.(\d+)\s*$")


class Atom(NamedTuple):
    sides: list[str]
    signs: list[str]


class Relation(NamedTuple):
    """A relation as written: one atom, or atoms and parenthesised relations joined by ``or`` / ``and``
    (``joint``)."""

    atoms: list[Any]  # Atom | Relation
    joint: str | None


def _depths(text: str) -> list[int]:
    depth, out = 0, []
    for ch in text:
        if ch in "([{":
            depth += 1
        out.append(depth)
        if ch in ")]}":
            depth = max(0, depth - 1)
    return out


def _atom(text: str) -> Atom | None:
    """``a < b \\le c`` -> sides and signs at the top level (outside any group)."""
    depths = _depths(text)
    sides, signs, last, i = [], [], 0, 0
    while i < len(text):
        if depths[i] == 0:
            for written, sign in _SIGNS:
                if text.startswith(written, i) and not (
                    written.startswith("\\") and text[i + len(written) : i + len(written) + 1].isalpha()
                ):
                    sides.append(text[last:i].strip())
                    signs.append(sign)
                    i += len(written)
                    last = i
                    break
            else:
                i += 1
                continue
            continue
        i += 1
    sides.append(text[last:].strip())
    if not signs or not all(sides):
        return None
    return Atom(sides, signs)


def parse_relation(text: str) -> Relation | None:
    """The relation ``text`` states, or None when it states none.

    A list of relations is read as solutions: ``;`` separates alternatives (``p=5, q=2; p=7, q=2``), and a
    comma joins a system (``x=1, y=2``, ``[3a+b-c=2, a-b+2c=5, b+c=5]``) unless every item assigns the same
    one variable (``x=1, x=2``: alternatives)."""
    text = _NOISE.sub(" ", text).strip()
    bracketed = False
    for opener, closer in (("[", "]"), ("\\{", "\\}")):
        # `[x=1, y=2]`, `\{x=1, y=2\}`: the brackets of a system
        inner = text[len(opener) : -len(closer)] if text.startswith(opener) and text.endswith(closer) else ""
        if inner and _group_closes_at_end(text, len(opener) - 1) and "=" in inner:
            text, bracketed = inner.strip(), True
            break
    if not text:
        return None
    alternatives = _top_level_split(text, ";")
    if len(alternatives) > 1:
        parsed = [parse_relation(alt) for alt in alternatives]
        return None if any(r is None for r in parsed) else Relation(parsed, "or")
    items = _top_level_split(text, ",")
    if len(items) > 1:
        parsed_items = [parse_relation(item) for item in items]
        if any(r is None for r in parsed_items):
            return None
        atoms = [r.atoms[0] if len(r.atoms) == 1 else r for r in parsed_items]  # type: ignore[union-attr]
        # a bare list of equations in one variable lists its solutions (`x=1, x=2`); with several variables,
        # or in brackets, it is a system (`x=1, y=2`)
        one_variable = len(_letters(text)) == 1
        return Relation(atoms, "or" if one_variable and not bracketed else "and")
    parts, joints, last = [], set(), 0
    depths = _depths(text)
    for match in _CONNECTIVE.finditer(text):
        if depths[match.start()] != 0:
            continue
        word = next(g for g in match.groups() if g)
        joints.add("or" if word in ("or", "lor", "vee") else "and")
        parts.append(text[last : match.start()])
        last = match.end()
    parts.append(text[last:])
    if len(joints) > 1:
        return None  # `a or b and c`: precedence left to the writer
    atoms: list[Any] = []
    for part in (p.strip() for p in parts):
        group = part[1:-1] if one_parenthesised_group(part) else None
        inner = parse_relation(group) if group is not None and _CONNECTIVE.search(group) else None
        atoms.append(inner if inner is not None else _atom(part))
    if any(atom is None for atom in atoms):
        return None
    return Relation(atoms, joints.pop() if joints else None)


def _letters(text: str) -> set[str]:
    """The single letters a relation uses as variables (function names, `e` and `i` left out)."""
    return set(re.findall(r"(?<![A-Za-z\\])[A-Za-df-hj-z](?![A-Za-z])", text))


def _group_closes_at_end(text: str, start: int) -> bool:
    """Whether the group opened at ``start`` closes only at the end of ``text``."""
    depths = _depths(text)
    return all(d > depths[start] - 1 for d in depths[start:-1])


def _top_level_split(text: str, separator: str) -> list[str]:
    """``text`` split at ``separator`` outside any group (one item when there is none)."""
    depths = _depths(text)
    cuts = [i for i, ch in enumerate(text) if ch == separator and depths[i] == 0]
    bounds = [-1, *cuts, len(text)]
    return [text[a + 1 : b].strip() for a, b in zip(bounds, bounds[1:], strict=False)]


def _flat(relation: Relation) -> bool:
    return all(isinstance(atom, Atom) for atom in relation.atoms)


def is_relation(text: str) -> bool:
    """Whether ``text`` states a relation this module reads."""
    return parse_relation(text) is not None


def _exact(text: str) -> Any:
    """A side as an exact sympy expression (decimals as the rationals they write)."""
    import sympy  # lazy: sympy

    expr = parse_expression(text)
    if expr is None:
        return None
    return expr.xreplace({f: sympy.nsimplify(f, rational=True) for f in expr.atoms(sympy.Float)})


def _value_matches(text_a: str, a: Any, text_b: str, b: Any) -> bool:
    """Two variable-free sides are equal; a side written as a decimal stands for its rounding."""
    tolerance = max(_half_unit(text_a), _half_unit(text_b))
    try:
        va, vb = complex(a.evalf(30)), complex(b.evalf(30))
    except (TypeError, ValueError):
        return False
    if tolerance:
        return abs(va - vb) <= tolerance * (1 + 1e-12)
    return close(va, vb, EXACT_TOL)


def _half_unit(text: str) -> float:
    match = _DECIMAL_LITERAL.match(text)
    return 0.5 * 10 ** -len(match.group(2)) if match else 0.0


def _variable_free(atom: Atom, exprs: list[Any]) -> bool:
    return all(not e.free_symbols for e in exprs)


def _sides_of_statement(atom: Atom, exprs: list[Any]) -> tuple[bool, list[tuple[str, Any]]]:
    """(true?, sides) of a variable-free equation chain."""
    sides = list(zip(atom.sides, exprs, strict=True))
    truth = all(_value_matches(a[0], a[1], b[0], b[1]) for a, b in zip(sides, sides[1:], strict=False))
    return truth, sides


def _same_values(a: list[tuple[str, Any]], b: list[tuple[str, Any]]) -> bool:
    return all(any(_value_matches(x[0], x[1], y[0], y[1]) for y in b) for x in a) and all(
        any(_value_matches(y[0], y[1], x[0], x[1]) for x in a) for y in b
    )


def _difference(atom: Atom, exprs: list[Any]) -> tuple[str, Any] | None:
    """(sign, difference) of a two-sided atom, oriented so the relation reads ``difference <sign> 0`` with
    sign one of ``=``, ``!=``, ``>``, ``>=``."""
    if len(exprs) != 2:
        return None
    sign, (left, right) = atom.signs[0], exprs
    if sign in ("<", "<="):
        return (">" if sign == "<" else ">="), right - left
    return sign, left - right


def _proportional(d1: Any, d2: Any, positive: bool) -> bool | None:
    """Is ``d1`` a nonvanishing (for inequalities: positive) multiple of ``d2``?"""
    import sympy  # lazy: sympy

    if d1 == 0 or d2 == 0:
        return d1 == 0 and d2 == 0 and not positive
    if big_powers(d1) or big_powers(d2):
        return _sampled_constant(d1, d2, positive)  # `(x-a)^6000`: cancel would expand it
    together1, together2 = sympy.together(d1), sympy.together(d2)
    ratio = sympy.cancel(together1 / together2)
    if not ratio.free_symbols:
        return bool(ratio.is_positive) if positive else ratio != 0
    numerator, denominator = sympy.fraction(ratio)
    undefined = sympy.fraction(together1)[1] * sympy.fraction(together2)[1]

    def only_where_undefined(factor: Any) -> bool:
        # a zero or pole of the ratio is harmless where one of the relations is undefined (`50/w` at w = 0);
        # anywhere else the two equations differ there (`yz = 2xz - 5z` also holds on z = 0)
        return not factor.free_symbols or not sympy.fraction(sympy.cancel(undefined / factor))[1].free_symbols

    if not positive and only_where_undefined(numerator) and only_where_undefined(denominator):
        return True
    if positive and ratio.is_positive:
        return True
    return _sampled_constant(d1, d2, positive)


def _sampled_constant(d1: Any, d2: Any, positive: bool) -> bool | None:
    """The ratio ``d1/d2`` at the sample points: one nonzero (positive) constant -> True; varying -> False."""
    symbols = sorted((d1.free_symbols | d2.free_symbols), key=lambda s: s.name)
    ratios = []
    for point in sample_points(symbols):
        a, b = value_at(d1, point), value_at(d2, point)
        if a is None or b is None or b == 0:
            continue
        ratios.append(a / b)
    if len(ratios) < MIN_DEFINED_POINTS:
        return None
    first = ratios[0]
    if first == 0 or any(not close(r, first, EXACT_TOL) for r in ratios):
        return False
    return bool(first.real > 0 and abs(first.imag) <= EXACT_TOL * abs(first)) if positive else True


def _solution_set(relation: Relation, exprs: list[list[Any]], variable: Any) -> Any:
    import sympy  # lazy: sympy

    ops = {"=": sympy.Eq, "!=": sympy.Ne, "<": sympy.Lt, "<=": sympy.Le, ">": sympy.Gt, ">=": sympy.Ge}
    sets = []
    for atom, sides in zip(relation.atoms, exprs, strict=True):
        if isinstance(atom, Relation):
            sets.append(_solution_set(atom, sides, variable))
            continue
        atom_set = sympy.S.Reals
        for sign, left, right in zip(atom.signs, sides, sides[1:], strict=False):
            atom_set = sympy.Intersection(
                atom_set, sympy.solveset(ops[sign](left, right), variable, domain=sympy.S.Reals)
            )
        sets.append(atom_set)
    if relation.joint == "or":
        return sympy.Union(*sets)
    return sympy.Intersection(*sets)


def _sets_equal(a: Any, b: Any) -> bool | None:
    import sympy  # lazy: sympy

    if a.has(sympy.ConditionSet) or b.has(sympy.ConditionSet):
        return None
    return bool(sympy.Complement(a, b).is_empty and sympy.Complement(b, a).is_empty)


def relation_equal(gold: str, pred: str) -> bool | None:
    """Is ``pred`` the relation ``gold`` states (see the module docstring)? None: no opinion."""
    g, p = parse_relation(gold), parse_relation(pred)
    if g is None and p is None:
        return None
    if g is None or p is None:
        return _statement_against_value(p if g is None else g, gold if g is None else pred)
    g_exprs, p_exprs = _expressions(g), _expressions(p)
    if g_exprs is None or p_exprs is None:
        return None
    if _system(g) or _system(p):
        return _systems_equal(g, g_exprs, p, p_exprs)
    if not (_flat(g) and _flat(p)):
        return _by_solution_sets(g, g_exprs, p, p_exprs)
    g_free = [_variable_free(a, e) for a, e in zip(g.atoms, g_exprs, strict=True)]
    p_free = [_variable_free(a, e) for a, e in zip(p.atoms, p_exprs, strict=True)]
    if any(g_free) or any(p_free):
        if not (len(g.atoms) == len(p.atoms) == 1 and g_free[0] and p_free[0]):
            return False  # a statement without variables says nothing about any variable
        if set(g.atoms[0].signs) != {"="} or set(p.atoms[0].signs) != {"="}:
            return None
        _, g_sides = _sides_of_statement(g.atoms[0], g_exprs[0])
        _, p_sides = _sides_of_statement(p.atoms[0], p_exprs[0])
        return _same_values(g_sides, p_sides)
    return _with_variables(g, g_exprs, p, p_exprs)


def _expressions(relation: Relation) -> list[Any] | None:
    """The parsed sides, per atom (a nested relation gives a nested list); None when one does not parse."""
    out: list[Any] = []
    for atom in relation.atoms:
        if isinstance(atom, Relation):
            inner = _expressions(atom)
            if inner is None:
                return None
            out.append(inner)
            continue
        sides = [_exact(side) for side in atom.sides]
        if any(e is None for e in sides):
            return None
        out.append(sides)
    return out


def _symbols(exprs: list[Any]) -> set[Any]:
    out: set[Any] = set()
    for item in exprs:
        out |= _symbols(item) if isinstance(item, list) else item.free_symbols
    return out


def _statement_against_value(relation: Relation, value_text: str) -> bool | None:
    """A variable-free relation against a bare value: a true computation is its result, a false one nothing."""
    if (
        len(relation.atoms) != 1
        or not isinstance(relation.atoms[0], Atom)
        or set(relation.atoms[0].signs) != {"="}
    ):
        return None
    atom = relation.atoms[0]
    exprs = [_exact(side) for side in atom.sides]
    value = parse_expression(value_text)
    if value is None or any(e is None for e in exprs) or not _variable_free(atom, exprs):
        return None
    truth, sides = _sides_of_statement(atom, exprs)
    if not truth:
        return False
    last_text, last = sides[-1]
    return expressions_equal(last, value, has_decimal(last_text) or has_decimal(value_text))


def _with_variables(
    g: Relation, g_exprs: list[list[Any]], p: Relation, p_exprs: list[list[Any]]
) -> bool | None:
    g_signs = {sign for atom in g.atoms for sign in atom.signs}
    p_signs = {sign for atom in p.atoms for sign in atom.signs}
    equations = g_signs <= {"="} and p_signs <= {"="}
    if equations and g.joint != "and" and p.joint != "and":
        d1 = _product_of_differences(g, g_exprs)
        d2 = _product_of_differences(p, p_exprs)
        if d1 is None or d2 is None:
            return None
        return _proportional(d1, d2, positive=False)
    if len(g.atoms) == len(p.atoms) == 1 and g_signs == p_signs == {"!="}:
        d1, d2 = _difference(g.atoms[0], g_exprs[0]), _difference(p.atoms[0], p_exprs[0])
        if d1 is None or d2 is None:
            return None
        return _proportional(d1[1], d2[1], positive=False)
    one_variable = len(_symbols(g_exprs) | _symbols(p_exprs)) == 1
    if len(g.atoms) == len(p.atoms) == 1 and not (g_signs | p_signs) & {"=", "!="}:
        d1, d2 = _difference(g.atoms[0], g_exprs[0]), _difference(p.atoms[0], p_exprs[0])
        if d1 is not None and d2 is not None:
            if d1[0] != d2[0]:
                return False  # strict against non-strict
            verdict = _proportional(d1[1], d2[1], positive=True)
            # a positive ratio that is not constant (x^4 >= 0 against x^2 >= 0) may still be an equivalence
            if verdict or not one_variable:
                return verdict
    return _by_solution_sets(g, g_exprs, p, p_exprs)


def _by_solution_sets(g: Relation, g_exprs: list[Any], p: Relation, p_exprs: list[Any]) -> bool | None:
    """Compound or mixed relations in one variable: equal when their solution sets over the reals are."""
    import sympy  # lazy: sympy

    symbols = _symbols(g_exprs) | _symbols(p_exprs)
    if len(symbols) != 1:
        return None
    variable = symbols.pop()
    try:
        return _sets_equal(_solution_set(g, g_exprs, variable), _solution_set(p, p_exprs, variable))
    except (NotImplementedError, TypeError, ValueError, sympy.PolynomialError):
        return None


def _system(relation: Relation) -> bool:
    """Equations joined by ``and`` (a system), alone or as alternatives: solved, not multiplied out."""
    signs = {sign for atom in _atoms(relation) for sign in atom.signs}
    return signs <= {"="} and (
        relation.joint == "and" or any(isinstance(a, Relation) for a in relation.atoms)
    )


def _atoms(relation: Relation) -> list[Atom]:
    out: list[Atom] = []
    for atom in relation.atoms:
        out.extend(_atoms(atom) if isinstance(atom, Relation) else [atom])
    return out


def _solve(relation: Relation, exprs: list[Any], symbols: list[Any]) -> list[tuple[complex, ...]] | None:
    """Every solution of a system (or of its alternatives), as the values of ``symbols`` in order; None when
    one is not a point (a free parameter is left) or it cannot be solved."""
    import sympy  # lazy: sympy

    if relation.joint == "or":
        out: list[tuple[complex, ...]] = []
        for atom, sides in zip(relation.atoms, exprs, strict=True):
            inner = atom if isinstance(atom, Relation) else Relation([atom], None)
            solved = _solve(inner, sides if isinstance(atom, Relation) else [sides], symbols)
            if solved is None:
                return None
            out.extend(solved)
        return out
    equations = []
    for atom, sides in zip(relation.atoms, exprs, strict=True):
        if isinstance(atom, Relation) or len(sides) != 2:
            return None
        equations.append(sympy.Eq(sides[0], sides[1]))
    try:
        solutions = sympy.solve(equations, symbols, dict=True)
    except (NotImplementedError, TypeError, ValueError, sympy.PolynomialError):
        return None
    points = []
    for solution in solutions:
        if set(solution) != set(symbols) or any(v.free_symbols for v in solution.values()):
            return None
        try:
            points.append(tuple(complex(solution[s].evalf(30)) for s in symbols))
        except (TypeError, ValueError):
            return None
    return points


def _systems_equal(g: Relation, g_exprs: list[Any], p: Relation, p_exprs: list[Any]) -> bool | None:
    """Two systems (or sets of alternative solutions, ``p=5, q=2; p=7, q=2``): equal when their solutions are
    the same points, in any order."""
    symbols = sorted(_symbols(g_exprs) | _symbols(p_exprs), key=lambda s: s.name)
    if not symbols:
        return None
    ours, theirs = _solve(g, g_exprs, symbols), _solve(p, p_exprs, symbols)
    if ours is None or theirs is None:
        return None

    def same(a: tuple[complex, ...], b: tuple[complex, ...]) -> bool:
        return all(close(x, y, EXACT_TOL) for x, y in zip(a, b, strict=True))

    return all(any(same(a, b) for b in theirs) for a in ours) and all(
        any(same(a, b) for a in ours) for b in theirs
    )


def _product_of_differences(relation: Relation, exprs: list[list[Any]]) -> Any:
    """An equation (or an ``or`` of equations) as one expression that vanishes exactly on its solutions."""
    out: Any = 1
    for sides in exprs:
        if len(sides) != 2:
            return None  # a chain `a = b = c` with variables: not one equation
        out = out * (sides[0] - sides[1])
    return out
