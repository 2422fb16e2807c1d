"""The problem record: content ids, whitespace normalisation, and reading the `sample_orz` output.

A problem record is ``{id, problem, answer, source, difficulty, split}`` (docs/architecture.md, Records).
``id`` is a content hash, so the same problem with the same answer has the same id in every run and
from every source.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any, Literal

from components.artifacts import read_json, read_shards

Split = Literal["train", "val", "test"]
SPLITS: tuple[str, ...] = ("train", "val", "test")
# Length of the hex prefix of sha256 used as id: 16 hex chars = 64 bits, collision-free at 10^6 rows.
ID_HEX_CHARS = 16
_WS = re.compile(r"\s+")


def normalise_whitespace(text: str) -> str:
    """Collapse every run of whitespace to one space and strip both ends."""
    return _WS.sub(" ", text).strip()


def content_id(problem: str, answer: str) -> str:
    """Stable id of a (problem, answer) pair: sha256 prefix of the whitespace-normalised texts.

    Lone surrogates (from undecodable input bytes) are kept distinct via ``surrogatepass`` so that hashing
    never fails on the bad rows the quality check is about to quarantine.
    """
    payload = normalise_whitespace(problem) + "\x1f" + normalise_whitespace(answer)
    return hashlib.sha256(payload.encode("utf-8", "surrogatepass")).hexdigest()[:ID_HEX_CHARS]


def load_problems(problems_dir: Path | str, split: Split) -> list[dict[str, Any]]:
    """All records of one split (``train``, ``val``, ``test``) of a `sample_orz` problems directory, in shard
    order (``[]`` for a split the manifest counts as empty or, for ``val``, does not list).

    Raises FileNotFoundError when the directory or the split's shards are missing, and ValueError when
    the manifest's count for the split disagrees with what the shards hold (a partial copy).
    """
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
    problems_dir = Path(problems_dir)
    if not problems_dir.is_dir():
        raise FileNotFoundError(f"problems directory {problems_dir} does not exist (run stage sample_orz)")
    manifest_path = problems_dir / "manifest.json"
    counts = read_json(manifest_path)["counts"] if manifest_path.exists() else None
    expected = counts.get(split) if counts is not None else None
    # A manifest without a val count predates the validation split: it has none.
    if expected == 0 or (split == "val" and counts is not None and expected is None):
        return []
    records = read_shards(problems_dir, stem=split)
    if expected is not None and len(records) != expected:
        raise ValueError(
            f"{problems_dir}: manifest says {expected} {split} problems but the shards hold {len(records)}"
        )
    return records


def load_tuning_split(problems_dir: Path | str) -> tuple[str, list[dict[str, Any]]]:
    """``(split name, records)`` of the split that in-stage measurements (RL held-out evals, the seed's
    numbers) read: the validation split when `sample_orz` wrote one, else the test split. Tuning decisions
    are made on these numbers, so on a profile with ``val_n > 0`` the test split is read only by `evaluate`."""
    # a profile with val_n: 0 (qwen3-4b) or a problems dir written before the split existed has no val shards
    if any(Path(problems_dir).glob("val-*.jsonl")):
        val = load_problems(problems_dir, "val")
        if val:
            return "val", val
    return "test", load_problems(problems_dir, "test")
