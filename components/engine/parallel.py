"""Fork admission: when a block may branch, how each branch starts (its seed tokens), canonical positions.

The rule comes from the schema (``components.structure.ForkRule``): the main stream emitting the rule's
trigger (NPR: ``</guideline>``) asks for a fork. A fork is admitted only if the block is a legal place to
branch (for plan-labelled schemas: a goal tag opened it in the main stream, only plan tags lie inside it,
it has between 1 and ``max_branches`` uniquely labelled plans) and the ledger can pay a minimal step per
branch plus the merge. Otherwise it is refused with a recorded reason and the main stream simply goes on.

Each admitted branch is seeded with ``branch_open`` + ``"<label>:"`` (NPR: ``<step>1:``), which the engine
forces. Canonical positions (docs/architecture.md; npr-reference.md §1.8): with G the position of the
trigger every branch starts at G + 1; the first token after the branches sits at G + longest + 1, where
longest is the token count of the longest branch (``<step>`` through ``</step>``).

This module and ``ledger`` are pure decisions (no model, no I/O): ``components.engine.controller`` calls
them for every backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from components.engine.ledger import TokenLedger
from components.structure import Role, TagIds, get_schema, parse_label


@dataclass(frozen=True)
class ForkTags:
    """The single-token ids a schema's fork rule acts on, looked up once from the tokenizer's ``TagIds``.

    ``goal_open`` / ``plan_open`` / ``plan_close`` are set for plan-labelled schemas (one branch per plan);
    ``fixed_branches`` for schemas whose blocks have a fixed number of unlabelled branches.
    ``illegal_in_goal``: tags that may not appear between the goal's opening tag and the trigger.
    """

    schema_name: str
    trigger: int
    branch_open: int
    branch_close: int
    merge: tuple[int, ...]
    goal_open: int | None = None
    plan_open: str | None = None
    plan_close: str | None = None
    fixed_branches: int | None = None
    illegal_in_goal: frozenset[int] = frozenset()

    @classmethod
    def from_tag_ids(cls, tags: TagIds | ForkTags) -> ForkTags:
        """The fork tags of ``tags.schema``; ValueError if the schema has no fork rule (sequential only)."""
        if isinstance(tags, ForkTags):
            return tags
        schema = tags.schema
        rule = schema.fork
        if rule is None:
            raise ValueError(
                f"schema {schema.name!r} has no fork rule (components.structure.schemas.ForkRule), so it "
                "cannot be decoded in parallel mode; decode it sequentially"
            )
        labelled = rule.branches is None
        goal_open = tags.id_for(Role.GOAL_OPEN) if labelled else None
        plan_roles = {Role.PLAN_OPEN, Role.PLAN_CLOSE}
        trigger = tags.id_for(rule.trigger)
        illegal = frozenset(int(i) for i, role in tags.role_of_id.items() if role not in plan_roles)
        return cls(
            schema_name=schema.name,
            trigger=trigger,
            branch_open=tags.id_for(rule.branch_open),
            branch_close=tags.id_for(rule.branch_close),
            merge=tuple(tags.id_for(r) for r in rule.merge),
            goal_open=goal_open,
            plan_open=schema.tag(Role.PLAN_OPEN) if labelled else None,
            plan_close=schema.tag(Role.PLAN_CLOSE) if labelled else None,
            fixed_branches=rule.branches,
            illegal_in_goal=illegal - {trigger},
        )

    @classmethod
    def from_tokenizer(cls, tokenizer: Any, schema: str = "npr") -> ForkTags:
        return cls.from_tag_ids(TagIds.from_tokenizer(tokenizer, get_schema(schema)))

    @property
    def merge_cost(self) -> int:
        """Tokens a merge needs: its forced tags, or one sampled token when the main stream writes it."""
        return max(1, len(self.merge))


# The NPR-named engine tags of earlier versions are the fork tags of the schema.
EngineTags = ForkTags


def plan_labels(block_text: str, plan_open: str, plan_close: str) -> list[str]:
    """Labels (``"1"``, ``"2.1"``, ...) of the plans of one guideline, in order, read with the structure
    package's label rule; a plan without a label gets ``""`` (which makes the fork illegal)."""
    labels = []
    for chunk in block_text.split(plan_open)[1:]:
        labels.append(parse_label(chunk.split(plan_close, 1)[0]) or "")
    return labels


@dataclass
class ForkPlan:
    """An admitted fork: one seed (``branch_open`` + label tokens) per branch."""

    labels: list[str]
    seeds: list[list[int]]


def plan_fork(
    block_ids: list[int],
    tokenizer: Any,
    tags: ForkTags | TagIds,
    ledger: TokenLedger,
    max_branches: int,
    min_step_tokens: int,
) -> ForkPlan | str:
    """Decide a fork at a trigger tag of the main stream.

    Args:
        block_ids: main-stream response tokens from the block's goal tag through the trigger (plan-labelled
            schemas; empty if the stream has no open goal), or just the trigger (fixed-branch schemas).
        tokenizer: decodes the block (plan labels) and encodes each branch's ``"<label>:"``.

    Returns:
        a ForkPlan, or the reason the fork is refused (decoding then continues sequentially).
    """
    tags = ForkTags.from_tag_ids(tags)
    if tags.fixed_branches is not None:
        if tags.fixed_branches > max_branches:
            return f"{tags.fixed_branches} branches > max_branches {max_branches}"
        labels = [""] * tags.fixed_branches
        seeds = [[tags.branch_open] for _ in labels]
    else:
        if not block_ids or block_ids[0] != tags.goal_open:
            return "no <guideline> opens this block"
        inner = block_ids[1:-1]
        if any(t in tags.illegal_in_goal for t in inner):
            return "illegal tag inside the guideline"
        assert tags.plan_open is not None and tags.plan_close is not None
        text = tokenizer.decode(block_ids, skip_special_tokens=False)
        labels = plan_labels(text, tags.plan_open, tags.plan_close)
        if not labels:
            return "no plans"
        if len(labels) > max_branches:
            return f"{len(labels)} plans > max_branches {max_branches}"
        if any(not lab for lab in labels):
            return "a plan has no label"
        if len(set(labels)) != len(labels):
            return "duplicate plan labels"
        seeds = [[tags.branch_open, *tokenizer.encode(f"{lab}:", add_special_tokens=False)] for lab in labels]
    refusal = ledger.refuse_fork([len(s) for s in seeds], min_step_tokens, tags.merge_cost)
    if refusal:
        return refusal
    return ForkPlan(labels=labels, seeds=seeds)
