"""The one definition of the parallel-reasoning structure: schemas, parser, format score, attention mask
and positions, layout normaliser and trace metrics. Everything else (SFT collator, rewards, filters,
engine, evaluation) imports it from here (one name: the ``components.parallel`` alias is gone, issue 29).
"""

from components.structure.attention import (
    ParallelSegments,
    batch_parallel_attention_inputs,
    batch_parallel_segments,
    parallel_attention_inputs,
    parallel_segments,
    prediction_sources,
    to_additive_mask,
)
from components.structure.errors import StructureError, TagTokenError
from components.structure.merge import (
    MERGE_SEMANTICS,
    MergeLayout,
    MergeSemantics,
    RowLayout,
    check_semantics,
    lay_out,
    lay_out_row,
    merge_attention_inputs,
    post_merge_mask,
)
from components.structure.metrics import TraceMetrics, trace_metrics
from components.structure.normalize import LayoutResult, normalize_layout, normalize_layout_result
from components.structure.parse import STRUCTURAL_CODES, boxed_content, parse_ids, parse_label, parse_text
from components.structure.schemas import (
    MULTIVERSE,
    NPR,
    PARALLEL_R1,
    SCHEMAS,
    ForkRule,
    Role,
    Schema,
    TagPair,
    get_schema,
)
from components.structure.score import MIN_SCORE, PENALTIES, format_score, is_valid, score_trace
from components.structure.tokens import TagIds
from components.structure.trace import Block, Segment, Span, Trace, Violation

__all__ = [
    "MERGE_SEMANTICS",
    "MergeLayout",
    "MergeSemantics",
    "RowLayout",
    "check_semantics",
    "lay_out",
    "lay_out_row",
    "merge_attention_inputs",
    "post_merge_mask",
    "MIN_SCORE",
    "MULTIVERSE",
    "NPR",
    "PARALLEL_R1",
    "PENALTIES",
    "SCHEMAS",
    "STRUCTURAL_CODES",
    "Block",
    "ForkRule",
    "LayoutResult",
    "ParallelSegments",
    "Role",
    "Schema",
    "Segment",
    "Span",
    "StructureError",
    "TagIds",
    "TagPair",
    "TagTokenError",
    "Trace",
    "TraceMetrics",
    "Violation",
    "batch_parallel_attention_inputs",
    "batch_parallel_segments",
    "boxed_content",
    "format_score",
    "get_schema",
    "is_valid",
    "normalize_layout",
    "normalize_layout_result",
    "parallel_attention_inputs",
    "prediction_sources",
    "parallel_segments",
    "parse_ids",
    "parse_label",
    "parse_text",
    "score_trace",
    "to_additive_mask",
    "trace_metrics",
]
