"""Seeded train/test sampling of problem rows and the sharded output with its manifest.

The order of the input does not matter: rows are sorted by content id before the seeded shuffle, so the
same set of problems and the same seed always give the same ids. The held-out ``test`` split is drawn first
from the shuffle and ``train`` from what follows, so the test set does not move when ``n`` changes.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from pathlib import Path
from typing import Any

from components.artifacts import write_json, write_shards


def sample_splits(
    rows: list[dict[str, Any]], n: int, test_n: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, test)``: ``test_n`` held-out rows, then ``n`` training rows, each tagged with ``split``.

    Raises ValueError when fewer than ``n + test_n`` rows are available (lower ``sample_orz.n``).
    """
    if n + test_n > len(rows):
        raise ValueError(
            f"asked for n={n} train + test_n={test_n} test problems but only {len(rows)} passed the quality "
            "gate; lower sample_orz.n / sample_orz.test_n or provide more data"
        )
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("rows must have unique ids before sampling (run the quality gate first)")
    shuffled = sorted(rows, key=lambda r: r["id"])
    random.Random(seed).shuffle(shuffled)
    test = [{**r, "split": "test"} for r in shuffled[:test_n]]
    train = [{**r, "split": "train"} for r in shuffled[test_n : test_n + n]]
    return train, test


def rows_sha256(rows: list[dict[str, Any]]) -> str:
    """Content hash of the rows as read (id, problem, answer, in input order): the manifest's input hash."""
    h = hashlib.sha256()
    for r in rows:
        line = json.dumps([r.get("id"), r.get("problem"), r.get("answer")], ensure_ascii=True)
        h.update(line.encode("ascii") + b"\n")
    return h.hexdigest()


def difficulty_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Rows per difficulty label (``none`` for sources without one, e.g. ORZ)."""
    return dict(sorted(Counter(str(r.get("difficulty") or "none") for r in rows).items()))


def write_problem_splits(
    out_dir: Path,
    train: list[dict[str, Any]],
    test: list[dict[str, Any]],
    n_shards: int,
    manifest: dict[str, Any],
) -> dict[str, Any]:
    """train-NNNNN.jsonl, test-NNNNN.jsonl (one shard) and manifest.json into ``out_dir``; returns the manifest."""
    out_dir = Path(out_dir)
    shards = {
        "train": [p.name for p in write_shards(out_dir, train, n_shards, stem="train")],
        "test": [p.name for p in write_shards(out_dir, test, 1, stem="test")] if test else [],
    }
    full = {
        **manifest,
        "counts": {"train": len(train), "test": len(test)},
        "per_difficulty": {"train": difficulty_counts(train), "test": difficulty_counts(test)},
        "shards": shards,
    }
    write_json(out_dir / "manifest.json", full)
    return full
