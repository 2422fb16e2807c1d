"""Stage fingerprints.

``stage_fingerprint``: a hash of a stage's own code and params — the Prefect task version, so a task run
says exactly which code and params produced it (DVC still decides staleness; it also sees data).
``work_fingerprint``: that plus the stage's input files — stamped on ``artifacts/<stage>/work`` so a stage
resumes from its checkpoints only when nothing it depends on changed (a stale checkpoint is never resumed).
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from components.config import PipelineConfig
from components.dag import ARTIFACTS, StageSpec, load_stages

_SKIP_PARTS = {"__pycache__", ".pytest_cache"}


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


def inputs_listing(paths: list[Path]) -> list[tuple[str, int, int]]:
    """(path, size, mtime_ns) of every file under the given inputs: changes whenever one is rewritten."""
    out = []
    for root in paths:
        for f in _code_files(str(root)):
            st = f.stat()
            out.append((str(f), st.st_size, st.st_mtime_ns))
    return sorted(out)


def work_fingerprint(stage: str, cfg: PipelineConfig) -> str:
    """Code + params + input files of ``stage``: what a resumable stage's work dir must match."""
    spec = load_stages()[stage]
    inputs = [Path(d) for d in spec.deps if Path(d).parts[0] in (ARTIFACTS, "data")]
    payload = {"stage": stage_fingerprint(spec, cfg), "inputs": inputs_listing(inputs)}
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()[:16]
