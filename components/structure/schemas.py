"""The parallel-reasoning schemas as data: NPR, Multiverse and Parallel-R1.

Every schema is described by the same roles, so one parser, one scorer and one mask builder serve all:

==========  =====================  ======================  ======================
role        NPR                    Multiverse              Parallel-R1
==========  =====================  ======================  ======================
block       (implicit)             ``<Parallel>``          ``<Parallel>``
goal        ``<guideline>``        ``<Goal>``              (none)
plan        ``<plan>``             ``<Outline>``           (none)
step        ``<step>``             ``<Path>``              ``<Path>``
summary     ``<takeaway>``         ``<Conclusion>``        ``<Summary>`` (after ``</Parallel>``)
==========  =====================  ======================  ======================

A block is ``[block-open] goal(plan+) step+ summary [block-close]`` (Parallel-R1:
``<Parallel> step+ </Parallel> <Summary>…</Summary>``). The *anchor* is the token every step of a block is
positioned after (``</guideline>``, ``</Goal>``; ``<Parallel>`` when there is no goal); the *merge* token is
the first token after the steps that sees them all (``<takeaway>``, ``<Conclusion>``; ``</Parallel>``).
Nesting (a block inside a step) is allowed only where ``max_depth > 1`` (Multiverse; its engine refuses to
fork deeper than 5). Multiverse's ``<Think>`` wrapper is not part of the schema: our prompts never ask for it.

How a native parallel engine decodes a schema is data too (``ForkRule``, read by
``components.engine.controller``): which tag the main stream emits to ask for a fork, how many branches
there are and what each is forced to start with, the tag that closes a branch, and what is forced into the
main stream once every branch has closed. A schema without a rule decodes sequentially only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import IntEnum


class Role(IntEnum):
    """What a tag does in the grammar; the scanner reports tags by role so the parser is schema-agnostic."""

    BLOCK_OPEN = 0
    BLOCK_CLOSE = 1
    GOAL_OPEN = 2
    GOAL_CLOSE = 3
    PLAN_OPEN = 4
    PLAN_CLOSE = 5
    STEP_OPEN = 6
    STEP_CLOSE = 7
    SUMMARY_OPEN = 8
    SUMMARY_CLOSE = 9


@dataclass(frozen=True)
class TagPair:
    """An element's opening and closing tag strings."""

    open: str
    close: str


@dataclass(frozen=True)
class ForkRule:
    """Where the engine forks a block into concurrent branches and merges them, by tag role.

    trigger: the main stream emitting this tag asks for a fork (NPR: ``</guideline>``; Parallel-R1:
        ``<Parallel>``). The fork is admitted or refused (with a reason) by the controller.
    branches: ``None`` = one branch per plan of the block's goal, labelled with the plan's label (NPR,
        Multiverse); an int = that many unlabelled branches (Parallel-R1's paths).
    branch_open: forced at the start of every branch, followed by ``"<label>:"`` for labelled branches.
    branch_close: a branch ends when it emits this tag.
    merge: forced into the main stream once every branch has closed (NPR: ``<takeaway>``); empty = the main
        stream samples the merge tag itself (Parallel-R1 decodes ``</Parallel><Summary>``). Either way the
        first token after the branches is predicted from the last branch's last token, at
        anchor + longest + 1 (``components.structure.attention``).
    """

    trigger: Role
    branch_open: Role
    branch_close: Role
    merge: tuple[Role, ...] = ()
    branches: int | None = None

    def __post_init__(self) -> None:
        if self.branches is not None and self.branches < 1:
            raise ValueError("ForkRule.branches must be None (one per plan) or >= 1")


@dataclass(frozen=True)
class Schema:
    """One parallel-reasoning format, as data.

    ``answer_label``: the schema's final-answer convention (see the field); the parser checks it and the
    grader reads the labelled line as an explicit answer. ``min_*_chars`` are the content lengths
    (whitespace removed) below which the format score penalises an element; ``labelled`` schemas require
    plans and steps to start with ``N:`` (``1:``, ``2.1:``) and steps to repeat the plan labels in order; ``min_steps`` applies to schemas without plans (with plans, the
    number of steps must equal the number of plans).
    """

    name: str
    step: TagPair
    summary: TagPair
    block: TagPair | None = None
    goal: TagPair | None = None
    plan: TagPair | None = None
    summary_after_block: bool = False
    max_depth: int = 1
    labelled: bool = True
    min_steps: int = 1
    min_plan_chars: int = 3
    min_step_chars: int = 6
    min_summary_chars: int = 6
    fork: ForkRule | None = None
    # How the final answer is written after the last block: None = a boxed answer (NPR, Multiverse); a
    # label = a line starting with it (Parallel-R1: "Final Answer: 42"), a boxed answer still counting.
    answer_label: str | None = None
    role_of: dict[str, Role] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.goal is None and self.block is None:
            raise ValueError(f"schema {self.name}: a schema needs a goal or a block tag to anchor its steps")
        if (self.goal is None) != (self.plan is None):
            raise ValueError(f"schema {self.name}: goal and plan tags come together")
        if self.summary_after_block and self.block is None:
            raise ValueError(f"schema {self.name}: summary_after_block needs a block tag")
        if self.max_depth < 1:
            raise ValueError(f"schema {self.name}: max_depth must be >= 1")
        if self.fork is not None and self.fork.branches is None and self.plan is None:
            raise ValueError(f"schema {self.name}: a fork with one branch per plan needs plan tags")
        roles: dict[str, Role] = {}
        pairs = [
            (self.block, Role.BLOCK_OPEN, Role.BLOCK_CLOSE),
            (self.goal, Role.GOAL_OPEN, Role.GOAL_CLOSE),
            (self.plan, Role.PLAN_OPEN, Role.PLAN_CLOSE),
            (self.step, Role.STEP_OPEN, Role.STEP_CLOSE),
            (self.summary, Role.SUMMARY_OPEN, Role.SUMMARY_CLOSE),
        ]
        for pair, open_role, close_role in pairs:
            if pair is None:
                continue
            for tag, role in ((pair.open, open_role), (pair.close, close_role)):
                if tag in roles:
                    raise ValueError(f"schema {self.name}: tag {tag!r} used twice")
                roles[tag] = role
        object.__setattr__(self, "role_of", roles)

    @property
    def tags(self) -> tuple[str, ...]:
        """Every tag string of the schema (models add these as special tokens)."""
        return tuple(self.role_of)

    @property
    def nesting(self) -> bool:
        return self.max_depth > 1

    @property
    def opener(self) -> Role:
        """The role of the tag that opens a block."""
        return Role.BLOCK_OPEN if self.block is not None else Role.GOAL_OPEN

    @property
    def anchor(self) -> Role:
        """The role of the tag whose position every step of its block restarts after."""
        return Role.GOAL_CLOSE if self.goal is not None else Role.BLOCK_OPEN

    @property
    def merge(self) -> Role:
        """The role of the first tag after the steps; it is positioned after the longest step."""
        return Role.BLOCK_CLOSE if self.summary_after_block else Role.SUMMARY_OPEN

    def tag(self, role: Role) -> str:
        """The tag string playing ``role`` (KeyError if the schema has none)."""
        for tag, r in self.role_of.items():
            if r == role:
                return tag
        raise KeyError(f"schema {self.name} has no tag for role {role.name}")


NPR = Schema(
    name="npr",
    goal=TagPair("<guideline>", "</guideline>"),
    plan=TagPair("<plan>", "</plan>"),
    step=TagPair("<step>", "</step>"),
    summary=TagPair("<takeaway>", "</takeaway>"),
    # NPR's engine (npr-reference.md §1.9): fork at </guideline> into one branch per plan, each forced to
    # start with <step> + its label and closed by </step>; the merge forces <takeaway>.
    fork=ForkRule(
        trigger=Role.GOAL_CLOSE,
        branch_open=Role.STEP_OPEN,
        branch_close=Role.STEP_CLOSE,
        merge=(Role.SUMMARY_OPEN,),
    ),
)

MULTIVERSE = Schema(
    name="multiverse",
    block=TagPair("<Parallel>", "</Parallel>"),
    goal=TagPair("<Goal>", "</Goal>"),
    plan=TagPair("<Outline>", "</Outline>"),
    step=TagPair("<Path>", "</Path>"),
    summary=TagPair("<Conclusion>", "</Conclusion>"),
    max_depth=5,
)

PARALLEL_R1 = Schema(
    name="parallel_r1",
    block=TagPair("<Parallel>", "</Parallel>"),
    step=TagPair("<Path>", "</Path>"),
    summary=TagPair("<Summary>", "</Summary>"),
    summary_after_block=True,
    labelled=False,
    min_steps=2,
    # Parallel-R1's convention (npr-reference.md §3.2): the response ends with a "Final Answer:" line.
    answer_label="Final Answer:",
    # Parallel-R1's rollout loop (npr-reference.md §3.3): the main stream stops at <Parallel>, a fixed number
    # of paths (2 in the paper; GenerationConfig.paths overrides it) are decoded independently, each forced
    # to start with <Path> and closed by </Path>, then </Parallel><Summary> is forced into the main stream,
    # which decodes the summary and goes on. Forcing the merge (their loop appends "</Parallel>\n<Summary>")
    # keeps a third, sequential <Path> out of a block whose paths the trainer masks as siblings.
    fork=ForkRule(
        trigger=Role.BLOCK_OPEN,
        branch_open=Role.STEP_OPEN,
        branch_close=Role.STEP_CLOSE,
        merge=(Role.BLOCK_CLOSE, Role.SUMMARY_OPEN),
        branches=2,
    ),
)

SCHEMAS: dict[str, Schema] = {s.name: s for s in (NPR, MULTIVERSE, PARALLEL_R1)}


def get_schema(name: str | Schema) -> Schema:
    """The schema called ``name`` (``npr``, ``multiverse``, ``parallel_r1``); a Schema passes through."""
    if isinstance(name, Schema):
        return name
    try:
        return SCHEMAS[name]
    except KeyError:
        raise ValueError(f"unknown structure schema {name!r}; known: {', '.join(SCHEMAS)}") from None
