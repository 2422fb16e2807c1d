"""Where `sample_orz` gets its rows: the synthetic family, a local ORZ file/dir, the hub, or a URL.

``load_source_rows(cfg, work_dir)`` returns the rows plus a provenance dict for the manifest. The hub and
URL sources need the network; offline they fail at once with a ConnectionError that says what to do.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from components.data import orz, synthetic
from components.data.config import SampleOrzConfig
from components.env import hub_offline


def _local(cfg: SampleOrzConfig, path: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    rows, infos = orz.load_orz_rows(path, recover_truncated=cfg.recover_truncated)
    return rows, {"source": "local", "path": str(path), "files": [i.to_dict() for i in infos]}


def download_hf_dataset(repo_id: str, dest: Path) -> Path:
    """Snapshot the raw JSON files of a hub dataset repo into ``dest``.

    ``datasets.load_dataset`` cannot table ORZ's raw layout (a list of two-message lists), so the raw files
    are fetched as they are and read with the same ORZ reader as local files.
    """
    if hub_offline():
        raise ConnectionError(
            f"the hub is offline (HF_HUB_OFFLINE=1); cannot fetch {repo_id}. "
            "Use sample_orz.source=local with `npr data fetch --from DIR`."
        )
    from huggingface_hub import snapshot_download  # lazy: huggingface_hub

    return Path(
        snapshot_download(repo_id=repo_id, repo_type="dataset", allow_patterns=["*.json"], local_dir=dest)
    )


def download_url(url: str, dest: Path, timeout_s: float) -> Path:
    """Download ``url`` to ``dest`` (temp file, then rename); ConnectionError when unreachable."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (
            urllib.request.urlopen(url, timeout=timeout_s) as resp,
            tempfile.NamedTemporaryFile(dir=dest.parent, delete=False) as tmp,
        ):
            shutil.copyfileobj(resp, tmp)
    except (urllib.error.URLError, TimeoutError, OSError) as err:
        raise ConnectionError(f"could not download {url}: {err}") from None
    Path(tmp.name).replace(dest)
    return dest


def load_source_rows(cfg: SampleOrzConfig, work_dir: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Rows (``{id, problem, answer, source, difficulty, ...}``) and provenance for the configured source."""
    if cfg.source == "synthetic":
        rows = synthetic.generate_problems(cfg.synthetic_pool, cfg.seed, cfg.synthetic_weights)
        return rows, {
            "source": "synthetic",
            "pool": cfg.synthetic_pool,
            "weights": dict(cfg.synthetic_weights),
        }
    if cfg.source == "local":
        return _local(cfg, Path(cfg.local_path))
    if cfg.source == "hf":
        path = download_hf_dataset(cfg.hf_dataset, Path(work_dir) / "hf")
        rows, prov = _local(cfg, path)
        return rows, {**prov, "source": "hf", "hf_dataset": cfg.hf_dataset}
    if cfg.source == "url":
        if not cfg.url:
            raise ValueError("sample_orz.source=url needs sample_orz.url")
        name = Path(urllib.parse.urlparse(cfg.url).path).name or "orz.json"
        path = download_url(cfg.url, Path(work_dir) / "url" / name, cfg.download_timeout_s)
        rows, prov = _local(cfg, path)
        return rows, {**prov, "source": "url", "url": cfg.url}
    raise ValueError(f"unknown sample_orz.source {cfg.source!r}")
