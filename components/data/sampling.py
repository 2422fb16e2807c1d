"""Seeded train/val/test sampling of problem rows and the sharded output with its manifest.

The order of the input does not matter: rows are sorted by content id before the seeded shuffle, so the
same set of problems and the same seed always give the same ids. The held-out ``test`` split is drawn first
from the shuffle, the ``val`` split (carved from what would be training data, for tuning) next and ``train``
from what follows, so the test set does not move when ``n`` changes; a source with a partition (the
synthetic family) draws each split from its own partition instead (``split_problems``).
"""

from __future__ import annotations

import hashlib
import json
import random
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.artifacts import write_json, write_shards


def sample_splits(
    rows: list[dict[str, Any]], n: int, test_n: int, seed: int
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """``(train, test)``: ``test_n`` held-out rows, then ``n`` training rows, each tagged with ``split``.

    Raises ValueError when fewer than ``n + test_n`` rows are available (lower ``sample_orz.n``).
    """
    splits = split_problems(rows, n, test_n, seed)
    return splits["train"], splits["test"]


def split_problems(
    rows: list[dict[str, Any]],
    n: int,
    test_n: int,
    seed: int,
    val_n: int = 0,
    partition_of: Callable[[str], str] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """``{"train", "val", "test"}``: ``test_n`` held-out rows, ``val_n`` validation rows, ``n`` training rows.

    Without ``partition_of`` the seeded shuffle gives test first, then val, then train (so the test set
    does not move when ``n`` or ``val_n`` change). With it (``partition_of(id) -> "train" | "val" |
    "test"``, the synthetic family's partition) each split is drawn only from rows of its own partition,
    so no model built from the ``train`` partition (the committed tiny seed) can have seen a test or
    validation problem, whatever the seeds. Raises ValueError when a split asks for more rows than exist.
    """
    ids = [r["id"] for r in rows]
    if len(set(ids)) != len(ids):
        raise ValueError("rows must have unique ids before sampling (run the quality gate first)")
    shuffled = sorted(rows, key=lambda r: r["id"])
    random.Random(seed).shuffle(shuffled)
    wanted = {"test": test_n, "val": val_n, "train": n}
    if partition_of is None:
        if n + test_n + val_n > len(rows):
            raise ValueError(
                f"asked for n={n} train + val_n={val_n} validation + test_n={test_n} test problems but only "
                f"{len(rows)} passed the quality gate; lower sample_orz.n / sample_orz.test_n or provide "
                "more data"
            )
        bounds = {"test": (0, test_n), "val": (test_n, test_n + val_n)}
        bounds["train"] = (test_n + val_n, test_n + val_n + n)
        return {s: [{**r, "split": s} for r in shuffled[a:b]] for s, (a, b) in bounds.items()}
    pools: dict[str, list[dict[str, Any]]] = {s: [] for s in wanted}
    for r in shuffled:
        part = partition_of(r["id"])
        if part not in pools:
            raise ValueError(f"partition_of returned {part!r} for {r['id']}; expected one of {sorted(pools)}")
        pools[part].append(r)
    for split, want in wanted.items():
        if want > len(pools[split]):
            raise ValueError(
                f"asked for {want} {split} problems but only {len(pools[split])} of the {len(rows)} rows belong "
                f"to the {split} partition; raise sample_orz.synthetic_pool or lower the split's size"
            )
    return {s: [{**r, "split": s} for r in pools[s][:want]] for s, want in wanted.items()}


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
    val: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """train-NNNNN.jsonl, test-NNNNN.jsonl and val-NNNNN.jsonl (one shard each; val only when given) and
    manifest.json into ``out_dir``; returns the manifest."""
    out_dir = Path(out_dir)
    splits = {"train": train, "test": test, **({"val": val} if val is not None else {})}
    shards = {
        name: [p.name for p in write_shards(out_dir, rows, n_shards if name == "train" else 1, stem=name)]
        if rows
        else []
        for name, rows in splits.items()
    }
    full = {
        **manifest,
        "counts": {name: len(rows) for name, rows in splits.items()},
        "per_difficulty": {name: difficulty_counts(rows) for name, rows in splits.items()},
        "shards": shards,
    }
    write_json(out_dir / "manifest.json", full)
    return full
