"""The one scanner: text or token ids -> a stream of events ``(role, start, end)``.

``role`` is a ``schemas.Role`` value for a tag, or ``TEXT`` (-1) for a run between tags. Both scanners are
linear in the input: text uses one compiled alternation of fixed tag literals (no quantifier, so each
offset costs at most the summed tag lengths and nothing can backtrack catastrophically); ids use one
vectorised membership test and then visit only the tag positions. Events come back as a list (building
it in one tight loop is cheaper than a generator's per-event resume).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

import numpy as np

from components.structure.schemas import Role, Schema

TEXT = -1
Event = tuple[int, int, int]


@lru_cache(maxsize=16)
def _tag_pattern(tags: tuple[str, ...]) -> re.Pattern[str]:
    # One capturing group around the alternation so that split() keeps the tags; longest first so that no
    # tag can shadow a longer one sharing its start.
    ordered = sorted(tags, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(t) for t in ordered) + ")")


def scan_text(text: str, schema: Schema, start: int = 0) -> list[Event]:
    """Events of ``text[start:]``: tags of ``schema`` (exact, case-sensitive) and the text runs between.

    ``split`` does the matching in C and returns text and tags alternately, so the Python loop only
    turns lengths into offsets.
    """
    role_of = {tag: int(role) for tag, role in schema.role_of.items()}
    parts = _tag_pattern(schema.tags).split(text[start:] if start else text)
    events: list[Event] = []
    append = events.append
    pos = start
    is_tag = False
    for part in parts:
        end = pos + len(part)
        if is_tag:
            append((role_of[part], pos, end))
        elif end > pos:
            append((TEXT, pos, end))
        pos = end
        is_tag = not is_tag
    return events


def as_id_array(ids: Any) -> np.ndarray:
    """A 1-D int64 numpy view of a list / tuple / numpy array / torch tensor of token ids."""
    if hasattr(ids, "detach"):  # torch tensor: avoid importing torch here
        ids = ids.detach().cpu().numpy()
    arr = np.asarray(ids)
    if arr.ndim != 1:
        raise ValueError(f"token ids must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"token ids must be integers, got dtype {arr.dtype}")
    return arr.astype(np.int64, copy=False)


def scan_ids(ids: np.ndarray | Sequence[int], role_of_id: Mapping[int, Role], start: int = 0) -> list[Event]:
    """Events of ``ids[start:]``: tag tokens (by ``role_of_id``) and the runs of other tokens between."""
    arr = as_id_array(ids)
    if not 0 <= start <= arr.size:
        raise ValueError(f"start={start} outside the sequence of length {arr.size}")
    keys = np.fromiter(role_of_id.keys(), dtype=np.int64, count=len(role_of_id))
    hits = (np.flatnonzero(np.isin(arr[start:], keys)) + start).tolist()
    roles = [int(role_of_id[i]) for i in arr[hits].tolist()]
    events: list[Event] = []
    append = events.append
    pos = start
    for i, role in zip(hits, roles, strict=True):
        if i > pos:
            append((TEXT, pos, i))
        append((role, i, i + 1))
        pos = i + 1
    if pos < arr.size:
        append((TEXT, pos, int(arr.size)))
    return events
