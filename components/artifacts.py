"""Writing stage outputs safely: atomic directories, JSONL shards, metrics files."""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import math
import os
import shutil
import sys
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

# renameat2(2): swap two paths in one step (Linux >= 3.15 on ext4, xfs, btrfs, tmpfs, overlayfs, ...)
_RENAME_EXCHANGE = 2
_AT_FDCWD = -100
_CANNOT_EXCHANGE = {errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP}


def exchange_paths(a: Path, b: Path) -> bool:
    """Atomically swap two existing paths (``renameat2(RENAME_EXCHANGE)``); False where the OS, libc or
    file system cannot, so the caller falls back to two renames."""
    if sys.platform != "linux":
        return False

    try:
        renameat2 = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True).renameat2
    except (AttributeError, OSError):  # a libc without it (glibc < 2.28)
        return False
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _CANNOT_EXCHANGE:
        return False
    raise OSError(err, f"cannot swap {a} and {b}: {os.strerror(err)}")


@contextmanager
def path_lock(target: Path) -> Iterator[None]:
    """An exclusive inter-process lock for ``target`` (``flock`` on ``.<name>.lock`` beside it).

    The lock file is removed on release, so none is left behind: a waiter that wakes up holding a lock on
    a file that was meanwhile unlinked (or replaced) notices the inode change and locks afresh. Not
    re-entrant: one process must not take the lock of the same target twice.
    """
    target = Path(target)
    lock = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            same = os.fstat(fd).st_ino == os.stat(lock).st_ino
        except FileNotFoundError:
            same = False
        except BaseException:
            os.close(fd)
            raise
        if same:
            break
        os.close(fd)
    try:
        yield
    finally:
        with suppress(FileNotFoundError):
            os.unlink(lock)
        os.close(fd)


def _stale_siblings(dest: Path) -> list[Path]:
    """Temp and old directories of ``dest`` left by writers that died (only called under the lock)."""
    prefixes = (f".{dest.name}.tmp-", f".{dest.name}.old-")
    return [p for p in dest.parent.iterdir() if p.name.startswith(prefixes)]


@contextmanager
def atomic_dir(dest: Path) -> Iterator[Path]:
    """Yield a temp directory next to ``dest``; on success it replaces ``dest`` atomically.

    - Readers never find ``dest`` missing: an existing ``dest`` is swapped with the finished temp directory
      in one ``renameat2(RENAME_EXCHANGE)``, so the path always names a complete, real directory (what DVC
      tracks); where the OS or file system cannot swap (not Linux), two renames are the fallback.
    - Writers of the same ``dest`` (threads or processes) take turns (``path_lock``); the last to finish
      wins and none fails.
    - On an exception the temp directory is removed and ``dest`` keeps its previous content. Temp and old
      directories left by a writer that was killed are removed by the next write of ``dest``.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with path_lock(dest):
        for stale in _stale_siblings(dest):
            shutil.rmtree(stale, ignore_errors=True)
        tmp = dest.parent / f".{dest.name}.tmp-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        try:
            yield tmp
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        if not dest.exists() and not dest.is_symlink():
            os.rename(tmp, dest)
        elif exchange_paths(tmp, dest):
            shutil.rmtree(tmp, ignore_errors=True)  # tmp now holds the previous content
        else:
            old = dest.parent / f".{dest.name}.old-{uuid.uuid4().hex[:8]}"
            os.rename(dest, old)
            os.rename(tmp, dest)
            shutil.rmtree(old, ignore_errors=True)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON atomically (temp file + rename)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # a name of its own per writer: two writers of one file never share (and clobber) a temp file
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_text(json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


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
