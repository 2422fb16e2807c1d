"""Property tests: random and mutated tag streams never raise anything but StructureError, scores stay in
[-2, 0], and the mask/positions equal a literal O(L^2) transcription of npr-reference.md §1.8."""

from __future__ import annotations

from collections.abc import Callable

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from components.structure import (
    MULTIVERSE,
    NPR,
    PARALLEL_R1,
    StructureError,
    TagIds,
    format_score,
    is_valid,
    parallel_attention_inputs,
    parse_ids,
    parse_text,
)

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
TEXT_PIECES = ["1: abcdef", "2: ghijkl", " ", "x", "\\boxed{3}", "1:", "\n"]
TEXT_IDS = [1, 2, 3, 4, 5]


def reference_mask_positions(ids: list[int], tags: TagIds, start: int) -> tuple[torch.Tensor, list[int]]:
    """§1.8 as written: a causal matrix, sibling step spans cut at <takeaway>; positions by suffix shifts."""
    t = tags.ids
    n = len(ids)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    pos = list(range(n))
    spans: list[tuple[int, int]] = []
    stack: list[dict[str, int]] = []
    open_step = -1
    for i in range(start, n):
        tok = ids[i]
        if tok == t["<guideline>"]:
            stack.append({"gend": -1, "maxlen": 0})
        elif tok == t["</guideline>"]:
            stack[-1]["gend"] = pos[i]
        elif tok == t["<step>"]:
            open_step = i
            if stack and stack[-1]["gend"] >= 0:
                shift = stack[-1]["gend"] + 1 - pos[i]
                pos[i:] = [p + shift for p in pos[i:]]
        elif tok == t["</step>"]:
            spans.append((open_step, i + 1))
            stack[-1]["maxlen"] = max(stack[-1]["maxlen"], pos[i] - stack[-1]["gend"])
        elif tok == t["<takeaway>"]:
            for a0, a1 in spans:
                for b0, b1 in spans:
                    if (a0, a1) != (b0, b1):
                        mask[a0:a1, b0:b1] = False
            spans = []
            top = stack.pop()
            shift = top["gend"] + top["maxlen"] + 1 - pos[i]
            pos[i:] = [p + shift for p in pos[i:]]
    return mask, pos


def _check_against_reference(ids: list[int], tags: TagIds, start: int) -> bool:
    """True when the ids were accepted (and then match the reference); False when StructureError."""
    try:
        mask, pos = parallel_attention_inputs(ids, tags, start)
    except StructureError as err:
        assert err.reason and start <= err.position < len(ids)
        return False
    ref_mask, ref_pos = reference_mask_positions(ids, tags, start)
    assert pos.tolist() == ref_pos
    assert torch.equal(mask, ref_mask)
    # Causal outside sibling pairs, independently of the reference: every cut lies between two steps of a block.
    assert not (mask & ~torch.ones_like(mask).tril()).any() and mask.diagonal().all()
    sibling = torch.zeros_like(mask)
    for block in parse_ids(ids, tags, start=start).blocks:
        for a in block.steps:
            for b in block.steps:
                if a is not b:
                    sibling[a.span.start : a.span.end, b.span.start : b.span.end] = True
    assert not (~mask & torch.ones_like(mask).tril() & ~sibling).any()
    return True


def _tokens(stream: list[str], tags: TagIds) -> list[int]:
    return [tags.ids[x] if x in tags.ids else TEXT_IDS[len(x) % len(TEXT_IDS)] for x in stream]


tag_or_text = st.sampled_from(list(NPR.tags) + TEXT_PIECES)


@SETTINGS
@given(stream=st.lists(tag_or_text, max_size=40))
def test_random_streams_parse_score_and_mask(stream: list[str], npr_tags: TagIds, tokenize: Callable) -> None:
    text = "".join(stream)
    trace = parse_text(text)
    score = format_score(trace)
    assert -2.0 <= score <= 0.0
    assert is_valid(trace) == (score == 0.0) == (not trace.violations)
    # The id parser (with a decoder) reaches the same verdict as the text parser.
    tags = _with_decoder(npr_tags)
    id_trace = parse_ids(tokenize(text, tags), tags)
    assert [v.code for v in id_trace.violations] == [v.code for v in trace.violations]
    _check_against_reference(_tokens(stream, npr_tags), npr_tags, 0)


def _with_decoder(tags: TagIds) -> TagIds:
    names = {i: t for t, i in tags.ids.items()}
    return TagIds(tags.schema, tags.ids, decode=lambda ids: "".join(names.get(i, chr(i)) for i in ids))


@st.composite
def valid_npr_stream(draw: st.DrawFn) -> list[str]:
    out: list[str] = []
    for _ in range(draw(st.integers(1, 3))):
        n = draw(st.integers(1, 4))
        out.append("<guideline>")
        for k in range(n):
            out += ["<plan>", f"{k + 1}: plan", "</plan>"]
        out.append("</guideline>")
        for k in range(n):
            out += ["<step>", f"{k + 1}: step"] + ["x"] * draw(st.integers(0, 4)) + ["</step>"]
            if draw(st.booleans()):
                out.append("\n")  # a separator outside the spans (non-canonical but well-formed)
        out += ["<takeaway>", "summary text", "</takeaway>"]
        if draw(st.booleans()):
            out.append("between")
    out.append(" \\boxed{7}")
    return out


mutation = st.tuples(
    st.sampled_from(["delete", "insert", "swap", "duplicate"]),
    st.integers(0, 10_000),
    st.integers(0, 10_000),
    st.sampled_from(list(NPR.tags)),
)


@SETTINGS
@given(stream=valid_npr_stream(), mutations=st.lists(mutation, max_size=3))
def test_mutated_valid_traces(stream: list[str], mutations: list, npr_tags: TagIds) -> None:
    assert format_score("".join(stream)) == 0.0
    assert _check_against_reference(_tokens(stream, npr_tags), npr_tags, 0)
    for op, i, j, tag in mutations:
        if not stream:
            break
        i, j = i % len(stream), j % len(stream)
        if op == "delete":
            del stream[i]
        elif op == "insert":
            stream.insert(i, tag)
        elif op == "swap":
            stream[i], stream[j] = stream[j], stream[i]
        else:
            stream.insert(i, stream[i])
    text = "".join(stream)
    assert -2.0 <= format_score(text) <= 0.0
    prompt = _tokens(["x", "<step>", "x"], npr_tags)  # tags in the prompt must be ignored
    _check_against_reference(prompt + _tokens(stream, npr_tags), npr_tags, len(prompt))


def _other_schema_stream(schema):  # noqa: ANN001, ANN202
    return st.lists(st.sampled_from(list(schema.tags) + TEXT_PIECES), max_size=40)


@SETTINGS
@given(data=st.data())
def test_other_schemas_random_streams(data: st.DataObject, make_tags: Callable) -> None:
    schema = data.draw(st.sampled_from([MULTIVERSE, PARALLEL_R1]))
    stream = data.draw(_other_schema_stream(schema))
    trace = parse_text("".join(stream), schema)
    assert -2.0 <= format_score(trace) <= 0.0
    tags = make_tags(schema)
    ids = _tokens(stream, tags)
    try:
        mask, pos = parallel_attention_inputs(ids, tags)
    except StructureError as err:
        assert err.reason and 0 <= err.position < len(ids)
        return
    causal = torch.ones_like(mask).tril()
    assert not (mask & ~causal).any() and mask.diagonal().all() and pos.shape == (len(ids),)
    sibling = torch.zeros_like(mask)
    for block in parse_ids(ids, tags).all_blocks():  # nested blocks included
        for a in block.steps:
            for b in block.steps:
                if a is not b:
                    sibling[a.span.start : a.span.end, b.span.start : b.span.end] = True
    assert torch.equal(~mask & causal, sibling & causal)
