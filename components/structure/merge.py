"""Merge semantics: what the tokens after a parallel block see of its branches, as one piece of data.

Two semantics, read by the trainer (SFT and RL) and by every engine backend:

- ``isolated`` (NPR, Multiverse): post-merge tokens see each branch as it was generated, blind to its
  siblings, at the shared positions of ``components.structure.attention`` (every step from
  position(anchor) + 1, the merge token at position(anchor) + maxlen + 1). A stock server cannot serve it:
  the torch engine's ``shared_kv`` merge does, and the SGLang plugin (experimental) is built for it.
- ``reread`` (ThreadWeaver's route; what a stock SGLang or vLLM server does): the merge reads the branches
  again, in order, as one sequential text. Branch tokens keep what they were sampled with (each branch
  sees the prefix only, positions restarting after the anchor); the merge token and everything after it
  see the prefix, the first branch and a *re-read* of branches 2..k, at flat (sequential) positions.

For teacher forcing, ``reread`` is laid out in one sequence: after the last branch of every merged block of
two or more branches comes a loss-free copy of branches 2..k (from the second branch's opening tag through
the last branch's closing tag). The copy and every later token cannot see the originals of branches 2..k,
and the copy sits at the flat positions the originals would have in a sequential text: so every token a
stock server samples has the same context and positions in the trainer's forward. A block of one branch
re-reads exactly (nothing to copy), and tokens before the first such merge are the same in both semantics.

``lay_out`` returns the laid-out ids, where each original token sits in them, and the O(L) segments
(``ParallelSegments`` with ``hidden`` spans) the dense mask is built from.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import torch

from components.structure.attention import ParallelSegments, _positions_and_segments
from components.structure.parse import parse_ids
from components.structure.scan import as_id_array
from components.structure.tokens import TagIds
from components.structure.trace import Block

MergeSemantics = Literal["isolated", "reread"]
MERGE_SEMANTICS: tuple[str, ...] = get_args(MergeSemantics)


def check_semantics(merge: str) -> MergeSemantics:
    """``merge`` if it names a semantics, else ``ValueError`` naming the choices."""
    if merge not in MERGE_SEMANTICS:
        raise ValueError(f"unknown merge semantics {merge!r}: choose one of {', '.join(MERGE_SEMANTICS)}")
    return merge  # type: ignore[return-value]


@dataclass(frozen=True)
class RowLayout:
    """One trace laid out under a merge semantics (numpy, O(L)).

    ids:       long[L']     the laid-out ids (``reread``: originals plus the re-read copies)
    index:     long[L]      laid-out index of each original token (``isolated``: ``arange(L)``)
    positions: long[L']     position ids
    block_ids: long[D, L']  as ``ParallelSegments`` (copies lie in no step: -1)
    step_ids:  long[D, L']
    hidden:    ((key_start, key_end, first_query), ...): laid-out keys no query from ``first_query`` on sees
    """

    ids: np.ndarray
    index: np.ndarray
    positions: np.ndarray
    block_ids: np.ndarray
    step_ids: np.ndarray
    hidden: tuple[tuple[int, int, int], ...]

    @property
    def copied(self) -> np.ndarray:
        """bool[L']: True on re-read copies (no loss, not a response token of their own)."""
        out = np.ones(self.ids.shape[0], dtype=bool)
        out[self.index] = False
        return out


def reread_regions(blocks: Sequence[Block]) -> list[tuple[int, int]]:
    """``[start, end)`` of what a merge re-reads past its first branch, per merged block of >= 2 branches.

    Raises ``ValueError`` for a nested block of two or more branches: a re-read inside a branch is not
    defined here (the engines fork at depth 1 only).
    """
    regions = []
    for blk in blocks:
        if blk.branches < 2:
            continue
        if blk.depth > 0:
            raise ValueError(
                f"reread merge semantics covers unnested blocks only; a nested block of {blk.branches} "
                f"branches starts at token {blk.span.start}"
            )
        regions.append((blk.steps[1].span.start, blk.steps[-1].span.end))
    return sorted(regions)


def lay_out_row(
    input_ids: Sequence[int] | torch.Tensor | np.ndarray, tags: TagIds, start: int, merge: MergeSemantics
) -> RowLayout:
    """Lay one ``prompt + response`` out for teacher forcing under ``merge``.

    Raises ``StructureError`` for malformed tags (as the mask builder does) and ``ValueError`` for an
    unknown semantics or (``reread``) a nested multi-branch block.
    """
    merge = check_semantics(merge)
    arr = as_id_array(input_ids)
    length = int(arr.size)
    trace = parse_ids(arr, tags, start=start, strict=True, check_content=False)
    blocks = trace.all_blocks()
    positions, block_ids, step_ids = _positions_and_segments(blocks, length)
    if merge == "isolated":
        return RowLayout(arr.astype(np.int64), np.arange(length), positions, block_ids, step_ids, ())
    regions = reread_regions(blocks)
    anchor_of = {blk.steps[1].span.start: blk.anchor for blk in blocks if blk.branches >= 2}
    # a sequential text's positions everywhere except inside the originals of branches 2..k, which keep
    # their isolated offsets from the anchor (each branch restarts after it)
    flat = np.arange(length, dtype=np.int64)
    for r0, r1 in regions:
        anchor = anchor_of[r0]
        flat[r0:r1] = positions[r0:r1] - positions[anchor] + anchor
    pieces_ids, pieces_pos, pieces_blk, pieces_stp, index_parts = [], [], [], [], []
    hidden: list[tuple[int, int, int]] = []
    cursor, shift = 0, 0
    depth = block_ids.shape[0]
    for r0, r1 in regions:
        # originals up to the region's end, then the copy
        pieces_ids += [arr[cursor:r1], arr[r0:r1]]
        pieces_pos += [flat[cursor:r1], np.arange(r0, r1, dtype=np.int64)]
        pieces_blk += [block_ids[:, cursor:r1], np.full((depth, r1 - r0), -1, dtype=np.int64)]
        pieces_stp += [step_ids[:, cursor:r1], np.full((depth, r1 - r0), -1, dtype=np.int64)]
        index_parts.append(np.arange(cursor, r1) + shift)
        hidden.append((r0 + shift, r1 + shift, r1 + shift))
        shift += r1 - r0
        cursor = r1
    pieces_ids.append(arr[cursor:])
    pieces_pos.append(flat[cursor:])
    pieces_blk.append(block_ids[:, cursor:])
    pieces_stp.append(step_ids[:, cursor:])
    index_parts.append(np.arange(cursor, length) + shift)
    return RowLayout(
        np.concatenate(pieces_ids).astype(np.int64),
        np.concatenate(index_parts),
        np.concatenate(pieces_pos),
        np.concatenate(pieces_blk, axis=1),
        np.concatenate(pieces_stp, axis=1),
        tuple(hidden),
    )


@dataclass(frozen=True)
class MergeLayout:
    """A batch laid out under a merge semantics, right-padded to one laid-out length ``L'``.

    input_ids: long[B, L']  laid-out ids (pads: ``pad_id``)
    index:     long[B, L]   laid-out index of each original token (pads of shorter rows: their last token)
    segments:  the O(L') form; ``segments.dense_mask()`` is the bool[B, 1, L', L'] attention mask
    rows:      the per-row layouts
    """

    input_ids: torch.Tensor
    index: torch.Tensor
    segments: ParallelSegments
    rows: tuple[RowLayout, ...]

    @property
    def position_ids(self) -> torch.Tensor:
        return self.segments.position_ids


def lay_out(
    list_of_ids: Sequence[Sequence[int] | torch.Tensor],
    tags: TagIds,
    starts: Sequence[int] | None = None,
    merge: MergeSemantics = "isolated",
    pad_to: int | None = None,
    pad_id: int = 0,
    min_length: int = 0,
) -> MergeLayout:
    """Lay several ``prompt + response`` sequences out under ``merge`` (``lay_out_row``) and pad them.

    ``pad_to`` is a laid-out length (``ValueError`` when a row is longer); ``min_length`` pads at least to
    that length (a caller whose own padded width the laid-out rows must not shrink).
    """
    if starts is None:
        starts = [0] * len(list_of_ids)
    if len(starts) != len(list_of_ids):
        raise ValueError(f"{len(starts)} starts for {len(list_of_ids)} sequences")
    rows = tuple(lay_out_row(ids, tags, s, merge) for ids, s in zip(list_of_ids, starts, strict=True))
    length = max((r.ids.shape[0] for r in rows), default=0)
    if pad_to is not None:
        if pad_to < length:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest laid-out sequence ({length})")
        length = pad_to
    length = max(length, min_length)
    orig = max((r.index.shape[0] for r in rows), default=0)
    depth = max((r.block_ids.shape[0] for r in rows), default=0)
    batch = len(rows)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    index = torch.zeros(batch, orig, dtype=torch.long)
    positions = torch.zeros(batch, length, dtype=torch.long)
    block_ids = torch.full((batch, depth, length), -1, dtype=torch.long)
    step_ids = torch.full((batch, depth, length), -1, dtype=torch.long)
    for b, row in enumerate(rows):
        n, d, m = row.ids.shape[0], row.block_ids.shape[0], row.index.shape[0]
        input_ids[b, :n] = torch.from_numpy(row.ids)
        index[b, :m] = torch.from_numpy(row.index)
        index[b, m:] = int(row.index[-1]) if m else 0
        positions[b, :n] = torch.from_numpy(row.positions)
        block_ids[b, :d, :n] = torch.from_numpy(row.block_ids)
        step_ids[b, :d, :n] = torch.from_numpy(row.step_ids)
    lengths = torch.tensor([r.ids.shape[0] for r in rows], dtype=torch.long)
    segments = ParallelSegments(positions, block_ids, step_ids, lengths, tuple(r.hidden for r in rows))
    return MergeLayout(input_ids, index, segments, rows)


def merge_attention_inputs(
    input_ids: Sequence[int] | torch.Tensor, tags: TagIds, start: int = 0, merge: MergeSemantics = "isolated"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher-forcing inputs of one trace under ``merge``.

    Returns ``(ids long[L'], mask bool[L', L'], position_ids long[L'], index long[L])``: original token ``i``
    sits at ``ids[index[i]]``; under ``isolated`` ``L' = L`` and the mask and positions are
    ``parallel_attention_inputs``'.
    """
    laid = lay_out([input_ids], tags, [start], merge)
    return laid.input_ids[0], laid.segments.dense_mask()[0, 0], laid.position_ids[0], laid.index[0]


def post_merge_mask(input_ids: Sequence[int] | np.ndarray | torch.Tensor, tags: TagIds, start: int) -> np.ndarray:
    """bool ``[L - start]``: True for response tokens from the first merge of a multi-branch block on.

    The one post-merge rule: the tokens a ``reprefill`` backend sampled from re-read branches (exact in
    ``shared_kv`` mode), which a trainer corrects with a truncated importance weight
    (``components.training.papo.post_merge_is_weights``).

    Args:
        input_ids: ``prompt + response`` ids of one sample (list, numpy array or 1-D tensor).
        tags: the schema's ``components.structure.TagIds``.
        start: the response's first index (the prompt length).

    The merge tag itself (``<takeaway>``) is included: it is predicted from the merged context. A block with
    one step merges exactly (its step sees what a sequential decoder sees, at the same positions), so only
    blocks with two or more steps count. Raises ``StructureError`` for a malformed response, as the mask
    builder does (filter first).
    """
    ids = np.asarray(input_ids.tolist() if hasattr(input_ids, "tolist") else input_ids, dtype=np.int64)
    trace = parse_ids(ids, tags, start=start, strict=True, check_content=False)
    out = np.zeros(int(ids.size) - start, dtype=bool)
    merges = [blk.merge for blk in trace.all_blocks() if blk.branches >= 2]
    if merges:
        out[min(merges) - start :] = True
    return out
