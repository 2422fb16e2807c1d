"""The parse result: a trace tree of blocks, their plans/steps/summary, and the violations found.

Offsets are character offsets for text input and token indices for id input; spans are half-open
``[start, end)`` and an element's ``span`` runs from its opening tag through its closing tag inclusive.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from components.structure.schemas import Schema


class Span(NamedTuple):
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


class Violation(NamedTuple):
    """One rule broken: ``code`` (a key of ``score.PENALTIES``), where, and why in words."""

    code: str
    position: int
    reason: str


@dataclass
class Segment:
    """A plan, step or summary: tags included in ``span``, the text between them in ``content``.

    ``text`` is the content as text (None for id traces parsed without a decoder); ``label`` is the leading
    ``N:`` label without the colon (``"1"``, ``"2.1"``) or None; ``blocks`` are blocks nested in a step.
    """

    span: Span
    content: Span
    text: str | None = None
    label: str | None = None
    blocks: list[Block] = field(default_factory=list)


@dataclass
class Block:
    """One complete parallel block.

    ``anchor`` is the index of the tag every step restarts after, ``merge`` the index of the first tag after
    the steps (see ``schemas``); ``gaps`` are the stretches between the anchor, the steps and the merge tag
    (empty in the canonical engine layout); ``valid`` is True when no violation lies inside the block.
    """

    span: Span
    depth: int
    anchor: int
    merge: int
    goal: Span | None = None
    plans: list[Segment] = field(default_factory=list)
    steps: list[Segment] = field(default_factory=list)
    summary: Segment | None = None
    gaps: list[Span] = field(default_factory=list)
    valid: bool = True

    @property
    def branches(self) -> int:
        return len(self.steps)

    def walk(self) -> list[Block]:
        """This block and every block nested in its steps, in document order."""
        out = [self]
        for step in self.steps:
            for inner in step.blocks:
                out.extend(inner.walk())
        return out


@dataclass
class Trace:
    """A parsed response.

    ``blocks`` are the complete top-level blocks; ``between`` the top-level stretches before the last block
    that hold no block; ``answer`` the region after the last complete block (the whole input when there is
    none) and ``answer_text`` its text; ``start`` is where parsing began (ids before it are the prompt);
    ``text`` is the parsed text itself for text traces; ``violations_dropped`` counts violations beyond the
    stored maximum (``parse.MAX_STORED_VIOLATIONS``; the score is at its floor long before).
    """

    schema: Schema
    source: Literal["text", "ids"]
    start: int
    length: int
    blocks: list[Block]
    between: list[Span]
    answer: Span
    answer_text: str | None
    violations: list[Violation]
    violations_dropped: int = 0
    text: str | None = field(default=None, repr=False)

    @property
    def has_text(self) -> bool:
        return self.answer_text is not None

    def all_blocks(self) -> list[Block]:
        """Every complete block, nested ones included, in document order."""
        out: list[Block] = []
        for block in self.blocks:
            out.extend(block.walk())
        return out
