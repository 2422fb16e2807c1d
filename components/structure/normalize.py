"""Rewrite a valid trace to the canonical engine layout, so training positions equal engine positions.

Canonical layout: the anchor (``</guideline>``) is immediately followed by the first step, each step's
closing tag by the next step or the merge tag (``<takeaway>``). A valid trace may only have whitespace
there, which the mask leaves visible to later steps and which shifts positions, so it is removed.
Invalid traces are returned unchanged with the reason, never half-rewritten.
"""

from __future__ import annotations

import logging
from typing import NamedTuple

from components.structure.parse import parse_text
from components.structure.schemas import Schema, get_schema

log = logging.getLogger(__name__)


class LayoutResult(NamedTuple):
    text: str
    normalized: bool  # False: the input was invalid and is returned as it was
    reason: str | None  # why it was left unchanged
    removed_chars: int


def normalize_layout_result(text: str, schema: str | Schema = "npr") -> LayoutResult:
    """``normalize_layout`` that also says whether it rewrote the text and, if not, why."""
    trace = parse_text(text, get_schema(schema))
    if trace.violations:
        first = trace.violations[0]
        reason = f"invalid trace left unchanged: {first.code} at {first.position}: {first.reason}"
        return LayoutResult(text, False, reason, 0)
    gaps = sorted(gap for block in trace.all_blocks() for gap in block.gaps)
    pieces: list[str] = []
    pos = 0
    for gap in gaps:
        pieces.append(text[pos : gap.start])
        pos = gap.end
    pieces.append(text[pos:])
    out = "".join(pieces)
    return LayoutResult(out, True, None, len(text) - len(out))


def normalize_layout(text: str, schema: str | Schema = "npr") -> str:
    """The canonical-layout text of a valid trace; an invalid trace comes back unchanged (logged)."""
    result = normalize_layout_result(text, schema)
    if not result.normalized:
        log.info("normalize_layout: %s", result.reason)
    return result.text
