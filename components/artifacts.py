"""Writing stage outputs safely: atomic directories, JSONL shards, metrics files."""

from __future__ import annotations

import json
import math
import os
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temp directory next to ``dest``; on success it replaces ``dest`` in one rename.

    On an exception the temp directory is removed and ``dest`` keeps its previous content.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
    tmp.mkdir()
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
        dest.rename(old)
        tmp.rename(dest)
        shutil.rmtree(old, ignore_errors=True)
    else:
        tmp.rename(dest)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(Path(path).read_text())


def write_jsonl(path: Path, records: Iterable[dict[str, Any]]) -> int:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    n = 0
    with path.open("w", encoding="utf-8") as f:
        for rec in records:
            f.write(json.dumps(rec, ensure_ascii=False, sort_keys=True) + "\n")
            n += 1
    return n


def read_jsonl(path: Path) -> Iterator[dict[str, Any]]:
    with Path(path).open(encoding="utf-8") as f:
        for line in f:
            if line.strip():
                yield json.loads(line)


def write_shards(
    directory: Path, records: list[dict[str, Any]], n_shards: int, stem: str = "part"
) -> list[Path]:
    """Split records into ``n_shards`` contiguous JSONL files (few large files, never one per sample)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    n_shards = max(1, min(n_shards, len(records) or 1))
    size = math.ceil(len(records) / n_shards) if records else 0
    paths = []
    for i in range(n_shards):
        p = directory / f"{stem}-{i:05d}.jsonl"
        write_jsonl(p, records[i * size : (i + 1) * size] if size else [])
        paths.append(p)
    return paths


def read_shards(directory: Path, stem: str = "part") -> list[dict[str, Any]]:
    """All records of a sharded JSONL directory, in shard order."""
    paths = sorted(Path(directory).glob(f"{stem}-*.jsonl"))
    if not paths:
        raise FileNotFoundError(f"no {stem}-*.jsonl shards in {directory}")
    return [rec for p in paths for rec in read_jsonl(p)]


def prepare_work_dir(work: Path, fingerprint: str) -> bool:
    """Keep ``work`` (checkpoints, partial shards) only if it was stamped with ``fingerprint``; otherwise
    start it afresh. Returns True when an existing work dir is kept (the stage may resume from it)."""
    work = Path(work)
    stamp = work / "fingerprint.json"
    keep = work.exists() and stamp.exists() and read_json(stamp).get("fingerprint") == fingerprint
    if work.exists() and not keep:
        shutil.rmtree(work)
    work.mkdir(parents=True, exist_ok=True)
    write_json(stamp, {"fingerprint": fingerprint})
    return keep
