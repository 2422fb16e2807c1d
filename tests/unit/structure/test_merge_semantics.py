"""Merge semantics as data: ``isolated`` is the canonical parallel layout; ``reread`` lays out loss-free
re-read copies of branches 2..k that only the tokens after them see, at the flat positions of the text.

Pinned by hand on a small trace, then checked against what a stock server computes: a causal forward over
the flat text gives every post-merge token the context that the laid-out mask and positions give it.
"""

from __future__ import annotations

import pytest
import torch

from components.structure import (
    NPR,
    PARALLEL_R1,
    StructureError,
    lay_out,
    lay_out_row,
    merge_attention_inputs,
    parallel_attention_inputs,
    prediction_sources,
)
from tests.unit.structure.conftest import tag_ids_for

NPR_TAGS = tag_ids_for(NPR)


def _ids(tokens: str, tags=NPR_TAGS) -> list[int]:
    """Tags become their ids; any other word a small text id."""
    vocab: dict[str, int] = {}
    return [tags.ids[t] if t in tags.ids else vocab.setdefault(t, len(vocab) + 1) for t in tokens.split()]


# prompt (2) | <guideline> <plan> p </plan> <plan> q </plan> </guideline> | <step> a a </step> |
# <step> b b b </step> | <takeaway> t </takeaway> x
ONE_BLOCK = (
    "U A <guideline> <plan> p </plan> <plan> q </plan> </guideline> <step> a a </step> "
    "<step> b b b </step> <takeaway> t </takeaway> x"
)


def test_isolated_is_the_canonical_parallel_layout() -> None:
    ids = _ids(ONE_BLOCK)
    laid_ids, mask, pos, index = merge_attention_inputs(ids, NPR_TAGS, start=2, merge="isolated")
    ref_mask, ref_pos = parallel_attention_inputs(ids, NPR_TAGS, start=2)
    assert laid_ids.tolist() == ids and index.tolist() == list(range(len(ids)))
    assert torch.equal(mask, ref_mask) and torch.equal(pos, ref_pos)


def test_reread_lays_out_a_copy_of_branches_two_to_k_before_the_merge() -> None:
    ids = _ids(ONE_BLOCK)
    # anchor </guideline> at 9; branch 1 = 10..13, branch 2 = 14..18; merge <takeaway> at 19; 23 tokens
    row = lay_out_row(ids, NPR_TAGS, 2, "reread")
    copy = ids[14:19]
    assert row.ids.tolist() == ids[:19] + copy + ids[19:]
    # originals keep their place; everything from the merge on moves right by the copy's length (5)
    assert row.index.tolist() == list(range(19)) + [24, 25, 26, 27]
    assert row.copied.tolist() == [False] * 19 + [True] * 5 + [False] * 4
    # branch 2 restarts after the anchor (10..14) as under isolated; the copy and all after it are flat
    assert row.positions.tolist() == [*range(14), *range(10, 15), *range(14, 19), 19, 20, 21, 22]
    assert row.hidden == ((14, 19, 19),)


def test_reread_mask_hides_the_originals_from_the_copy_and_everything_after() -> None:
    ids = _ids(ONE_BLOCK)
    _, mask, _, index = merge_attention_inputs(ids, NPR_TAGS, start=2, merge="reread")
    iso, _ = parallel_attention_inputs(ids, NPR_TAGS, start=2)
    n = len(ids)
    # branch tokens see exactly what they see under isolated (the prefix, their own branch, causal)
    for q in range(19):
        assert mask[q, :19].tolist() == iso[q, :19].tolist()
        assert not mask[q, 19:].any()
    # the copy and every later token: prompt, guideline, branch 1, the copy, causal; never branch 2's original
    for q in range(19, n + 5):
        row = mask[q]
        assert row[:14].all() and not row[14:19].any() and row[19 : q + 1].all() and not row[q + 1 :].any()
    # the merge token is predicted from the copy's last token (the re-read </step>), as a server predicts it
    sources = prediction_sources(mask)[index]
    assert sources[19].item() == 23
    assert sources[14].item() == 9  # branch 2's first token from the anchor, where the engine forked it


def test_reread_context_of_post_merge_tokens_is_the_flat_text() -> None:
    """For every post-merge token, the visible laid-out keys are, in order, the flat text before it, and
    their positions are 0..t-1: a causal forward over the flat text at arange positions."""
    ids = _ids(ONE_BLOCK)
    laid, mask, pos, index = merge_attention_inputs(ids, NPR_TAGS, start=2, merge="reread")
    for t in range(19, len(ids)):
        q = int(index[t])
        keys = torch.nonzero(mask[q]).flatten()
        assert laid[keys].tolist() == ids[: t + 1]
        assert pos[keys].tolist() == list(range(t + 1))


def test_two_blocks_each_rereads_and_later_branches_fork_from_the_flat_text() -> None:
    text = (
        "U A <guideline> <plan> p </plan> <plan> q </plan> </guideline> <step> a </step> <step> b b </step> "
        "<takeaway> t </takeaway> <guideline> <plan> r </plan> <plan> s </plan> <plan> u </plan> </guideline> "
        "<step> c </step> <step> d </step> <step> e e </step> <takeaway> z </takeaway>"
    )
    ids = _ids(text)
    laid = lay_out([ids], NPR_TAGS, [2], "reread")
    row = laid.rows[0]
    # block 1 re-reads its branch 2 (13..16); block 2 its branches 2..3 (34..40), laid out 4 tokens later
    assert row.hidden == ((13, 17, 17), (38, 45, 45))
    assert row.ids.shape[0] == len(ids) + 4 + 7
    # block 2's branches start after its anchor at the flat position of that anchor + 1
    anchor2 = 30
    assert ids[anchor2] == NPR_TAGS.ids["</guideline>"]
    for start in (31, 34, 37):
        assert int(row.positions[row.index[start]]) == anchor2 + 1
    # every token after the last merge sits at its flat position
    assert [int(row.positions[row.index[t]]) for t in range(41, len(ids))] == list(range(41, len(ids)))
    mask = laid.segments.dense_mask()[0, 0]
    for t in range(41, len(ids)):
        keys = torch.nonzero(mask[row.index[t]]).flatten()
        assert laid.input_ids[0, keys].tolist() == ids[: t + 1]


def test_one_branch_blocks_and_sequential_text_are_the_same_in_both_semantics() -> None:
    ids = _ids("U A <guideline> <plan> p </plan> </guideline> <step> a a </step> <takeaway> t </takeaway> x")
    a = merge_attention_inputs(ids, NPR_TAGS, 2, "isolated")
    b = merge_attention_inputs(ids, NPR_TAGS, 2, "reread")
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_parallel_r1_paths_reread_too() -> None:
    tags = tag_ids_for(PARALLEL_R1)
    ids = _ids("U A <Parallel> <Path> a a </Path> <Path> b </Path> </Parallel> <Summary> s </Summary> x", tags)
    row = lay_out_row(ids, tags, 2, "reread")
    assert row.ids.tolist() == ids[:10] + ids[7:10] + ids[10:]
    assert row.hidden == ((7, 10, 10),)


def test_batch_pads_rows_and_points_index_padding_at_the_last_token() -> None:
    short = _ids("U A x y")
    long = _ids(ONE_BLOCK)
    laid = lay_out([short, long], NPR_TAGS, [2, 2], "reread", pad_id=0)
    assert laid.input_ids.shape == (2, len(long) + 5)
    assert laid.index[0].tolist() == [0, 1, 2, 3] + [3] * (len(long) - 4)
    assert laid.segments.lengths.tolist() == [4, len(long) + 5]
    assert laid.input_ids[0, 4:].eq(0).all()


def test_bad_input_is_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="unknown merge semantics 'shared'"):
        lay_out_row(_ids(ONE_BLOCK), NPR_TAGS, 2, "shared")  # type: ignore[arg-type]
    with pytest.raises(StructureError):
        lay_out_row(_ids("U A <guideline> <plan> p </plan> </guideline> <step> a <takeaway>"), NPR_TAGS, 2, "reread")
    with pytest.raises(ValueError, match="shorter than the longest laid-out"):
        lay_out([_ids(ONE_BLOCK)], NPR_TAGS, [2], "reread", pad_to=len(_ids(ONE_BLOCK)))
