"""The tiny profile's task family: sums of bracketed chains, each bracket an independent multi-step computation.

A problem is ``Compute (3 + 4 + 5 - 8) + (7 - 1 + 2) - (2 + 9 - 4) + (5 + 1 - 3).``: a few brackets joined
by ``+``/``-``, each bracket a chain of single-digit operands joined by ``+``/``-``. A bracket is worked out
on its own, operation by operation (``3 + 4 = 7, 7 + 5 = 12, 12 - 8 = 4``), so the brackets are the
independent parts a parallel plan needs: one short plan and one step per bracket, then a takeaway that
combines the bracket values. The steps are most of a solution's tokens, which is what makes parallel
decoding pay: a correct parallel trace of a 4-bracket problem has a critical path of less than half its
tokens (docs/results.md measures the ideal speedup of the test split).

Every number stays small so a ~1.7M-parameter model can learn the arithmetic: operands are 1..9, every
running value of a chain lies in 0..19, and every bracket's value is a single digit (0..9), so the takeaway
adds and subtracts single digits (answers in -27..36). Problems are drawn uniformly among the chains that
satisfy these bounds.

Difficulty levels (distinct shapes, so a curriculum can tell them apart):

* ``easy``:   3 brackets of 3 operands (2 operations each)
* ``medium``: 4 brackets of 4 operands (3 operations each)
* ``hard``:   4 brackets of 5 operands (4 operations each)

Partition (why no evaluation problem is ever trained on, whatever the seeds): every problem belongs to one
of three partitions by its content id (``partition``): 5% ``test``, 5% ``val``, the rest ``train``.
`sample_orz` draws its held-out test split only from ``test``, its validation split only from ``val`` and
its training split only from ``train``; the committed seed checkpoint was built from ``train`` problems
only (``components.training.tiny_seed``). So the seed build, distillation and RL never see a test problem.

Records follow the ORZ-normalised schema ``{id, problem, answer, source, difficulty}`` plus ``expression``
(the brackets and the joining operators) so solutions can be rendered without re-parsing the text.
"""

from __future__ import annotations

import functools
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from components.data.problems import content_id

Difficulty = Literal["easy", "medium", "hard"]
Style = Literal["parallel", "sequential"]
Partition = Literal["train", "val", "test"]
DIFFICULTIES: tuple[str, ...] = ("easy", "medium", "hard")
SOURCE = "synthetic"
OPERAND_RANGE = range(1, 10)
RUNNING_RANGE = range(0, 20)  # every intermediate value of a chain
PART_VALUE_RANGE = range(0, 10)  # every bracket's value: the takeaway combines single digits
# Partition of the problem space by content id: id (hex) mod PARTITION_MODULUS.
PARTITION_MODULUS = 20
PARTITION_OF_BUCKET: dict[int, Partition] = {0: "test", 1: "val"}

# Realistic format mistakes for the seed SFT mix (the seed model must see, and RL must later remove, them).
MISTAKES: tuple[str, ...] = (
    "missing_guideline_close",  # no </guideline>
    "missing_takeaway_tags",  # takeaway text without <takeaway></takeaway>
    "untagged_step",  # the last step written without <step></step>
    "no_boxed",  # final answer not in \boxed{}
    "unclosed_step",  # the first <step> never closed
    "plan_step_mismatch",  # one step fewer than plans
)
ORDINALS = ("first", "second", "third", "fourth", "fifth", "sixth")

_APPLY = {"+": lambda x, y: x + y, "-": lambda x, y: x - y}


@dataclass(frozen=True)
class LevelSpec:
    """How problems of one difficulty are drawn: ``n_parts`` brackets of ``n_operands`` operands each."""

    n_parts: int
    n_operands: int

    def capacity(self) -> int:
        """Number of distinct problems of this level (how many ``generate_problems`` can return)."""
        return _chain_count(self.n_operands) ** self.n_parts * 2 ** (self.n_parts - 1)


LEVELS: dict[str, LevelSpec] = {
    "easy": LevelSpec(n_parts=3, n_operands=3),
    "medium": LevelSpec(n_parts=4, n_operands=4),
    "hard": LevelSpec(n_parts=4, n_operands=5),
}
DEFAULT_WEIGHTS: dict[str, float] = {"easy": 0.2, "medium": 0.4, "hard": 0.4}

_CHAIN = r"\(\s*\d+(?:\s*[-+]\s*\d+)+\s*\)"
_PROBLEM = re.compile(rf"^\s*Compute\s+({_CHAIN}(?:\s*[-+]\s*{_CHAIN})+)\s*\.?\s*$")
_JOIN = re.compile(rf"([-+])?\s*({_CHAIN})")
_TOKEN = re.compile(r"\d+|[-+]")


def fmt_number(value: int) -> str:
    """An integer as written inside an expression: negatives in brackets, ``(-3)``."""
    return str(value) if value >= 0 else f"({value})"


@dataclass(frozen=True)
class Part:
    """One bracket: ``operands[0] ops[0] operands[1] ops[1] ...``, evaluated left to right."""

    operands: tuple[int, ...]
    ops: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.operands) < 2 or len(self.ops) != len(self.operands) - 1:
            raise ValueError(f"a bracket needs >= 2 operands and one operator fewer; got {self!r}")
        if any(op not in _APPLY for op in self.ops):
            raise ValueError(f"unknown operator in {self.ops!r}; known: {sorted(_APPLY)}")

    def running(self) -> list[int]:
        """The value after each operation (the last one is the bracket's value)."""
        values, total = [], self.operands[0]
        for op, x in zip(self.ops, self.operands[1:], strict=True):
            total = _APPLY[op](total, x)
            values.append(total)
        return values

    @property
    def value(self) -> int:
        return self.running()[-1]

    @property
    def text(self) -> str:
        out = str(self.operands[0])
        for op, x in zip(self.ops, self.operands[1:], strict=True):
            out += f" {op} {x}"
        return out

    @property
    def equation(self) -> str:
        """The bracket worked step by step, one operation at a time from the left, the rest copied along:
        ``7 - 3 - 1 + 7 = 4 - 1 + 7 = 3 + 7 = 10``. Every operation reads its two numbers right before it
        (the previous result and the next operand), which is what a small model can learn reliably."""
        lines, rest = [self.text], list(zip(self.ops, self.operands[1:], strict=True))
        for result in self.running():
            rest = rest[1:]
            lines.append(str(result) + "".join(f" {op} {x}" for op, x in rest))
        return " = ".join(lines)


@dataclass(frozen=True)
class Expression:
    """Brackets joined left to right by ``joins`` (``len(joins) == len(parts) - 1``)."""

    parts: tuple[Part, ...]
    joins: tuple[str, ...]

    def __post_init__(self) -> None:
        if len(self.parts) < 2 or len(self.joins) != len(self.parts) - 1:
            raise ValueError(f"an expression needs >= 2 brackets and one join fewer; got {self!r}")
        if any(op not in _APPLY for op in self.joins):
            raise ValueError(f"unknown operator in {self.joins!r}; known: {sorted(_APPLY)}")

    @property
    def value(self) -> int:
        return self.combine([p.value for p in self.parts])

    def combine(self, values: list[int]) -> int:
        """Apply the joining operators left to right to the bracket values."""
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

    def step_text(self, index: int) -> str:
        """Bracket ``index`` (1-based) worked out, ending in its named value: ``7 - 3 - 1 + 7 = 4 - 1 + 7 =
        3 + 7 = 10; v2=10``. The name ``v<index>`` right before the value is what the takeaway copies by
        (see ``takeaway``)."""
        part = self.parts[index - 1]
        return f"{part.equation}; {value_name(index)}={fmt_number(part.value)}"

    @property
    def takeaway(self) -> str:
        """The combining equation over the named step values, e.g. ``v1=4 + v2=7 - v3=2 + v4=5 = 14``.

        Why each term repeats its name: under the parallel attention mask every step starts at the same
        position id, so the takeaway cannot find "the value of step 2" by where it is; it can by what precedes
        it. Writing ``v2=`` and continuing with the token that follows ``v2=`` in the steps is a copy by
        content, the same under the causal and the parallel mask. With the bare values (``4 + 7 - 2 + 5``) the
        parallel checkpoints copied a value from the wrong step in 46% of their answers, the sequential ones
        never (docs/results.md).
        """
        values = [p.value for p in self.parts]
        lhs = f"{value_name(1)}={fmt_number(values[0])}"
        for i, (op, v) in enumerate(zip(self.joins, values[1:], strict=True), start=2):
            lhs += f" {op} {value_name(i)}={fmt_number(v)}"
        return f"{lhs} = {self.value}"

    def to_dict(self) -> dict[str, Any]:
        return {
            "parts": [{"operands": list(p.operands), "ops": list(p.ops)} for p in self.parts],
            "joins": list(self.joins),
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Expression:
        return cls(
            parts=tuple(
                Part(tuple(int(x) for x in p["operands"]), tuple(str(op) for op in p["ops"]))
                for p in data["parts"]
            ),
            joins=tuple(str(op) for op in data["joins"]),
        )

    @classmethod
    def parse(cls, problem: str) -> Expression:
        """Read an expression back from problem text such as ``Compute (7 + 3 - 2) + (5 - 1 + 4).``"""
        m = _PROBLEM.match(problem)
        if not m:
            raise ValueError(f"not a synthetic arithmetic problem: {problem!r}")
        parts, joins = [], []
        for i, jm in enumerate(_JOIN.finditer(m.group(1))):
            if (jm.group(1) is None) != (i == 0):
                raise ValueError(f"not a synthetic arithmetic problem: {problem!r}")
            if jm.group(1):
                joins.append(jm.group(1))
            tokens = _TOKEN.findall(jm.group(2))
            parts.append(Part(tuple(int(t) for t in tokens[::2]), tuple(tokens[1::2])))
        return cls(parts=tuple(parts), joins=tuple(joins))


def expression_of(record: Mapping[str, Any]) -> Expression:
    """The expression of a synthetic record (its ``expression`` field, else parsed from ``problem``)."""
    if record.get("expression"):
        return Expression.from_dict(record["expression"])
    return Expression.parse(str(record["problem"]))


def problem_text(expr: Expression) -> str:
    return f"Compute {expr.text}."


def partition(record_id: str) -> Partition:
    """The partition of a problem by its content id (hex): 5% ``test``, 5% ``val``, the rest ``train``."""
    return PARTITION_OF_BUCKET.get(int(record_id, 16) % PARTITION_MODULUS, "train")


@functools.cache
def _continuations(n_ops_left: int, value: int) -> int:
    """How many ways a chain at running ``value`` can finish with ``n_ops_left`` more operations."""
    if n_ops_left == 0:
        return 1 if value in PART_VALUE_RANGE else 0
    return sum(
        _continuations(n_ops_left - 1, nxt)
        for op in _APPLY
        for x in OPERAND_RANGE
        if (nxt := _APPLY[op](value, x)) in RUNNING_RANGE
    )


def _chain_count(n_operands: int) -> int:
    return sum(_continuations(n_operands - 1, a) for a in OPERAND_RANGE)


def _draw_part(n_operands: int, rng: random.Random) -> Part:
    """A chain drawn uniformly among all valid chains of ``n_operands`` (weights = valid continuations)."""
    starts = list(OPERAND_RANGE)
    value = rng.choices(starts, weights=[_continuations(n_operands - 1, a) for a in starts])[0]
    operands, ops = [value], []
    for left in range(n_operands - 2, -1, -1):
        moves = [
            (op, x, nxt)
            for op in _APPLY
            for x in OPERAND_RANGE
            if (nxt := _APPLY[op](value, x)) in RUNNING_RANGE and _continuations(left, nxt)
        ]
        op, x, value = rng.choices(moves, weights=[_continuations(left, nxt) for _, _, nxt in moves])[0]
        operands.append(x)
        ops.append(op)
    return Part(tuple(operands), tuple(ops))


def _draw(level: LevelSpec, rng: random.Random) -> Expression:
    parts = tuple(_draw_part(level.n_operands, rng) for _ in range(level.n_parts))
    joins = tuple(rng.choice(("+", "-")) for _ in range(level.n_parts - 1))
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


def generate_problems(
    n: int,
    seed: int,
    weights: Mapping[str, float] | None = None,
    partitions: tuple[Partition, ...] | None = None,
) -> list[dict[str, Any]]:
    """``n`` distinct synthetic problems, deterministic in ``seed``, difficulties mixed by ``weights``.

    Distinct within one call (so a generated pool never trips the duplicate check); the order is shuffled
    so difficulties interleave. ``partitions`` keeps only problems of those partitions (``partition``;
    None = all). Raises ValueError when a level is asked for more problems than it has.
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
            if expr in seen:
                continue
            record = make_record(expr, difficulty)
            if partitions is not None and partition(record["id"]) not in partitions:
                continue
            seen.add(expr)
            records.append(record)
    rng.shuffle(records)
    return records


def value_name(index: int) -> str:
    """The name of bracket ``index``'s value (1-based) in its step and in the takeaway."""
    return f"v{index}"


def _plan_text(index: int) -> str:
    return f"{ORDINALS[index]} bracket" if index < len(ORDINALS) else f"bracket {index + 1}"


def render_parallel(expr: Expression, rng: random.Random, mistake: str | None = None) -> str:
    """The NPR-schema response in canonical layout, optionally with one format mistake (see MISTAKES).

    Plans are short (``1: first bracket``) so the steps, worked out in parallel, dominate the trace.
    ``rng`` is accepted for symmetry with ``render_sequential`` (the parallel rendering has one form).
    """
    plans = [f"<plan>{i}: {_plan_text(i - 1)}</plan>" for i in range(1, len(expr.parts) + 1)]
    steps = [f"<step>{i}: {expr.step_text(i)}</step>" for i in range(1, len(expr.parts) + 1)]
    guideline_close = "</guideline>"
    takeaway = f"<takeaway>{expr.takeaway}</takeaway>"
    tail = f" \\boxed{{{expr.value}}}"
    if mistake == "missing_guideline_close":
        guideline_close = ""
    elif mistake == "missing_takeaway_tags":
        takeaway = expr.takeaway + "."
    elif mistake == "untagged_step":
        steps[-1] = f"{len(steps)}: {expr.step_text(len(steps))}"
    elif mistake == "no_boxed":
        tail = f" The answer is {expr.value}."
    elif mistake == "unclosed_step":
        steps[0] = steps[0].removesuffix("</step>")
    elif mistake == "plan_step_mismatch":
        steps = steps[:-1]
    elif mistake is not None:
        raise ValueError(f"unknown mistake {mistake!r}; known: {MISTAKES}")
    return "<guideline>" + "".join(plans) + guideline_close + "".join(steps) + takeaway + tail


def render_sequential(expr: Expression, rng: random.Random) -> str:
    """A plain step-by-step solution (one of three templates) ending in ``\\boxed{}``."""
    eqs = [expr.step_text(i) for i in range(1, len(expr.parts) + 1)]
    boxed = f"\\boxed{{{expr.value}}}"
    template = rng.randrange(3)
    if template == 0:
        body = " ".join(f"{ORDINALS[i].capitalize()}, {e}." for i, e in enumerate(eqs))
        return f"{body} Then {expr.takeaway}. The answer is {boxed}."
    if template == 1:
        body = " ".join(f"Bracket {i}: {e}." for i, e in enumerate(eqs, start=1))
        return f"{body} So {expr.takeaway} and the answer is {boxed}."
    return "; ".join(eqs) + f"; {expr.takeaway}. {boxed}"


def render_solution(
    record: Mapping[str, Any], style: Style, rng: random.Random, mistake: str | None = None
) -> str:
    """The assistant response text (no end-of-turn token) solving a synthetic problem record.

    ``style="parallel"`` gives ``<guideline><plan>1: first bracket</plan>...</guideline><step>1: ...</step>
    ...<takeaway>...</takeaway> \\boxed{v}`` with no text between ``</guideline>`` and ``<step>`` or between
    steps (the engine's canonical layout); ``mistake`` (one of MISTAKES) breaks it on purpose.
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
