"""The tiny profile's task family: small arithmetic expressions whose parts are independent sub-computations.

A problem is ``Compute (a o b) o (c o d).`` (2 parts) or ``Compute (a o b) o (c o d) o (e o f).`` (3 parts),
operands in 1..9. Each bracketed part can be worked out on its own, which is exactly the shape a parallel
plan needs (one plan and one step per part, then a takeaway that combines them); a sequential solution
works them out one after another. Every answer is an integer computed here and re-checkable from the text.

Difficulty levels (calibrated in ../shared/notes/tiny-feasibility.md, where the easy task gave a seed model
with ~33% accuracy after 8 minutes of SFT):

* ``easy``:   2 parts, every operator in {+, -}            (answers in -26..36)
* ``medium``: 3 parts, every operator in {+, -}            (e.g. (a + b) - (c - d) + (e + f))
* ``hard``:   2 parts, inner operators in {+, -, *} with at least one ``*`` (so no hard problem is also an
  easy one), outer operator in {+, -}                      (answers in -80..162)

Records follow the ORZ-normalised schema ``{id, problem, answer, source, difficulty}`` plus ``expression``
(the parts and the joining operators) so solutions can be rendered without re-parsing the text.
Negative numbers inside an expression are written ``(-3)``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from components.data.problems import content_id

Difficulty = Literal["easy", "medium", "hard"]
Style = Literal["parallel", "sequential"]
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")
SOURCE = "synthetic"
OPERAND_RANGE = range(1, 10)

# Realistic format mistakes for the seed SFT mix (the seed model must see, and RL must later remove, them).
MISTAKES: tuple[str, ...] = (
    "missing_guideline_close",  # no </guideline>
    "missing_takeaway_tags",  # takeaway text without <takeaway></takeaway>
    "untagged_step",  # the last step written without <step></step>
    "no_boxed",  # final answer not in \boxed{}
    "unclosed_step",  # the first <step> never closed
    "plan_step_mismatch",  # one step fewer than plans
)


@dataclass(frozen=True)
class LevelSpec:
    """How problems of one difficulty are drawn."""

    n_parts: int
    inner_ops: tuple[str, ...]
    outer_ops: tuple[str, ...]
    require_mul: bool = False

    def capacity(self) -> int:
        """Number of distinct problems of this level (how many ``generate_problems`` can return)."""
        n_operands = len(OPERAND_RANGE) ** (2 * self.n_parts)
        outer = len(self.outer_ops) ** (self.n_parts - 1)
        inner = len(self.inner_ops) ** self.n_parts
        if self.require_mul:
            inner -= len([op for op in self.inner_ops if op != "*"]) ** self.n_parts
        return n_operands * inner * outer


LEVELS: dict[str, LevelSpec] = {
    "easy": LevelSpec(n_parts=2, inner_ops=("+", "-"), outer_ops=("+", "-")),
    "medium": LevelSpec(n_parts=3, inner_ops=("+", "-"), outer_ops=("+", "-")),
    "hard": LevelSpec(n_parts=2, inner_ops=("+", "-", "*"), outer_ops=("+", "-"), require_mul=True),
}
# Mostly easy: the seed model has to reach ~30% accuracy for RL to improve the joint metric on CPU.
DEFAULT_WEIGHTS: dict[str, float] = {"easy": 0.8, "medium": 0.1, "hard": 0.1}

_APPLY = {"+": lambda x, y: x + y, "-": lambda x, y: x - y, "*": lambda x, y: x * y}
_PART = r"\(\s*(\d+)\s*([-+*])\s*(\d+)\s*\)"
_PROBLEM = re.compile(rf"^\s*Compute\s+{_PART}((?:\s*[-+]\s*{_PART})+)\s*\.?\s*$")
_JOINED_PART = re.compile(rf"\s*([-+])\s*{_PART}")


def fmt_number(value: int) -> str:
    """An integer as written inside an expression: negatives in brackets, ``(-3)``."""
    return str(value) if value >= 0 else f"({value})"


@dataclass(frozen=True)
class Part:
    """One bracketed sub-computation ``a op b``."""

    a: int
    op: str
    b: int

    @property
    def value(self) -> int:
        return _APPLY[self.op](self.a, self.b)

    @property
    def text(self) -> str:
        return f"{self.a} {self.op} {self.b}"

    @property
    def equation(self) -> str:
        return f"{self.text} = {self.value}"


@dataclass(frozen=True)
class Expression:
    """Parts joined left to right by ``joins`` (``len(joins) == len(parts) - 1``)."""

    parts: tuple[Part, ...]
    joins: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.parts) < 2 or len(self.joins) != len(self.parts) - 1:
            raise ValueError(f"an expression needs >= 2 parts and one join fewer; got {self!r}")
        for op in (*self.joins, *(p.op for p in self.parts)):
            if op not in _APPLY:
                raise ValueError(f"unknown operator {op!r}")

    @property
    def value(self) -> int:
        return self.combine([p.value for p in self.parts])

    def combine(self, values: list[int]) -> int:
        """Apply the joining operators left to right to the part values."""
        total = values[0]
        for op, v in zip(self.joins, values[1:], strict=True):
            total = _APPLY[op](total, v)
        return total

    @property
    def text(self) -> str:
        out = f"({self.parts[0].text})"
        for op, part in zip(self.joins, self.parts[1:], strict=True):
            out += f" {op} ({part.text})"
        return out

    @property
    def takeaway(self) -> str:
        """The combining equation, e.g. ``10 + (-3) = 7``."""
        values = [p.value for p in self.parts]
        lhs = fmt_number(values[0])
        for op, v in zip(self.joins, values[1:], strict=True):
            lhs += f" {op} {fmt_number(v)}"
        return f"{lhs} = {self.value}"

    def to_dict(self) -> dict[str, Any]:
        return {"parts": [[p.a, p.op, p.b] for p in self.parts], "joins": list(self.joins)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Expression:
        return cls(
            parts=tuple(Part(int(a), str(op), int(b)) for a, op, b in data["parts"]),
            joins=tuple(data["joins"]),
        )

    @classmethod
    def parse(cls, problem: str) -> Expression:
        """Read an expression back from problem text such as ``Compute (7 + 3) + (5 - 8).``"""
        m = _PROBLEM.match(problem)
        if not m:
            raise ValueError(f"not a synthetic arithmetic problem: {problem!r}")
        parts = [Part(int(m.group(1)), m.group(2), int(m.group(3)))]
        joins = []
        for jm in _JOINED_PART.finditer(m.group(4)):
            joins.append(jm.group(1))
            parts.append(Part(int(jm.group(2)), jm.group(3), int(jm.group(4))))
        return cls(parts=tuple(parts), joins=tuple(joins))


def expression_of(record: Mapping[str, Any]) -> Expression:
    """The expression of a synthetic record (its ``expression`` field, else parsed from ``problem``)."""
    if record.get("expression"):
        return Expression.from_dict(record["expression"])
    return Expression.parse(str(record["problem"]))


def problem_text(expr: Expression) -> str:
    return f"Compute {expr.text}."


def _draw(level: LevelSpec, rng: random.Random) -> Expression:
    while True:
        ops = [rng.choice(level.inner_ops) for _ in range(level.n_parts)]
        if not level.require_mul or "*" in ops:
            break
    parts = tuple(Part(rng.choice(OPERAND_RANGE), op, rng.choice(OPERAND_RANGE)) for op in ops)
    joins = tuple(rng.choice(level.outer_ops) for _ in range(level.n_parts - 1))
    return Expression(parts=parts, joins=joins)


def allocate(n: int, weights: Mapping[str, float]) -> dict[str, int]:
    """Split ``n`` over difficulties in proportion to ``weights`` (largest remainder; sums exactly to n)."""
    unknown = set(weights) - set(DIFFICULTIES)
    if unknown:
        raise ValueError(f"unknown difficulty level(s) {sorted(unknown)}; known: {DIFFICULTIES}")
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"difficulty weights must be >= 0 with a positive sum; got {dict(weights)}")
    total = sum(weights.values())
    exact = {d: n * weights.get(d, 0.0) / total for d in DIFFICULTIES}
    counts = {d: int(v) for d, v in exact.items()}
    by_remainder = sorted(DIFFICULTIES, key=lambda d: (-(exact[d] - counts[d]), DIFFICULTIES.index(d)))
    for d in by_remainder[: n - sum(counts.values())]:
        counts[d] += 1
    return counts


def make_record(expr: Expression, difficulty: str) -> dict[str, Any]:
    problem, answer = problem_text(expr), str(expr.value)
    return {
        "id": content_id(problem, answer),
        "problem": problem,
        "answer": answer,
        "source": SOURCE,
        "difficulty": difficulty,
        "expression": expr.to_dict(),
    }


def generate_problems(n: int, seed: int, weights: Mapping[str, float] | None = None) -> list[dict[str, Any]]:
    """``n`` distinct synthetic problems, deterministic in ``seed``, difficulties mixed by ``weights``.

    Distinct within one call (so a generated pool never trips the duplicate check); the order is shuffled
    so difficulties interleave. Raises ValueError when a level is asked for more problems than it has.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    counts = allocate(n, DEFAULT_WEIGHTS if weights is None else weights)
    rng = random.Random(seed)
    records: list[dict[str, Any]] = []
    for difficulty in DIFFICULTIES:
        level, want = LEVELS[difficulty], counts[difficulty]
        if want > level.capacity():
            raise ValueError(
                f"asked for {want} distinct {difficulty} problems but only {level.capacity()} exist"
            )
        seen: set[Expression] = set()
        while len(seen) < want:
            expr = _draw(level, rng)
            if expr not in seen:
                seen.add(expr)
                records.append(make_record(expr, difficulty))
    rng.shuffle(records)
    return records


def _plan_texts(expr: Expression, rng: random.Random) -> list[str]:
    # Half the plans name the part by position, half quote it: both are plausible plans a model could write.
    if rng.random() < 0.5:
        return [f"compute {p.text}" for p in expr.parts]
    names = (
        ["left", "right"]
        if len(expr.parts) == 2
        else ["first", "second", "third", "fourth"][: len(expr.parts)]
    )
    return [f"compute the {name} part" for name in names]


def render_parallel(expr: Expression, rng: random.Random, mistake: str | None = None) -> str:
    """The NPR-schema response in canonical layout, optionally with one format mistake (see MISTAKES)."""
    plans = [f"<plan>{i}: {t}</plan>" for i, t in enumerate(_plan_texts(expr, rng), start=1)]
    steps = [f"<step>{i}: {p.equation}</step>" for i, p in enumerate(expr.parts, start=1)]
    guideline_close = "</guideline>"
    takeaway = f"<takeaway>{expr.takeaway}</takeaway>"
    tail = f" The answer is \\boxed{{{expr.value}}}."
    if mistake == "missing_guideline_close":
        guideline_close = ""
    elif mistake == "missing_takeaway_tags":
        takeaway = expr.takeaway + "."
    elif mistake == "untagged_step":
        steps[-1] = f"{len(steps)}: {expr.parts[-1].equation}"
    elif mistake == "no_boxed":
        tail = f" The answer is {expr.value}."
    elif mistake == "unclosed_step":
        steps[0] = steps[0].removesuffix("</step>")
    elif mistake == "plan_step_mismatch":
        steps = steps[:-1]
    elif mistake is not None:
        raise ValueError(f"unknown mistake {mistake!r}; known: {MISTAKES}")
    return "<guideline>" + "".join(plans) + guideline_close + "".join(steps) + takeaway + tail


def _listing(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def render_sequential(expr: Expression, rng: random.Random) -> str:
    """A plain step-by-step solution (one of three templates) ending in ``\\boxed{}``."""
    eqs = [p.equation for p in expr.parts]
    boxed = f"\\boxed{{{expr.value}}}"
    template = rng.randrange(3)
    if template == 0:
        return f"We compute {_listing(eqs)}, so {expr.takeaway}. The answer is {boxed}."
    if template == 1:
        middle = " ".join(f"Next, {e}." for e in eqs[1:])
        return f"First, {eqs[0]}. {middle} Then {expr.takeaway}. The answer is {boxed}."
    return f"{', '.join(eqs)}, {expr.takeaway}. So the answer is {boxed}."


def render_solution(
    record: Mapping[str, Any], style: Style, rng: random.Random, mistake: str | None = None
) -> str:
    """The assistant response text (no end-of-turn token) solving a synthetic problem record.

    ``style="parallel"`` gives ``<guideline><plan>1: ...</plan>...</guideline><step>1: ...</step>...
    <takeaway>...</takeaway> The answer is \\boxed{v}.`` with no text between ``</guideline>`` and ``<step>``
    or between steps (the engine's canonical layout); ``mistake`` (one of MISTAKES) breaks it on purpose.
    ``style="sequential"`` gives a plain solution; mistakes apply only to the parallel style.
    """
    expr = expression_of(record)
    if style == "parallel":
        return render_parallel(expr, rng, mistake)
    if style == "sequential":
        if mistake is not None:
            raise ValueError("format mistakes apply to the parallel style only")
        return render_sequential(expr, rng)
    raise ValueError(f"unknown style {style!r}; expected 'parallel' or 'sequential'")
