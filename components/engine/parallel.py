"""Fork and merge of native parallel blocks: when to branch, how each branch starts, how blocks merge.

At ``</guideline>`` the main stream's plans are read; a fork is admitted only if the block is a legal
place to branch (a ``<guideline>`` opened it in the main stream, not inside a step), it has between 1 and
``max_branches`` plans, and the ledger can pay a minimal step per branch plus the ``<takeaway>``.
Otherwise the fork is refused with a recorded reason and decoding simply continues in the main stream.

Canonical positions (docs/architecture.md; npr-reference.md §1.8): with G the position of ``</guideline>``
every branch starts at G + 1; the ``<takeaway>`` that merges the block sits at G + longest + 1, where
longest is the token count of the longest branch (``<step>`` through ``</step>``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from components.engine.ledger import TokenLedger
from components.structure import Role, TagIds, parse_label


@dataclass(frozen=True)
class EngineTags:
    """The single-token ids of the structural tags the engine acts on."""

    guideline_open: int
    guideline_close: int
    plan_open: int
    plan_close: int
    step_open: int
    step_close: int
    takeaway_open: int
    takeaway_close: int

    @classmethod
    def from_tag_ids(cls, tags: TagIds | EngineTags) -> EngineTags:
        """Adapt ``components.structure.TagIds``; the engine forks schemas shaped like NPR's (a goal of plans
        closed by an anchor tag, steps, a summary), which have no separate block tag."""
        if isinstance(tags, EngineTags):
            return tags
        if tags.schema.block is not None or tags.schema.goal is None:
            raise ValueError(
                f"the engine forks NPR-shaped schemas (guideline/plan/step/takeaway); {tags.schema.name!r} "
                "wraps blocks in a separate tag and is not supported in parallel mode"
            )
        return cls(
            guideline_open=tags.id_for(Role.GOAL_OPEN),
            guideline_close=tags.id_for(Role.GOAL_CLOSE),
            plan_open=tags.id_for(Role.PLAN_OPEN),
            plan_close=tags.id_for(Role.PLAN_CLOSE),
            step_open=tags.id_for(Role.STEP_OPEN),
            step_close=tags.id_for(Role.STEP_CLOSE),
            takeaway_open=tags.id_for(Role.SUMMARY_OPEN),
            takeaway_close=tags.id_for(Role.SUMMARY_CLOSE),
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, schema: str = "npr") -> EngineTags:
        return cls.from_tag_ids(TagIds.from_tokenizer(tokenizer, schema))


def plan_labels(block_text: str, plan_open: str, plan_close: str) -> list[str]:
    """Labels (``"1"``, ``"2.1"``, ...) of the plans of one guideline, in order, read with the structure
    package's label rule; a plan without a label gets ``""`` (which makes the fork illegal)."""
    labels = []
    for chunk in block_text.split(plan_open)[1:]:
        labels.append(parse_label(chunk.split(plan_close, 1)[0]) or "")
    return labels


@dataclass
class ForkPlan:
    """An admitted fork: one seed (``<step>`` + label tokens) per branch."""

    labels: list[str]
    seeds: list[list[int]]


def plan_fork(
    block_ids: list[int],
    tokenizer: Any,
    tags: EngineTags,
    ledger: TokenLedger,
    max_branches: int,
    min_step_tokens: int,
) -> ForkPlan | str:
    """Decide a fork at a ``</guideline>`` of the main stream.

    Args:
        block_ids: main-stream response tokens from the block's ``<guideline>`` through ``</guideline>``
            (empty if the stream has no open ``<guideline>``).

    Returns:
        a ForkPlan, or the reason the fork is refused (decoding then continues sequentially).
    """
    if not block_ids or block_ids[0] != tags.guideline_open:
        return "no <guideline> opens this block"
    inner = block_ids[1:-1]
    for tag in (
        tags.guideline_open,
        tags.step_open,
        tags.step_close,
        tags.takeaway_open,
        tags.takeaway_close,
    ):
        if tag in inner:
            return "illegal tag inside the guideline"
    text = tokenizer.decode(block_ids, skip_special_tokens=False)
    labels = plan_labels(
        text,
        tokenizer.convert_ids_to_tokens(tags.plan_open),
        tokenizer.convert_ids_to_tokens(tags.plan_close),
    )
    if not labels:
        return "no plans"
    if len(labels) > max_branches:
        return f"{len(labels)} plans > max_branches {max_branches}"
    if any(not lab for lab in labels):
        return "a plan has no label"
    if len(set(labels)) != len(labels):
        return "duplicate plan labels"
    seeds = [[tags.step_open, *tokenizer.encode(f"{lab}:", add_special_tokens=False)] for lab in labels]
    refusal = ledger.refuse_fork([len(s) for s in seeds], min_step_tokens)
    if refusal:
        return refusal
    return ForkPlan(labels=labels, seeds=seeds)


@dataclass
class Branch:
    """One branch of an open block, decoded concurrently with its siblings.

    ``logprobs[0]`` (its ``<step>``) is known only when the flat predecessor has been fed: for branch 0
    that is ``</guideline>``, for branch j the ``</step>`` of branch j-1 (``after_close``).
    """

    index: int
    label: str
    forced_queue: list[int]
    cursor: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    position_ids: list[int] = field(default_factory=list)
    forced: list[bool] = field(default_factory=list)
    pending: int | None = None
    done: bool = False
    # log p(<step>) and log p(<takeaway>) after this branch's </step>: the first token of the next branch
    # (or the takeaway) in the flat layout is predicted from here.
    after_close: dict[str, float] = field(default_factory=dict)

    def append(self, token: int, logprob: float, forced: bool) -> None:
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.position_ids.append(self.cursor)
        self.forced.append(forced)
        self.pending = token
        self.cursor += 1


@dataclass
class OpenBlock:
    """The block being decoded in parallel for one sequence."""

    guideline_pos: int
    start: int
    plan: ForkPlan
    branches: list[Branch]

    @property
    def all_done(self) -> bool:
        return all(b.done for b in self.branches)

    def takeaway_position(self) -> int:
        """G + longest + 1 (npr-reference.md §1.8)."""
        return self.guideline_pos + max(len(b.token_ids) for b in self.branches) + 1
