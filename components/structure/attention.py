"""Parallel attention inputs: the canonical mask and position ids of a flattened parallel trace.

The canonical rule (npr-reference.md §1.8, generalised over schemas and nesting):

- attention is causal, except that sibling step spans of one block (each from its opening through its
  closing step tag, inclusive) cannot see each other in either direction; everything else, including
  tokens between steps, stays causal;
- every step of a block starts at position(anchor) + 1 (anchor: ``</guideline>``), the merge token
  (``<takeaway>``) at position(anchor) + maxlen + 1 with ``maxlen = max(position(</step>) - position(anchor))``,
  and every other token continues from the token before it; nested blocks apply the same rule inside
  their step;
- ids before ``start`` (the prompt) are plain causal with ``arange`` positions and their tags ignored.

The mask derives from an O(L) form, ``ParallelSegments``: per token its position id and, per nesting
depth, the id of the block and the index of the step it lies in (-1 outside steps). Two tokens are
siblings at depth d when they share the block id but not the step index there. A dense mask is built from
it in place (causal fill, then the sibling rectangles cleared), so a caller never holds more than one
bool L x L, and never a float one unless it asks ``to_additive_mask`` for it (eager attention needs it).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from components.structure.parse import parse_ids
from components.structure.scan import as_id_array
from components.structure.tokens import TagIds
from components.structure.trace import Block

_ANCHOR, _STEP_OPEN, _STEP_CLOSE, _MERGE = range(4)


@dataclass(frozen=True)
class ParallelSegments:
    """The O(L) form of a batch of parallel traces (right-padded to one length ``L``).

    position_ids: long[B, L]   parallel positions (pads: 0)
    block_ids:    long[B, D, L] block id at nesting depth d of the step a token lies in, else -1
    step_ids:     long[B, D, L] index of that step within its block, else -1
    lengths:      long[B]       real (unpadded) length of each row
    hidden:       per row, ``(key_start, key_end, first_query)`` spans: keys no query from ``first_query``
                  on may see (the originals a ``reread`` merge replaced by its copy; ``components.structure.merge``)
    """

    position_ids: torch.Tensor
    block_ids: torch.Tensor
    step_ids: torch.Tensor
    lengths: torch.Tensor
    hidden: tuple[tuple[tuple[int, int, int], ...], ...] = ()

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.position_ids.shape[0]), int(self.position_ids.shape[1])

    def dense_mask(self) -> torch.Tensor:
        """bool[B, 1, L, L], True = may attend. Pad queries attend to themselves only (no empty row).

        Causal, then for every block (found as runs of equal (block id, step index) at each depth) the
        rectangles between its later and earlier steps are cleared: work is O(L^2) for the causal fill
        plus the sibling rectangles only, with no L x L temporaries.
        """
        batch, length = self.shape
        mask = torch.zeros(batch, 1, length, length, dtype=torch.bool)
        for b in range(batch):
            n = int(self.lengths[b])
            rows = mask[b, 0, :n, :n]
            rows.fill_(True)
            rows.tril_()
            for d in range(self.block_ids.shape[1]):
                for spans in _step_runs(self.block_ids[b, d, :n], self.step_ids[b, d, :n]):
                    for k, (qs, qe) in enumerate(spans):
                        for ks, ke in spans[:k]:  # later step rows x earlier step columns
                            rows[qs:qe, ks:ke] = False
            for ks, ke, qs in self.hidden[b] if self.hidden else ():
                rows[qs:, ks:ke] = False
            pads = torch.arange(n, length)
            mask[b, 0, pads, pads] = True
        return mask


def _step_runs(block_ids: torch.Tensor, step_ids: torch.Tensor) -> list[list[tuple[int, int]]]:
    """Spans ``[start, end)`` of the steps of each block at one depth, grouped by block, in order.

    block_ids, step_ids: long[L] of one depth. A step is one contiguous run of equal (block, step) values.
    """
    n = int(block_ids.shape[0])
    if n == 0:
        return []
    change = torch.ones(n, dtype=torch.bool)
    change[1:] = (block_ids[1:] != block_ids[:-1]) | (step_ids[1:] != step_ids[:-1])
    starts = torch.nonzero(change).flatten().tolist()
    ends = [*starts[1:], n]
    blocks: dict[int, list[tuple[int, int]]] = {}
    for start, end in zip(starts, ends, strict=True):
        blk = int(block_ids[start])
        if blk >= 0:
            blocks.setdefault(blk, []).append((start, end))
    return list(blocks.values())


def _positions_and_segments(blocks: list[Block], length: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Positions by suffix re-basing (as §1.8 describes it) done with one cumulative sum."""
    events: list[tuple[int, int, int]] = []
    depth = 1 + max((blk.depth for blk in blocks), default=-1)
    block_ids = np.full((depth, length), -1, dtype=np.int64)
    step_ids = np.full((depth, length), -1, dtype=np.int64)
    for b, blk in enumerate(blocks):
        events.append((blk.anchor, _ANCHOR, b))
        events.append((blk.merge, _MERGE, b))
        for k, step in enumerate(blk.steps):
            events.append((step.span.start, _STEP_OPEN, b))
            events.append((step.span.end - 1, _STEP_CLOSE, b))
            block_ids[blk.depth, step.span.start : step.span.end] = b
            step_ids[blk.depth, step.span.start : step.span.end] = k
    events.sort()
    anchor_pos = [0] * len(blocks)
    maxlen = [0] * len(blocks)
    delta = np.zeros(length, dtype=np.int64)
    shift = 0  # position(i) - i for the tokens since the last re-base
    for idx, kind, b in events:
        if kind == _ANCHOR:
            anchor_pos[b] = idx + shift
        elif kind == _STEP_CLOSE:
            maxlen[b] = max(maxlen[b], idx + shift - anchor_pos[b])
        else:
            target = anchor_pos[b] + 1 + (maxlen[b] if kind == _MERGE else 0)
            new_shift = target - idx
            delta[idx] += new_shift - shift
            shift = new_shift
    positions = np.arange(length, dtype=np.int64) + np.cumsum(delta)
    return positions, block_ids, step_ids


def _segments_of(input_ids: Sequence[int] | torch.Tensor, tags: TagIds, start: int) -> tuple[np.ndarray, ...]:
    arr = as_id_array(input_ids)
    trace = parse_ids(arr, tags, start=start, strict=True, check_content=False)
    return _positions_and_segments(trace.all_blocks(), int(arr.size))


def batch_parallel_segments(
    list_of_ids: Sequence[Sequence[int] | torch.Tensor],
    tags: TagIds,
    starts: Sequence[int] | None = None,
    pad_to: int | None = None,
) -> ParallelSegments:
    """The O(L) form of several sequences, right-padded to the longest (or ``pad_to``).

    Raises ``StructureError`` (with ``.reason``/``.position``) for a sequence whose tags are malformed.
    """
    if starts is None:
        starts = [0] * len(list_of_ids)
    if len(starts) != len(list_of_ids):
        raise ValueError(f"{len(starts)} starts for {len(list_of_ids)} sequences")
    parts = [_segments_of(ids, tags, s) for ids, s in zip(list_of_ids, starts, strict=True)]
    lengths = [p[0].shape[0] for p in parts]
    length = max(lengths, default=0)
    if pad_to is not None:
        if pad_to < length:
            raise ValueError(f"pad_to={pad_to} is shorter than the longest sequence ({length})")
        length = pad_to
    depth = max((p[1].shape[0] for p in parts), default=0)
    batch = len(parts)
    positions = torch.zeros(batch, length, dtype=torch.long)
    block_ids = torch.full((batch, depth, length), -1, dtype=torch.long)
    step_ids = torch.full((batch, depth, length), -1, dtype=torch.long)
    for b, (pos, blk, stp) in enumerate(parts):
        n, d = pos.shape[0], blk.shape[0]
        positions[b, :n] = torch.from_numpy(pos)
        block_ids[b, :d, :n] = torch.from_numpy(blk)
        step_ids[b, :d, :n] = torch.from_numpy(stp)
    return ParallelSegments(positions, block_ids, step_ids, torch.tensor(lengths, dtype=torch.long))


def parallel_segments(
    input_ids: Sequence[int] | torch.Tensor, tags: TagIds, start: int = 0
) -> ParallelSegments:
    """The O(L) form of one sequence (a batch of one)."""
    return batch_parallel_segments([input_ids], tags, [start])


def parallel_attention_inputs(
    input_ids: Sequence[int] | torch.Tensor, tags: TagIds, start: int = 0
) -> tuple[torch.Tensor, torch.Tensor]:
    """Mask and positions of one flattened parallel trace.

    Args:
        input_ids: long[L] (list or 1-D tensor), prompt then response.
        tags: the schema's tag token ids.
        start: index of the first response token; earlier ids are plain causal and never parsed.
    Returns:
        mask: bool[L, L], True = query row may attend key column.
        position_ids: long[L].
    Raises:
        StructureError: the response's tags do not form valid blocks (reason and token index attached).
    """
    segs = parallel_segments(input_ids, tags, start)
    return segs.dense_mask()[0, 0], segs.position_ids[0]


def batch_parallel_attention_inputs(
    list_of_ids: Sequence[Sequence[int] | torch.Tensor],
    tags: TagIds,
    starts: Sequence[int] | None = None,
    pad_to: int | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded batch: mask bool[B, 1, L, L] (pad queries see only themselves), position_ids long[B, L]."""
    segs = batch_parallel_segments(list_of_ids, tags, starts, pad_to)
    return segs.dense_mask(), segs.position_ids


def to_additive_mask(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """bool mask -> additive float mask: 0 where allowed, ``finfo(dtype).min`` where not.

    Eager attention adds the mask to the scores, so a bool mask there is silently wrong (True becomes +1);
    ``finfo.min`` rather than ``-inf`` keeps a fully masked row finite instead of NaN.
    """
    if mask.dtype != torch.bool:
        raise TypeError(f"to_additive_mask expects a bool mask, got {mask.dtype}")
    if not dtype.is_floating_point:
        raise TypeError(f"additive masks need a floating dtype, got {dtype}")
    out = torch.zeros(mask.shape, dtype=dtype, device=mask.device)
    return out.masked_fill_(~mask, torch.finfo(dtype).min)


def prediction_sources(mask: torch.Tensor) -> torch.Tensor:
    """For every token, the position whose logits predict it: the last EARLIER position it may attend to.

    In a plain causal sequence that is ``t - 1``. The first token of a sibling step cannot see the steps
    before it, so it is predicted from the last token before the block's first step (``</guideline>`` in
    the canonical layout) — exactly where the engine forks every branch. SFT and RL both score tokens with
    this rule, so training log-probs equal the engine's.

    Args:
        mask: bool ``[B, 1, L, L]``, ``[B, L, L]`` or ``[L, L]``; True = the query row may attend to the key.

    Returns:
        long ``[B, L]`` (or ``[L]`` for a 2D mask); rows with no earlier visible key (position 0, padding)
        get 0. Peak extra memory is one byte per mask element (no ``L x L`` integer temporaries).
    """
    squeeze = mask.dim() == 2
    allowed = mask[None] if squeeze else (mask[:, 0] if mask.dim() == 4 else mask)
    length = allowed.shape[-1]
    strictly_before = torch.ones(length, length, dtype=torch.bool, device=allowed.device).tril(-1)
    visible = (allowed & strictly_before).to(torch.uint8)
    # the last True per row = L - 1 - (first True in the reversed row); rows with none fall back to 0
    last = length - 1 - torch.argmax(torch.flip(visible, dims=[-1]), dim=-1)
    out = torch.where(visible.amax(dim=-1) > 0, last, torch.zeros_like(last))
    return out[0] if squeeze else out
