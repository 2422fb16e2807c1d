"""Trace metrics: is the trace parallel, how wide, and how much shorter its critical path is.

Every complete block counts as executed in parallel: its steps run concurrently, so of a block's steps
only the longest (its own nested blocks already shortened) lies on the critical path. Lengths are step
spans, tags included (the same lengths the position ids use), so on an id trace in the canonical layout
``critical_tokens == max(position_ids[start:]) - start + 1``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from components.structure.trace import Block, Segment, Span, Trace


@dataclass(frozen=True)
class TraceMetrics:
    """``unit`` is ``tokens`` (id traces, or text with a token-length function) or ``chars``."""

    is_parallel: bool  # >= 1 valid block with >= 2 branches
    is_parallel_any: bool  # >= 1 valid block with >= 1 branch
    n_blocks: int  # complete blocks, nested ones included
    branches: tuple[int, ...]  # steps per complete block, document order
    total_tokens: int
    critical_tokens: int
    ideal_speedup: float  # total / critical
    unit: Literal["tokens", "chars"]


def trace_metrics(trace: Trace, token_lengths: Callable[[str], int] | None = None) -> TraceMetrics:
    """Metrics of a parsed trace.

    Id traces are measured in tokens exactly. Text traces are measured with ``token_lengths(text) -> int``
    applied to each span (pass the tokenizer's length), or in characters when it is None.
    """
    if trace.source == "ids":
        unit: Literal["tokens", "chars"] = "tokens"

        def size(span: Span) -> int:
            return span.end - span.start

    else:
        assert trace.text is not None
        text = trace.text
        unit = "tokens" if token_lengths is not None else "chars"
        measure = token_lengths or len

        def size(span: Span) -> int:
            return int(measure(text[span.start : span.end]))

    def step_critical(step: Segment) -> int:
        return size(step.span) - sum(saving(inner) for inner in step.blocks)

    def saving(block: Block) -> int:
        if not block.steps:
            return 0
        return sum(size(s.span) for s in block.steps) - max(step_critical(s) for s in block.steps)

    blocks = trace.all_blocks()
    total = size(Span(trace.start, trace.length))
    critical = total - sum(saving(b) for b in trace.blocks)
    return TraceMetrics(
        is_parallel=any(b.valid and b.branches >= 2 for b in blocks),
        is_parallel_any=any(b.valid and b.branches >= 1 for b in blocks),
        n_blocks=len(blocks),
        branches=tuple(b.branches for b in blocks),
        total_tokens=total,
        critical_tokens=critical,
        ideal_speedup=(total / critical) if critical > 0 else 1.0,
        unit=unit,
    )
