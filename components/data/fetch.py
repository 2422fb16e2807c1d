"""`npr data fetch`: populate ``data/`` (tracked by data.dvc) with ORZ training files and benchmarks.

* ``--from DIR``: copy ``DIR/orz/**/*.json`` (ORZ training files only; other schemas, e.g. ORZ's eval files,
  are skipped with the reason; truncated files are copied and reported) into ``dest/orz/`` and
  ``DIR/benchmarks/**/*.json[l]`` (each must parse) into ``dest/benchmarks/``, keeping relative paths.
* no source, ``sample_orz.source = synthetic`` (tiny): the in-repo smoke benchmark set
  (``components/data/smoke``) into ``dest/benchmarks/`` so every loader runs end to end offline.
* no source, ``sample_orz.source = hf``: the ORZ hub dataset into ``dest/orz/`` and each benchmark with a
  hub copy into ``dest/benchmarks/``; online only.
* no source, ``sample_orz.source = url``: the ORZ file at ``sample_orz.url`` into ``dest/orz/``.

Idempotent: a file whose content is already at the destination is not rewritten.
"""

from __future__ import annotations

import json
import os
import tempfile
import urllib.parse
from pathlib import Path
from typing import Any

from components.data import orz
from components.data.benchmarks import BENCHMARKS, BenchmarkError, hub_rows, read_rows
from components.data.config import SampleOrzConfig
from components.data.sources import download_hf_dataset, download_url
from components.env import hub_offline

SMOKE_DIR = Path(__file__).parent / "smoke" / "benchmarks"


class FetchSummary:
    """What a fetch did, file by file (returned as a dict and printed by the CLI)."""

    def __init__(self, mode: str, dest: Path) -> None:
        self.data: dict[str, Any] = {
            "mode": mode,
            "dest": str(dest),
            "copied": [],
            "unchanged": [],
            "skipped": [],
            "truncated": [],
        }

    def wrote(self, rel: str, changed: bool) -> None:
        self.data["copied" if changed else "unchanged"].append(rel)


def write_if_changed(dst: Path, content: bytes) -> bool:
    """Write ``content`` to ``dst`` atomically unless it is already there; returns whether it wrote."""
    if dst.exists() and dst.read_bytes() == content:
        return False
    dst.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=dst.parent, prefix=f".{dst.name}.", delete=False) as tmp:
        tmp.write(content)
    os.replace(tmp.name, dst)
    return True


def _copy_orz(src_dir: Path, dest_dir: Path, summary: FetchSummary) -> None:
    for src in sorted(p for p in src_dir.rglob("*.json") if p.is_file()):
        rel = src.relative_to(src_dir).as_posix()
        try:
            _, info = orz.read_orz_file(src, recover_truncated=True)
        except orz.OrzFormatError as err:
            summary.data["skipped"].append({"path": f"orz/{rel}", "reason": str(err)})
            continue
        if info.truncated:
            summary.data["truncated"].append(
                {"path": f"orz/{rel}", "complete_items": info.items, "bytes_dropped": info.bytes_dropped}
            )
        summary.wrote(f"orz/{rel}", write_if_changed(dest_dir / rel, src.read_bytes()))


def _copy_benchmarks(src_dir: Path, dest_dir: Path, summary: FetchSummary) -> None:
    files = sorted(p for p in src_dir.rglob("*") if p.is_file() and p.suffix in (".json", ".jsonl"))
    for src in files:
        rel = src.relative_to(src_dir).as_posix()
        try:
            read_rows(src)
        except BenchmarkError as err:
            raise ValueError(f"benchmark file {src} does not parse: {err}") from None
        summary.wrote(f"benchmarks/{rel}", write_if_changed(dest_dir / rel, src.read_bytes()))


def copy_from_dir(source: Path, dest: Path) -> dict[str, Any]:
    """Copy ORZ training files and benchmark files from a directory laid out like shared/data."""
    source = Path(source)
    if not source.is_dir():
        raise FileNotFoundError(f"--from {source}: not a directory")
    orz_dir, bench_dir = source / "orz", source / "benchmarks"
    if not orz_dir.is_dir() and not bench_dir.is_dir():
        raise FileNotFoundError(f"--from {source}: has neither orz/ nor benchmarks/")
    summary = FetchSummary("copy", dest)
    if orz_dir.is_dir():
        _copy_orz(orz_dir, dest / "orz", summary)
    if bench_dir.is_dir():
        _copy_benchmarks(bench_dir, dest / "benchmarks", summary)
    return summary.data


def write_smoke_benchmarks(dest: Path) -> dict[str, Any]:
    """The committed smoke benchmark set into ``dest/benchmarks`` (tiny profile, no network)."""
    if not SMOKE_DIR.is_dir():
        raise FileNotFoundError(f"smoke benchmark set missing at {SMOKE_DIR} (broken install?)")
    summary = FetchSummary("smoke", dest)
    _copy_benchmarks(SMOKE_DIR, dest / "benchmarks", summary)
    return summary.data


def fetch_from_hub(sc: SampleOrzConfig, dest: Path) -> dict[str, Any]:
    """ORZ raw files and the benchmarks that have a hub copy; ConnectionError when offline."""
    if hub_offline():
        raise ConnectionError("the hub is unreachable (HF_HUB_OFFLINE=1); use `npr data fetch --from DIR`")
    summary = FetchSummary("hub", dest)
    with tempfile.TemporaryDirectory() as tmp:
        _copy_orz(download_hf_dataset(sc.hf_dataset, Path(tmp)), dest / "orz", summary)
    for spec in BENCHMARKS.values():
        if spec.hub is None:
            summary.data["skipped"].append(
                {"path": f"benchmarks/{spec.relpath}", "reason": "no hub copy known"}
            )
            continue
        content = json.dumps(hub_rows(spec), indent=2, ensure_ascii=False, default=str).encode("utf-8")
        summary.wrote(
            f"benchmarks/{spec.relpath}", write_if_changed(dest / "benchmarks" / spec.relpath, content)
        )
    return summary.data


def fetch_data(sc: SampleOrzConfig, dest: Path, source: Path | None = None) -> dict[str, Any]:
    """Populate ``dest`` from ``source`` or from what the ``sample_orz`` section's ``source`` says; returns a
    summary."""
    dest = Path(dest)
    if source is not None:
        return copy_from_dir(Path(source), dest)
    if sc.source == "synthetic":
        return write_smoke_benchmarks(dest)
    if sc.source == "hf":
        return fetch_from_hub(sc, dest)
    if sc.source == "url":
        if not sc.url:
            raise ValueError("sample_orz.source=url needs sample_orz.url")
        summary = FetchSummary("url", dest)
        name = Path(urllib.parse.urlparse(sc.url).path).name or "orz.json"
        with tempfile.TemporaryDirectory() as tmp:
            path = download_url(sc.url, Path(tmp) / name, sc.download_timeout_s)
            orz.read_orz_file(path, recover_truncated=sc.recover_truncated)
            summary.wrote(f"orz/{name}", write_if_changed(dest / "orz" / name, path.read_bytes()))
        return summary.data
    raise ValueError(f"sample_orz.source={sc.source}: give --from DIR to copy local data into {dest}")
