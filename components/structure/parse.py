"""Parse a response (text or token ids) into a ``Trace``: one grammar machine over the scanner's events.

The machine keeps a stack of open blocks (depth > 1 only where the schema allows nesting) and never
backtracks: each event is handled once, so parsing is linear in the input. It recovers from every error
by recording a ``Violation`` and ignoring the offending tag, so scoring always gets a full trace; with
``strict=True`` the first *structural* violation (a tag the grammar does not accept, forbidden nesting,
an unclosed block) is raised as ``StructureError`` instead; that is what mask building uses. Content
rules (lengths, labels, counts, the boxed answer) are scored but never raised.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from components.structure.errors import StructureError
from components.structure.scan import TEXT, Event, as_id_array, scan_ids, scan_text
from components.structure.schemas import Role, Schema, get_schema
from components.structure.tokens import TagIds
from components.structure.trace import Block, Segment, Span, Trace, Violation

# Violations that make the tag sequence itself unacceptable (no mask/positions can be built from it).
STRUCTURAL_CODES = frozenset(
    {"misplaced_tag", "nested_block", "unclosed_block", "tag_outside_block", "tag_in_tail"}
)

# A label is `N:` or `N.M:` at the start of a plan or step, as the engine reads it to fork; matched on a
# bounded prefix and unambiguous (digits separated by dots), so it cannot backtrack badly.
_LABEL = re.compile(r"\s*(\d+(?:\.\d+)*)\s*:")
_LABEL_WINDOW = 64
_BOXED = "\\boxed{"
_BRACE = re.compile(r"[{}]")

TextOf = Callable[[int, int], str]


class Phase:
    """Where the machine is inside the innermost open block (plain ints: this is the hot loop)."""

    BEFORE_GOAL = 0  # after <Parallel>, before <Goal> (Multiverse)
    GOAL = 1
    PLAN = 2
    STEPS = 3  # between anchor, steps and merge: the stretch the canonical layout keeps empty
    STEP = 4
    SUMMARY = 5
    AFTER_SUMMARY = 6  # after </Conclusion>, before </Parallel> (Multiverse)
    AFTER_BLOCK = 7  # after </Parallel>, before <Summary> (Parallel-R1)
    NAMES = ("before goal", "goal", "plan", "steps", "step", "summary", "after summary", "after block")


# Role values as plain ints for the hot loop (IntEnum attribute access is slow).
_GOAL_OPEN, _GOAL_CLOSE = int(Role.GOAL_OPEN), int(Role.GOAL_CLOSE)
_PLAN_OPEN, _PLAN_CLOSE = int(Role.PLAN_OPEN), int(Role.PLAN_CLOSE)
_STEP_OPEN, _STEP_CLOSE = int(Role.STEP_OPEN), int(Role.STEP_CLOSE)
_SUMMARY_OPEN, _SUMMARY_CLOSE = int(Role.SUMMARY_OPEN), int(Role.SUMMARY_CLOSE)
_BLOCK_CLOSE = int(Role.BLOCK_CLOSE)
_ROLES = len(Role)

# Violations stored per trace; beyond this only a count is kept (``Trace.violations_dropped``). Any ten
# violations already reach the score floor, so the score is unaffected; the cap keeps adversarial inputs
# (one violation per tag) linear with a small constant.
MAX_STORED_VIOLATIONS = 256


@dataclass
class _Frame:
    start: int
    depth: int
    phase: int
    violations_at_open: int
    anchor: int = -1
    merge: int = -1
    goal_start: int = -1
    goal: Span | None = None
    plans: list[Segment] = field(default_factory=list)
    steps: list[Segment] = field(default_factory=list)
    summary: Segment | None = None
    gaps: list[Span] = field(default_factory=list)
    elem_start: int = -1
    elem_content: int = -1
    step_blocks: list[Block] = field(default_factory=list)
    goal_text_at: int = -1  # first non-blank text in the goal outside plans
    after_plan_text_at: int = -1  # non-blank text since the last </plan> (becomes a gap if a plan follows)
    plans_gap_at: int = -1
    steps_gap_at: int = -1
    stray_text_at: int = -1


def _is_blank(s: str) -> bool:
    return not s or s.isspace()


def parse_label(text: str) -> str | None:
    """The leading ``N:`` / ``N.M:`` label of a plan or step (without the colon), or None."""
    m = _LABEL.match(text, 0, _LABEL_WINDOW)
    return m.group(1) if m else None


def boxed_content(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` (nested braces balanced), or None if absent or unbalanced."""
    i = text.rfind(_BOXED)
    if i < 0:
        return None
    depth = 0
    begin = i + len(_BOXED)
    for m in _BRACE.finditer(text, begin):  # visits braces only, in C between them
        if m.group() == "{":
            depth += 1
        elif depth == 0:
            return text[begin : m.start()]
        else:
            depth -= 1
    return None


def labelled_answer(text: str, label: str) -> str | None:
    """The text after the last ``label`` (``Final Answer:``) up to the end of its line, stripped, or None.

    A label alone on its line takes the next non-blank line (as the grader reads it). Linear: one reverse
    find and a bounded scan of the lines after it.
    """
    i = text.rfind(label)
    if i < 0:
        return None
    rest = text[i + len(label) :]
    line, _, tail = rest.partition("\n")
    if line.strip():
        return line.strip()
    return next((candidate.strip() for candidate in tail.split("\n", 3)[:3] if candidate.strip()), None)


def _squeezed_len(text: str) -> int:
    """Length without any whitespace (the reference scorer strips all whitespace before measuring)."""
    return len("".join(text.split()))


class _Machine:
    def __init__(
        self,
        schema: Schema,
        source: Literal["text", "ids"],
        start: int,
        length: int,
        text_of: TextOf | None,
        strict: bool,
    ) -> None:
        self.schema = schema
        self.source = source
        self.start = start
        self.length = length
        self.text_of = text_of
        self.violations: list[Violation] = []
        self.stack: list[_Frame] = []
        self.blocks: list[Block] = []
        self.top_text: list[Span] = []
        self.strays: list[tuple[int, str]] = []
        self.tag_name = {int(r): t for t, r in schema.role_of.items()}
        self.full_text: str | None = None
        self.dropped = 0
        self.strict = strict
        # Strict parsing raises on the first structural violation, so it must see all of them: no cap.
        self.cap = MAX_STORED_VIOLATIONS if not strict else 1 << 62
        self.opener = int(schema.opener)
        self.table = self._build_table()

    # -- helpers -------------------------------------------------------------------------------------
    def _violate(self, code: str, position: int, reason: str) -> None:
        if len(self.violations) < self.cap:
            self.violations.append(Violation(code, position, reason))
        else:
            self.dropped += 1

    def _misplaced(self, name: str, position: int, where: str) -> None:
        if len(self.violations) < self.cap:  # build the message only when it is kept
            self._violate("misplaced_tag", position, f"{name} not allowed {where}")
        else:
            self.dropped += 1

    def _final(self, code: str, position: int, reason: str) -> None:
        """Whole-trace verdicts are always kept, past the cap too (each occurs at most once)."""
        self.violations.append(Violation(code, position, reason))

    def _blank(self, a: int, b: int) -> bool:
        assert self.text_of is not None
        return _is_blank(self.text_of(a, b))

    def _segment(self, f: _Frame, close_start: int, close_end: int) -> Segment:
        content = Span(f.elem_content, close_start)
        text = self.text_of(*content) if self.text_of is not None else None
        label = parse_label(text) if (text is not None and self.schema.labelled) else None
        return Segment(span=Span(f.elem_start, close_end), content=content, text=text, label=label)

    # -- events --------------------------------------------------------------------------------------
    def feed(self, events: Iterable[Event]) -> None:
        text, tag = self._text, self._tag
        for role, a, b in events:
            if role == TEXT:
                text(a, b)
            else:
                tag(role, a, b)

    def _text(self, a: int, b: int) -> None:
        if not self.stack:
            self.top_text.append(Span(a, b))
            return
        f = self.stack[-1]
        ph = f.phase
        if ph in (Phase.PLAN, Phase.STEP, Phase.SUMMARY):
            return  # element content: measured when the element closes
        if ph == Phase.STEPS:
            f.gaps.append(Span(a, b))
        if self.text_of is None or self._blank(a, b):
            return
        if ph == Phase.STEPS:
            if f.steps_gap_at < 0:
                f.steps_gap_at = a
        elif ph == Phase.GOAL:
            if f.goal_text_at < 0:
                f.goal_text_at = a
            if f.plans and f.after_plan_text_at < 0:
                f.after_plan_text_at = a
        elif f.stray_text_at < 0:
            f.stray_text_at = a

    def _build_table(self) -> list[Callable[[_Frame, int, int, int], None] | None]:
        """Transition table indexed ``phase * _ROLES + role``: the handler of each accepted tag, else None."""
        s = self.schema
        table: list[Callable[[_Frame, int, int, int], None] | None] = [None] * (len(Phase.NAMES) * _ROLES)

        def on(phase: int, role: int, handler: Callable[[_Frame, int, int, int], None]) -> None:
            table[phase * _ROLES + role] = handler

        on(Phase.STEP, self.opener, self._open_nested)
        on(Phase.STEP, _STEP_CLOSE, self._close_step)
        on(Phase.BEFORE_GOAL, _GOAL_OPEN, self._open_goal)
        on(Phase.GOAL, _PLAN_OPEN, self._open_plan)
        on(Phase.GOAL, _GOAL_CLOSE, self._close_goal)
        on(Phase.PLAN, _PLAN_CLOSE, self._close_plan)
        on(Phase.STEPS, _STEP_OPEN, self._open_step)
        if s.summary_after_block:
            on(Phase.STEPS, _BLOCK_CLOSE, self._close_block_before_summary)
            on(Phase.AFTER_BLOCK, _SUMMARY_OPEN, self._open_summary)
        else:
            on(Phase.STEPS, _SUMMARY_OPEN, self._open_summary)
        on(Phase.SUMMARY, _SUMMARY_CLOSE, self._close_summary)
        on(Phase.AFTER_SUMMARY, _BLOCK_CLOSE, self._close_block)
        return table

    def _tag(self, role: int, a: int, b: int) -> None:
        stack = self.stack
        if not stack:
            if role == self.opener:
                self._open_block(role, a)
            else:
                self.strays.append((a, role))
            return
        f = stack[-1]
        handler = self.table[f.phase * _ROLES + role]
        if handler is not None:
            handler(f, role, a, b)
        elif f.phase == Phase.STEP:
            self._misplaced(self.tag_name[role], a, f"inside a step (opened at {f.elem_start})")
        else:
            self._misplaced(
                self.tag_name[role], a, f"in the {Phase.NAMES[f.phase]} of the block at {f.start}"
            )

    # -- transitions (f is the innermost open block) -------------------------------------------------
    def _open_nested(self, f: _Frame, role: int, a: int, b: int) -> None:
        s = self.schema
        if len(self.stack) >= s.max_depth:
            why = "forbids nesting" if not s.nesting else f"allows nesting only {s.max_depth} deep"
            name = self.tag_name[role]
            self._violate("nested_block", a, f"{name} opens a block inside a step; schema {s.name} {why}")
            return
        self._open_block(role, a)

    def _open_block(self, role: int, a: int) -> None:
        s = self.schema
        f = _Frame(
            start=a,
            depth=len(self.stack),
            phase=Phase.STEPS,
            violations_at_open=len(self.violations) + self.dropped,
        )
        if role == _GOAL_OPEN:  # NPR: the goal opens the block
            f.goal_start, f.phase = a, Phase.GOAL
        elif s.goal is not None:
            f.phase = Phase.BEFORE_GOAL
        else:  # Parallel-R1: <Parallel> itself is the anchor
            f.anchor = a
        self.stack.append(f)

    def _close_step(self, f: _Frame, role: int, a: int, b: int) -> None:
        step = self._segment(f, a, b)
        step.blocks = f.step_blocks
        f.steps.append(step)
        f.step_blocks = []
        f.phase = Phase.STEPS

    def _open_goal(self, f: _Frame, role: int, a: int, b: int) -> None:
        f.goal_start, f.phase = a, Phase.GOAL

    def _open_plan(self, f: _Frame, role: int, a: int, b: int) -> None:
        if f.after_plan_text_at >= 0 and f.plans_gap_at < 0:
            f.plans_gap_at = f.after_plan_text_at
        f.after_plan_text_at = -1
        f.elem_start, f.elem_content, f.phase = a, b, Phase.PLAN

    def _close_goal(self, f: _Frame, role: int, a: int, b: int) -> None:
        f.goal, f.anchor, f.phase = Span(f.goal_start, b), a, Phase.STEPS

    def _close_plan(self, f: _Frame, role: int, a: int, b: int) -> None:
        f.plans.append(self._segment(f, a, b))
        f.phase = Phase.GOAL

    def _open_step(self, f: _Frame, role: int, a: int, b: int) -> None:
        f.elem_start, f.elem_content, f.phase = a, b, Phase.STEP
        f.step_blocks = []

    def _open_summary(self, f: _Frame, role: int, a: int, b: int) -> None:
        if f.phase == Phase.STEPS:
            f.merge = a
        f.elem_start, f.elem_content, f.phase = a, b, Phase.SUMMARY

    def _close_block_before_summary(self, f: _Frame, role: int, a: int, b: int) -> None:
        f.merge, f.phase = a, Phase.AFTER_BLOCK

    def _close_summary(self, f: _Frame, role: int, a: int, b: int) -> None:
        f.summary = self._segment(f, a, b)
        if self.schema.block is not None and not self.schema.summary_after_block:
            f.phase = Phase.AFTER_SUMMARY
        else:
            self._complete(b)

    def _close_block(self, f: _Frame, role: int, a: int, b: int) -> None:
        self._complete(b)

    def _complete(self, end: int) -> None:
        f = self.stack.pop()
        block = Block(
            span=Span(f.start, end),
            depth=f.depth,
            anchor=f.anchor,
            merge=f.merge,
            goal=f.goal,
            plans=f.plans,
            steps=f.steps,
            summary=f.summary,
            gaps=f.gaps,
        )
        self._check_block(f, block)
        block.valid = len(self.violations) + self.dropped == f.violations_at_open
        if self.stack:
            self.stack[-1].step_blocks.append(block)
        else:
            self.blocks.append(block)

    def _check_block(self, f: _Frame, block: Block) -> None:
        s = self.schema
        at = block.span.start
        if s.plan is not None:
            if not block.plans:
                self._violate("no_plans", at, "block has no plan")
            if len(block.steps) != len(block.plans):
                self._violate(
                    "step_count_mismatch", at, f"{len(block.steps)} steps for {len(block.plans)} plans"
                )
        elif len(block.steps) < s.min_steps:
            self._violate(
                "too_few_steps", at, f"{len(block.steps)} steps; schema {s.name} needs >= {s.min_steps}"
            )
        if self.text_of is None:
            return  # content rules need text
        if f.goal_text_at >= 0:
            self._violate("goal_text", f.goal_text_at, "text inside the goal outside any plan")
        if f.plans_gap_at >= 0:
            self._violate("plans_not_adjacent", f.plans_gap_at, "text between two plans")
        if f.steps_gap_at >= 0:
            self._violate(
                "steps_not_adjacent", f.steps_gap_at, "text between the goal, the steps and the summary"
            )
        if f.stray_text_at >= 0:
            self._violate("stray_text", f.stray_text_at, "text inside the block outside its elements")
        for plan in block.plans:
            if _squeezed_len(plan.text or "") < s.min_plan_chars:
                self._violate(
                    "plan_too_short", plan.span.start, f"plan shorter than {s.min_plan_chars} characters"
                )
        for step in block.steps:
            if _squeezed_len(step.text or "") < s.min_step_chars:
                self._violate(
                    "step_too_short", step.span.start, f"step shorter than {s.min_step_chars} characters"
                )
        if block.summary is not None and _squeezed_len(block.summary.text or "") < s.min_summary_chars:
            self._violate(
                "summary_too_short",
                block.summary.span.start,
                f"summary shorter than {s.min_summary_chars} characters",
            )
        if s.labelled:
            self._check_labels(block)

    def _check_labels(self, block: Block) -> None:
        unlabelled = [seg for seg in (*block.plans, *block.steps) if seg.label is None]
        if unlabelled:
            self._violate(
                "label_missing", unlabelled[0].span.start, f"{len(unlabelled)} plans/steps lack an `N:` label"
            )
            return
        plan_labels = [p.label for p in block.plans]
        step_labels = [st.label for st in block.steps]
        if len(plan_labels) == len(step_labels) and plan_labels != step_labels:
            self._violate(
                "label_mismatch",
                block.steps[0].span.start,
                f"step labels {step_labels} != plan labels {plan_labels}",
            )

    # -- end of input --------------------------------------------------------------------------------
    def finish(self) -> Trace:
        for f in self.stack:
            self._final(
                "unclosed_block",
                f.start,
                f"block opened here is still in its {Phase.NAMES[f.phase]} at the end",
            )
        last_end = self.blocks[-1].span.end if self.blocks else self.start
        for pos, role in self.strays:
            if len(self.violations) >= self.cap:
                self.dropped += 1
                continue
            name = self.tag_name[role]
            if pos < last_end:
                self._violate("tag_outside_block", pos, f"{name} between blocks belongs to no block")
            else:
                self._violate("tag_in_tail", pos, f"{name} after the last complete block")
        if not self.blocks:
            self._final("no_block", self.start, "no complete parallel block")
        answer = Span(last_end, self.length)
        answer_text = self.text_of(*answer) if self.text_of is not None else None
        if answer_text is not None:
            boxed = boxed_content(answer_text)
            label = self.schema.answer_label
            if (boxed is None or _is_blank(boxed)) and (label is None or not labelled_answer(answer_text, label)):
                where = "after the last block" if self.blocks else "in the response"
                form = "\\boxed{}" if label is None else f"{label!r} line or \\boxed{{}}"
                self._final("missing_answer", last_end, f"no non-empty {form} {where}")
        self.violations.sort(key=lambda v: v.position)
        if self.strict:
            for v in self.violations:
                if v.code in STRUCTURAL_CODES:
                    raise StructureError(v.reason, v.position, v.code)
        return Trace(
            schema=self.schema,
            source=self.source,
            start=self.start,
            length=self.length,
            blocks=self.blocks,
            between=[sp for sp in self.top_text if sp.end <= last_end],
            answer=answer,
            answer_text=answer_text,
            violations=self.violations,
            violations_dropped=self.dropped,
            text=self.full_text,
        )


def parse_text(text: str, schema: str | Schema = "npr", *, strict: bool = False) -> Trace:
    """Parse a response text (character offsets). ``strict`` raises ``StructureError`` on bad tag structure."""
    if not isinstance(text, str):
        raise TypeError(f"parse_text needs a str, got {type(text).__name__}")
    schema = get_schema(schema)
    machine = _Machine(schema, "text", 0, len(text), lambda a, b: text[a:b], strict)
    machine.full_text = text
    machine.feed(scan_text(text, schema))
    return machine.finish()


def parse_ids(
    ids: Sequence[int] | np.ndarray,
    tag_ids: TagIds,
    schema: str | Schema | None = None,
    *,
    start: int = 0,
    strict: bool = False,
    check_content: bool = True,
) -> Trace:
    """Parse token ids (token indices) from ``start`` on; ids before it (the prompt) are not looked at.

    Content rules and the answer check run only when ``tag_ids`` carries a decoder and ``check_content``
    is set (mask building turns it off: it needs the tag structure only).
    """
    if schema is not None and get_schema(schema) != tag_ids.schema:
        raise ValueError(
            f"parse_ids: schema {get_schema(schema).name} != tag_ids schema {tag_ids.schema.name}"
        )
    arr = as_id_array(ids)
    decode = tag_ids.decode
    text_of: TextOf | None = None
    if decode is not None and check_content:

        def text_of(a: int, b: int) -> str:
            return decode(arr[a:b].tolist())

    machine = _Machine(tag_ids.schema, "ids", start, int(arr.size), text_of, strict)
    machine.feed(scan_ids(arr, tag_ids.role_of_id, start))
    return machine.finish()
