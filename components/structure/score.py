"""Format score in [-2, 0]: 0 for a perfect trace, the sum of the penalties of its violations otherwise.

The rule follows the reference scorer of the NPR paper (``compute_format_score``), restated over our
parser's violations so every schema is scored the same way. Lengths are measured with all whitespace
removed, as the reference does. The sum is clamped to ``MIN_SCORE``.

======================  =======  =========  =========================================================
code                    penalty  counted    when
======================  =======  =========  =========================================================
no_block                -1.5     once       no complete block in the response
tag_outside_block       -1.5     once       a tag before the last block that belongs to no block
no_plans                -1.0     per block  a goal with no plan
step_count_mismatch     -1.0     per block  number of steps != number of plans
too_few_steps           -1.0     per block  fewer steps than ``schema.min_steps`` (schemas without plans)
nested_block            -1.0     each       a block opened inside a step where the schema forbids it
misplaced_tag           -0.4     each       a tag inside a block where the grammar does not allow it
unclosed_block          -1.0     once       a block still open at the end of the response
tag_in_tail             -1.0     once       a tag after the last complete block
missing_answer          -1.0     once       no non-empty ``\\boxed{}`` (or schema answer line) after the last block
goal_text               -0.4     per block  text in the goal that is not inside a plan
plans_not_adjacent      -0.2     per block  text between two plans
steps_not_adjacent      -0.2     per block  text between goal, steps and summary
stray_text              -0.2     per block  text elsewhere in a block outside its elements
plan_too_short          -0.4     each       plan content shorter than ``schema.min_plan_chars`` (3)
step_too_short          -0.4     each       step content shorter than ``schema.min_step_chars`` (6)
summary_too_short       -0.4     per block  summary shorter than ``schema.min_summary_chars`` (6)
label_missing           -0.2     per block  a plan or step without its ``N:`` label (labelled schemas)
label_mismatch          -0.2     per block  step labels differ from the plan labels, in order
======================  =======  =========  =========================================================

Differences from the reference, on purpose: it checks the *last plan* for tags where it means the step
(a bug); it cannot see labels (the engine forks on them, so we score them); it returns -1.5 as soon as
no block matches, where we still check the answer (so a blockless response without ``\boxed{}`` gets
-2.0, one with it -1.5: a gradient towards answering); it stops at the first block regex failure where
we keep scoring the rest. "once" codes are listed for every occurrence in
``Trace.violations`` but penalised once; "per block" codes are emitted at most once per block.
"""

from __future__ import annotations

from collections.abc import Mapping

from components.structure.parse import parse_text
from components.structure.schemas import Schema, get_schema
from components.structure.trace import Trace

MIN_SCORE = -2.0

PENALTIES: Mapping[str, float] = {
    "no_block": -1.5,
    "tag_outside_block": -1.5,
    "no_plans": -1.0,
    "step_count_mismatch": -1.0,
    "too_few_steps": -1.0,
    "nested_block": -1.0,
    "misplaced_tag": -0.4,
    "unclosed_block": -1.0,
    "tag_in_tail": -1.0,
    "missing_answer": -1.0,
    "goal_text": -0.4,
    "plans_not_adjacent": -0.2,
    "steps_not_adjacent": -0.2,
    "stray_text": -0.2,
    "plan_too_short": -0.4,
    "step_too_short": -0.4,
    "summary_too_short": -0.4,
    "label_missing": -0.2,
    "label_mismatch": -0.2,
}

# Codes penalised once per trace however often they occur.
ONCE_PER_TRACE = frozenset(
    {"no_block", "tag_outside_block", "unclosed_block", "tag_in_tail", "missing_answer"}
)


def _as_trace(text_or_trace: str | Trace, schema: str | Schema) -> Trace:
    if isinstance(text_or_trace, Trace):
        if not text_or_trace.has_text:
            raise ValueError(
                "format_score needs a trace with text: build TagIds with a decoder (from_tokenizer)"
            )
        return text_or_trace
    return parse_text(text_or_trace, get_schema(schema))


def score_trace(trace: Trace) -> float:
    """The clamped sum of the penalties of ``trace.violations``."""
    total = 0.0
    seen: set[str] = set()
    for v in trace.violations:
        if v.code in ONCE_PER_TRACE:
            if v.code in seen:
                continue
            seen.add(v.code)
        total += PENALTIES[v.code]
        if total <= MIN_SCORE:
            return MIN_SCORE
    # Round away float noise of summing tenths (so a perfect-but-for-one-rule trace is exactly -0.4).
    return round(total, 6)


def format_score(text_or_trace: str | Trace, schema: str | Schema = "npr") -> float:
    """Format score of a response (text, or a Trace parsed with text) in [-2, 0]; 0 = perfect."""
    return score_trace(_as_trace(text_or_trace, schema))


def is_valid(text_or_trace: str | Trace, schema: str | Schema = "npr") -> bool:
    """True when the response breaks no rule (format score exactly 0)."""
    return not _as_trace(text_or_trace, schema).violations
