"""EXPERIMENTAL: what the SGLang ``isolated``-merge plugin installs, computed without sglang.

The trainer (``components.structure.parallel_attention_inputs``) reads a block's steps blind to each other
at shared positions: every step starts at position(anchor) + 1, the merge token at position(anchor) +
maxlen + 1. A stock SGLang server re-prefills a merge ``prefix + b1..bk + <takeaway>`` with sequential
positions and a causal mask. The plugin (``components.engine.backends.sglang_plugin``) gives a request of
an NPR run the trainer's inputs instead; everything it installs is computed here, from plain token ids:

- ``canonical_inputs``: the request's tokens, their open tail closed (``closing_suffix``: the request ends
  inside a step or after ``<takeaway>``), through ``parallel_attention_inputs``, sliced back to the
  request's length. Positions and mask come from ``components.structure`` only.
- extend positions (``CanonicalInputs.extend_positions``): the canonical positions of the tokens a forward
  pass computes; a token past the request's own tokens (decoding) gets ``flat index - offset`` with the
  constant ``offset = (length - 1) - position(length - 1)``.
- mask rows (``CanonicalInputs.mask_rows``): the canonical mask of the extended rows over prefix + extend,
  the layout of the triton backend's ``custom_mask`` (row-major ``extend x (prefix + extend)`` per request,
  ``mask_indptr`` the offsets; ``batch_custom_mask``).
- radix cut (``CanonicalInputs.cut_point``): the longest matched prefix ``p`` such that no token from ``p``
  on is hidden from a token before ``p``; for a merge whose first branch is cached it is the fork point
  (the block's first ``<step>``).
- the radix namespace (``namespace_key``): such requests share KV only with each other (same response
  start), never with a stock request holding the same ids.

The client marks a request with ``request_fields`` (SGLang's ``extra_key`` and ``sampling_params.
custom_params``). This is EXPERIMENTAL until a GPU run shows the server's tokens and log-probs equal the
torch engine's exact ``shared_kv`` merge; nothing here imports sglang.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from components.ops.launch import ISOLATED_MERGE_ENV as ENV_FLAG
from components.structure import Role, StructureError, TagIds, get_schema, parallel_attention_inputs

PARAM = "npr_isolated"  # key in sampling_params.custom_params: {"response_start", "schema", "tags"}
KEY_PREFIX = "npr-isolated"
MALFORMED = "|malformed"  # appended to the namespace of a request whose tags cannot be parsed

# Closers tried in order on a request's tokens until the strict parse accepts them: nothing (closed or no
# response), an open takeaway, an open step, after </guideline> or a closed step, inside the guideline, in
# a plan. Tokens appended after the request never change the inputs of its own tokens (a token's position
# and mask row depend only on the tokens up to it), so the first closer that parses is as good as any.
_CLOSERS: tuple[tuple[Role, ...], ...] = (
    (),
    (Role.SUMMARY_CLOSE,),
    (Role.STEP_CLOSE, Role.SUMMARY_OPEN, Role.SUMMARY_CLOSE),
    (Role.SUMMARY_OPEN, Role.SUMMARY_CLOSE),
    (Role.GOAL_CLOSE, Role.SUMMARY_OPEN, Role.SUMMARY_CLOSE),
    (Role.PLAN_CLOSE, Role.GOAL_CLOSE, Role.SUMMARY_OPEN, Role.SUMMARY_CLOSE),
)


_ROWS = 1024  # mask rows scanned at once for the radix cut table


def enabled(environ: Mapping[str, str] | None = None) -> bool:
    """The plugin acts only when ``NPR_SGLANG_ISOLATED_MERGE=1`` in the server's environment."""
    return (os.environ if environ is None else environ).get(ENV_FLAG) == "1"


def namespace_key(response_start: int, extra_key: str | None = None) -> str:
    """The radix ``extra_key`` of an isolated request: its KV is shared only with requests of this key."""
    base = f"{KEY_PREFIX}:{int(response_start)}"
    if extra_key is None:
        return base
    extra_key = extra_key.removesuffix(MALFORMED)
    if extra_key == base or extra_key.startswith(base + "|"):
        return extra_key
    return f"{base}|{extra_key}"


def request_fields(response_start: int, tags: TagIds) -> dict[str, Any]:
    """What a client adds to a ``/generate`` request for the plugin: ``extra_key`` at the top level and
    ``custom_params`` inside ``sampling_params`` (response start, schema and tag ids)."""
    if response_start < 0:
        raise ValueError(f"response_start must be >= 0, got {response_start}")
    params = {"response_start": int(response_start), "schema": tags.schema.name, "tags": dict(tags.ids)}
    return {"extra_key": namespace_key(response_start), "custom_params": {PARAM: params}}


def parse_request_params(custom_params: Any) -> tuple[int, TagIds] | None:
    """``(response_start, tags)`` of a request marked by ``request_fields``; None for any other request."""
    if not isinstance(custom_params, Mapping):
        return None
    params = custom_params.get(PARAM)
    if not isinstance(params, Mapping):
        return None
    start = params.get("response_start")
    tag_ids = params.get("tags")
    if not isinstance(start, int) or start < 0 or not isinstance(tag_ids, Mapping):
        raise ValueError(f"malformed {PARAM} custom_params: {dict(params)!r}")
    return start, TagIds(get_schema(str(params.get("schema", "npr"))), dict(tag_ids))


def closing_suffix(ids: Sequence[int], tags: TagIds, start: int) -> list[int] | None:
    """The tag ids that close the request's open tail (``[]`` if it is closed); None if no closer parses
    (the response's tags are malformed before its end)."""
    present = set(tags.schema.role_of.values())
    for roles in _CLOSERS:
        if not present.issuperset(roles):
            continue
        suffix = [tags.id_for(r) for r in roles]
        try:
            parallel_attention_inputs(list(ids[start:]) + suffix, tags, 0)
        except StructureError:
            continue
        return suffix
    return None


@dataclass(frozen=True)
class CanonicalInputs:
    """The trainer's positions of one request's tokens and what the plugin derives from its mask.

    length: the request's tokens; positions: long[length]; offset: flat index - position of a token after
    them; masked_rows: bool[length], True for a row with a hidden earlier column (not causal);
    ids/start/tags: to rebuild mask rows on demand (a dense mask is ``length**2`` bytes, never kept).
    """

    ids: tuple[int, ...]
    start: int
    tags: TagIds
    suffix: tuple[int, ...]
    positions: torch.Tensor
    offset: int
    masked_rows: torch.Tensor
    cut_table: torch.Tensor  # bool[length + 1]: True where a matched prefix of that length is usable

    @property
    def length(self) -> int:
        return len(self.ids)

    def position(self, index: int) -> int:
        """Canonical position of flat index ``index`` (past the request's tokens: ``index - offset``)."""
        return int(self.positions[index]) if index < self.length else index - self.offset

    def extend_positions(self, prefix_len: int, extend_len: int) -> torch.Tensor:
        """long[extend_len]: positions of flat indices ``prefix_len .. prefix_len + extend_len - 1``."""
        flat = torch.arange(prefix_len, prefix_len + extend_len, dtype=torch.long)
        inside = flat < self.length
        out = flat - self.offset
        out[inside] = self.positions[flat[inside]]
        return out

    def rows_are_causal(self, prefix_len: int, extend_len: int) -> bool:
        return not bool(self.masked_rows[prefix_len : prefix_len + extend_len].any())

    def mask_rows(self, prefix_len: int, extend_len: int) -> torch.Tensor:
        """bool[extend_len, prefix_len + extend_len]: the canonical mask of the extended rows (True = may
        attend); rows past the request's tokens are causal (a decoded token sees everything before it)."""
        total = prefix_len + extend_len
        out = torch.ones(extend_len, total, dtype=torch.bool).tril_(prefix_len)
        if self.rows_are_causal(prefix_len, extend_len):
            return out
        mask, _ = parallel_attention_inputs(list(self.ids) + list(self.suffix), self.tags, self.start)
        rows = min(total, self.length) - prefix_len
        if rows > 0:
            out[:rows, : prefix_len + rows] = mask[prefix_len : prefix_len + rows, : prefix_len + rows]
        return out

    def cut_point(self, matched: int) -> int:
        """The longest usable cached prefix not longer than ``matched``: every token from it on may see
        every token before it (the triton kernel skips a custom mask over the cached prefix by default)."""
        matched = min(int(matched), self.length)
        usable = torch.nonzero(self.cut_table[: matched + 1]).flatten()
        return int(usable[-1]) if usable.numel() else 0


def canonical_inputs(ids: Sequence[int], tags: TagIds, start: int) -> CanonicalInputs | None:
    """The request's canonical inputs, or None when its response's tags are malformed (no closer parses).

    ``ids``: prompt + response so far (the open tail is closed here); ``start``: first response index.
    """
    ids = tuple(int(i) for i in ids)
    start = min(int(start), len(ids))
    suffix = closing_suffix(ids, tags, start)
    if suffix is None:
        return None
    length = len(ids)
    mask, positions = parallel_attention_inputs(list(ids) + suffix, tags, start)
    mask, positions = mask[:length, :length], positions[:length].clone()
    # a hidden pair (row r, column c < r) makes every matched prefix length p with c < p <= r unusable;
    # per row, the first hidden column (``length`` if none), a block of rows at a time (no L x L temporaries)
    has_hidden = torch.zeros(length, dtype=torch.bool)
    first_hidden_col = torch.full((length,), length, dtype=torch.long)
    cols = torch.arange(length)
    for r0 in range(0, length, _ROWS):
        rows = slice(r0, min(r0 + _ROWS, length))
        hidden = ~mask[rows] & (cols[None, :] < cols[rows, None])
        has_hidden[rows] = hidden.any(dim=1)
        first = hidden.to(torch.uint8).argmax(dim=1)
        first_hidden_col[rows] = torch.where(has_hidden[rows], first, first_hidden_col[rows])
    del mask
    # p is usable iff no row r >= p hides a column c < p: suffix-min over rows of the first hidden column
    suffix_min = torch.flip(torch.cummin(torch.flip(first_hidden_col, [0]), 0).values, [0])
    cut_table = torch.ones(length + 1, dtype=torch.bool)
    cut_table[:length] = suffix_min >= torch.arange(length)
    offset = (length - 1 - int(positions[-1])) if length else 0
    return CanonicalInputs(ids, start, tags, tuple(suffix), positions, offset, has_hidden, cut_table)


def batch_custom_mask(
    rows: Sequence[torch.Tensor], device: torch.device | str | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The triton backend's ``(custom_mask, mask_indptr)`` of a batch: each request's ``extend x
    (prefix + extend)`` bool rows flattened row-major one after another; ``mask_indptr`` int64[bs + 1]."""
    sizes = [int(r.numel()) for r in rows]
    indptr = torch.zeros(len(rows) + 1, dtype=torch.int64)
    if sizes:
        indptr[1:] = torch.cumsum(torch.tensor(sizes, dtype=torch.int64), 0)
    flat = torch.cat([r.reshape(-1) for r in rows]) if rows else torch.zeros(0, dtype=torch.bool)
    if device is None:
        return flat, indptr
    return flat.to(device), indptr.to(device)
