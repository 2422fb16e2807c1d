"""Stage fingerprints.

``stage_fingerprint``: a hash of a stage's own code and params — the Prefect task version, so a task run
says exactly which code and params produced it (DVC still decides staleness; it also sees data).
``work_fingerprint``: that plus the content of the stage's input files — stamped on ``artifacts/<stage>/work``
so a stage resumes from its checkpoints only when nothing it depends on changed (a stale checkpoint is never
resumed). Inputs count by content, never by mtime: the same bytes rewritten (a re-pull on a fresh worker, a
copy-mode checkout, ``cp`` without ``-p``) keep the checkpoints. The md5 of each file is the one DVC already
computed to decide the stage was stale (its state database, keyed by inode, mtime and size), so under
``dvc repro`` no input is read again; outside a DVC repository the files are hashed here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Any

from components.config import PipelineConfig
from components.dag import ARTIFACTS, StageSpec, load_stages

_SKIP_PARTS = {"__pycache__", ".pytest_cache"}
log = logging.getLogger(__name__)


def _code_files(dep: str) -> list[Path]:
    p = Path(dep)
    if p.is_file():
        return [p]
    if p.is_dir():
        return sorted(
            f for f in p.rglob("*") if f.is_file() and not _SKIP_PARTS & set(f.parts) and f.suffix != ".pyc"
        )
    return []


def _param_value(data: dict[str, Any], key: str) -> Any:
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, dict) or part not in node:
            raise KeyError(f"dvc.yaml names param {key!r}, which params.yaml does not have")
        node = node[part]
    return node


def stage_fingerprint(spec: StageSpec, cfg: PipelineConfig) -> str:
    """sha256 over the stage's code deps (not data or upstream artifacts) and its params values."""
    h = hashlib.sha256()
    for dep in spec.deps:
        if Path(dep).parts[0] in (ARTIFACTS, "data"):
            continue
        for f in _code_files(dep):
            h.update(str(f).encode())
            h.update(f.read_bytes())
    data = cfg.model_dump(mode="json")
    params = {key: _param_value(data, key) for key in spec.params}
    h.update(json.dumps(params, sort_keys=True).encode())
    return h.hexdigest()[:16]


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with path.open("rb") as f:
        while chunk := f.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def _dvc_md5s(files: list[Path]) -> list[str] | None:
    """md5s through DVC's state database (what ``dvc status``/``dvc repro`` computed and cached); None
    outside a DVC repository or when DVC cannot be used, so the caller hashes the files itself."""
    try:
        from dvc.fs import LocalFileSystem  # lazy: dvc
        from dvc.repo import Repo  # lazy: dvc
        from dvc_data.hashfile.hash import hash_file  # lazy: dvc
    except ImportError:
        return None
    try:
        repo = Repo(os.getcwd())
    except Exception:  # not a DVC repository (a test dir, a bare copy): hash directly
        return None
    try:
        fs, out = LocalFileSystem(), []
        for f in files:
            _, info = hash_file(os.path.abspath(f), fs, "md5", state=repo.state)
            out.append(str(info.value))
        return out
    except Exception as err:  # a locked or unreadable state db must not fail the stage
        log.debug("DVC state unavailable (%s); hashing inputs directly", err)
        return None
    finally:
        repo.close()


def inputs_listing(paths: list[Path]) -> list[tuple[str, str]]:
    """(path, md5) of every file under the given inputs: changes only when some file's bytes change."""
    files = sorted({f for root in paths for f in _code_files(str(root))})
    digests = _dvc_md5s(files) if files else []
    if digests is None:
        digests = [_md5(f) for f in files]
    return [(str(f), d) for f, d in zip(files, digests, strict=True)]


def work_fingerprint(stage: str, cfg: PipelineConfig) -> str:
    """Code + params + input files of ``stage``: what a resumable stage's work dir must match."""
    spec = load_stages()[stage]
    inputs = [Path(d) for d in spec.deps if Path(d).parts[0] in (ARTIFACTS, "data")]
    payload = {"stage": stage_fingerprint(spec, cfg), "inputs": inputs_listing(inputs)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
