"""Read the records of an offline W&B run file (``run-<id>.wandb``) so tests can check what was logged.

The file is W&B's transaction log: a 7-byte header (":W&B", magic, version) then 32 KiB blocks of
records, each with a 7-byte header (crc32c, little-endian length, type: 1 full, 2 first, 3 middle,
4 last) and a serialized ``wandb_internal_pb2.Record``. wandb 0.31 no longer ships a Python reader.
"""

from __future__ import annotations

import re
import struct
import time
from pathlib import Path

BLOCK = 32 * 1024
HEADER = 7


def read_records(path: Path, timeout_s: float = 20.0) -> list:
    """All records of a finished run; waits until W&B's service has written the exit record."""
    deadline = time.monotonic() + timeout_s
    while True:
        records = _parse(Path(path)) if Path(path).exists() else []
        if by_type(records, "exit") or time.monotonic() > deadline:
            return records
        time.sleep(0.2)  # the wandb-core service writes asynchronously after run.finish() returns


def _parse(path: Path) -> list:
    from wandb.proto import wandb_internal_pb2

    data = Path(path).read_bytes()
    if data[:4] != b":W&B":
        raise ValueError(f"{path} is not a W&B run file")
    records, pending, pos = [], b"", HEADER
    while pos < len(data):
        left_in_block = BLOCK - pos % BLOCK
        if left_in_block < HEADER:  # block trailer padding
            pos += left_in_block
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        if length == 0 and kind == 0:
            pos += left_in_block
            continue
        pending += data[pos + HEADER : pos + HEADER + length]
        pos += HEADER + length
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
            pending = b""
    return records


def by_type(records: list, kind: str) -> list:
    return [getattr(r, kind) for r in records if r.WhichOneof("record_type") == kind]


def run_files(wandb_dir: Path, run_id: str) -> list[Path]:
    """The offline segments of one run. A segment started in the same second as the previous one gets a
    ``-1``, ``-2``... suffix on its directory (``offline-run-<time>-<id>-1``), so both shapes are matched."""
    runs = Path(wandb_dir) / "wandb"
    return sorted(
        p
        for p in runs.glob(f"offline-run-*-{run_id}*/run-{run_id}.wandb")
        if re.fullmatch(rf"offline-run-\d{{8}}_\d{{6}}-{re.escape(run_id)}(-\d+)?", p.parent.name)
    )
