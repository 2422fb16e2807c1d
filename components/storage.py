"""Moving stage artifacts between the workspace and the DVC remote (S3 in production), with retries.

A stage is only "done" for the pipeline once its outputs are on the remote: then any machine can pull
them and continue (``pull_stage_inputs``), and a fresh clone can ``dvc pull`` / ``dvc repro --pull``
instead of recomputing (the run-cache is pushed with every stage).

Failure handling. A push that still fails after ``storage.retries`` backed-off attempts raises
``StorageError`` and leaves the stage listed in ``.dvc/tmp/npr-unpushed.json``; the next push of any stage
first pushes the pending ones, so nothing is silently dropped. A stage is removed from that list only
after DVC reports the push succeeded *and* ``dvc status --cloud`` finds nothing of it missing on the
remote, so nothing is ever recorded as pushed that is not there.

Why DVC's Python API (``dvc.repo.Repo``) and not the ``dvc`` CLI: its exceptions are typed, which is what
separates a permanent mistake (unknown remote, unknown stage: fail at once, no retries) from a transient
transfer failure (retry with backoff); and it avoids starting a new interpreter and importing DVC for each
push, pull and status check. The API is not promised stable across DVC releases, which is why dvc is
pinned (3.67.1) in pyproject.toml and these calls are covered by tests against a real S3 server (moto).

Credentials and endpoints never live in git: the ``s3`` remote in .dvc/config names only the bucket;
the endpoint, profile and keys come from the environment (``AWS_ENDPOINT_URL``, ``AWS_PROFILE``,
``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY``) or from ``.dvc/config.local``.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TypeVar

import yaml

from components.dag import ARTIFACTS, load_stages
from components.errors import UserError
from components.ops.config import StorageConfig

log = logging.getLogger(__name__)


def dvc_executable() -> str:
    """The ``dvc`` of this environment (beside the running Python), else the one on PATH."""
    local = Path(sys.executable).with_name("dvc")
    return str(local) if local.exists() else (shutil.which("dvc") or "dvc")


def dvc_add(path: Path) -> None:
    """``dvc add`` ``path`` (its ``.dvc`` file is the user's to commit); UserError with DVC's message."""
    # not -q: it silences the error too, and the failure would say nothing
    proc = subprocess.run([dvc_executable(), "add", str(path)], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise UserError(f"dvc add {path} failed: {' '.join((proc.stderr or proc.stdout).split())}")


# A remote's settings a gpu-pool job may receive as environment variables: where the store is, never who
# may read it (keys, session tokens, credential files and profiles come from the pod's own secret).
FORWARDED_REMOTE_OPTIONS = ("endpointurl", "region")
REMOTE_ENV = "NPR_DVC_REMOTE"  # + _URL, and _<OPTION> for each forwarded option


def remote_forwarding(storage: StorageConfig, root: Path | str | None = None) -> dict[str, str]:
    """The pipeline's DVC remote as environment variables for a job on another machine.

    ``npr storage init`` writes the user's bucket to ``.dvc/config.local``, which never leaves this
    machine (git ignores it, the GPU image leaves it out): without these a gpu-pool pod would pull and push
    through the committed default bucket. ``infra/gpu/checkout.sh`` writes them into the job's checkout.
    The URL is the one DVC resolves here (config.local over .dvc/config); a local remote's relative path is
    made absolute, which only another process on this machine can use.
    """
    from dvc.repo import Repo  # lazy: dvc

    root = Path(root or ".")
    with Repo(str(root), _wait_for_lock=True) as repo:
        conf = repo.config["remote"].get(storage.remote)
    if conf is None:
        raise StorageError(f"DVC remote {storage.remote!r} is not configured in {root / '.dvc/config'}")
    url = str(conf["url"])
    if "://" not in url and not os.path.isabs(url):
        url = str((root / ".dvc" / url).resolve())
    env = {REMOTE_ENV: storage.remote, f"{REMOTE_ENV}_URL": url}
    for option in FORWARDED_REMOTE_OPTIONS:
        if conf.get(option):
            env[f"{REMOTE_ENV}_{option.upper()}"] = str(conf[option])
    return env


STATE_FILE = Path(".dvc/tmp/npr-unpushed.json")
T = TypeVar("T")


class StorageError(RuntimeError):
    """A push or pull to the DVC remote failed for good; the message says which stage, remote and why."""


# ----------------------------------------------------------------------------------------------------
# the not-pushed ledger


def _state_path(root: Path) -> Path:
    return root / STATE_FILE


@contextmanager
def _locked_state(root: Path) -> Iterator[dict[str, Any]]:
    """Read-modify-write the ledger under an exclusive lock (several stage tasks may push at once)."""
    path = _state_path(root)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        state = json.loads(path.read_text()) if path.exists() else {"unpushed": {}}
        yield state
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(json.dumps(state, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)


def pending_pushes(root: Path | str | None = None) -> list[str]:
    """Stages whose outputs were produced but are not (known to be) on the remote, oldest first."""
    path = _state_path(Path(root or "."))
    if not path.exists():
        return []
    unpushed = json.loads(path.read_text()).get("unpushed", {})
    return sorted(unpushed, key=lambda s: unpushed[s]["since"])


def _mark_unpushed(root: Path, stages: list[str], remote: str, error: str) -> None:
    now = datetime.now(UTC).isoformat()
    with _locked_state(root) as state:
        for stage in stages:
            entry = state["unpushed"].setdefault(stage, {"since": now, "attempts": 0})
            entry.update(remote=remote, last_error=error, last_attempt=now, attempts=entry["attempts"] + 1)


def _mark_pushed(root: Path, stages: list[str]) -> None:
    with _locked_state(root) as state:
        for stage in stages:
            state["unpushed"].pop(stage, None)


# ----------------------------------------------------------------------------------------------------
# what a stage produced and needs


def locked_outputs(stage: str, root: Path | str | None = None) -> list[dict[str, Any]]:
    """The outs recorded for ``stage`` in dvc.lock (path, md5, size, nfiles); empty if it never ran."""
    lock = Path(root or ".") / "dvc.lock"
    if not lock.exists():
        return []
    entry = (yaml.safe_load(lock.read_text()) or {}).get("stages", {}).get(stage) or {}
    return list(entry.get("outs") or [])


def upstream_artifacts(stage: str, root: Path | str | None = None) -> list[str]:
    """Deps of ``stage`` that are outputs of other stages (``artifacts/<upstream>/<name>``)."""
    specs = load_stages(Path(root or ".") / "dvc.yaml")
    if stage not in specs:
        raise StorageError(f"unknown stage {stage!r}; dvc.yaml has: {', '.join(specs)}")
    produced = {out for spec in specs.values() if spec.name != stage for out in spec.outs}
    return [d for d in specs[stage].deps if Path(d).parts[:1] == (ARTIFACTS,) and d in produced]


def remote_uri(path: str, storage: StorageConfig, root: Path | str | None = None) -> str:
    """Where DVC keeps the current version of an output on the remote (content-addressed).

    This is the URI W&B artifacts reference (``components.tracking``): e.g.
    ``s3://bucket/prefix/files/md5/ab/cdef....dir`` for a directory output.
    """
    root = Path(root or ".")
    for spec_stage in load_stages(root / "dvc.yaml"):
        for out in locked_outputs(spec_stage, root):
            if out["path"] == path:
                return _content_uri(root, storage.remote, out["md5"])
    raise StorageError(f"{path} is not a recorded output in dvc.lock (has its stage run?)")


def content_uri(md5: str, storage: StorageConfig, root: Path | str | None = None) -> str:
    """The remote URI of the DVC object ``md5`` (a file's md5, or a directory's ``<md5>.dir``)."""
    return _content_uri(Path(root or "."), storage.remote, md5)


def dvc_md5(path: Path | str) -> dict[str, Any]:
    """What DVC records for ``path`` in dvc.lock (``md5``, ``size``, ``nfiles`` for a directory), computed
    here with DVC's own hashing (dvc_data): a stage can name its outputs' remote objects before DVC
    records them. Reads every byte of ``path`` once."""
    from dvc_data.hashfile.build import build  # lazy: dvc
    from dvc_data.hashfile.db import HashFileDB  # lazy: dvc
    from dvc_objects.fs.local import LocalFileSystem  # lazy: dvc
    from dvc_objects.fs.memory import MemoryFileSystem  # lazy: dvc

    staging = HashFileDB(MemoryFileSystem(global_store=False), "/staging")
    _, meta, obj = build(staging, str(Path(path).resolve()), LocalFileSystem(), "md5")
    out: dict[str, Any] = {"md5": obj.hash_info.value, "size": meta.size}
    if meta.isdir:
        out["nfiles"] = meta.nfiles
    return out


def _content_uri(root: Path, remote: str, md5: str) -> str:
    from dvc.repo import Repo  # lazy: dvc

    # _wait_for_lock (`dvc --wait-for-lock`): stages of independent branches may run, push and pull at once

    with Repo(str(root), _wait_for_lock=True) as repo:
        conf = repo.config["remote"].get(remote)
        if conf is None:
            raise StorageError(f"DVC remote {remote!r} is not configured in {root / '.dvc/config'}")
        url = conf["url"]
    if "://" not in url:  # a local remote: relative paths are relative to .dvc/
        url = (root / ".dvc" / url).resolve().as_uri() if not os.path.isabs(url) else Path(url).as_uri()
    return f"{url.rstrip('/')}/files/md5/{md5[:2]}/{md5[2:]}"


# ----------------------------------------------------------------------------------------------------
# retries


def _permanent_errors() -> tuple[type[BaseException], ...]:
    """DVC errors that no retry can fix: a wrong remote, stage or path name."""
    from dvc.config import ConfigError  # lazy: dvc
    from dvc.exceptions import NoOutputOrStageError, NotDvcRepoError, OutputNotFoundError  # lazy: dvc
    from dvc.stage.exceptions import StageFileDoesNotExistError, StageNotFound  # lazy: dvc

    return (
        ConfigError,
        NoOutputOrStageError,
        NotDvcRepoError,
        OutputNotFoundError,
        StageNotFound,
        StageFileDoesNotExistError,
    )


def _with_retries(what: str, fn: Callable[[], T], storage: StorageConfig) -> tuple[T, int]:
    """Run ``fn`` up to ``retries + 1`` times with exponential backoff; returns (result, attempts)."""
    permanent = _permanent_errors()
    attempts = storage.retries + 1
    for attempt in range(1, attempts + 1):
        try:
            return fn(), attempt
        except permanent as err:
            raise StorageError(f"{what}: {type(err).__name__}: {err}") from err
        except Exception as err:  # network and transfer errors come from boto, s3fs, aiohttp, DVC
            if attempt == attempts:
                raise StorageError(
                    f"{what}: failed after {attempts} attempt(s); last error {type(err).__name__}: {err}"
                ) from err
            delay = min(storage.backoff_s * 2 ** (attempt - 1), storage.max_backoff_s)
            log.warning(
                "%s: attempt %d/%d failed (%s: %s); retrying in %.1f s",
                what,
                attempt,
                attempts,
                type(err).__name__,
                err,
                delay,
            )
            time.sleep(delay)
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------------------------------
# push and pull


def _push_and_verify(root: Path, stages: list[str], storage: StorageConfig) -> int:
    from dvc.repo import Repo  # lazy: dvc

    # DVC resolves targets against the working directory, not the repo: name stages by absolute path.
    targets = [f"{root / 'dvc.yaml'}:{stage}" for stage in stages]
    with Repo(str(root), _wait_for_lock=True) as repo:
        pushed = repo.push(targets=targets, remote=storage.remote, run_cache=True, jobs=storage.jobs)
        # DVC can finish a push while an object is still absent (e.g. missing from the local cache);
        # only what the remote is seen to hold counts as pushed.
        missing = repo.status(targets=targets, cloud=True, remote=storage.remote, jobs=storage.jobs)
    if missing:
        raise StorageError(f"after the push the remote still lacks: {sorted(missing)}")
    return int(pushed or 0)


def push_stage_outputs(stage: str, storage: StorageConfig, root: Path | str | None = None) -> dict[str, Any]:
    """Push ``stage``'s outputs (as recorded in dvc.lock) and the run-cache to ``storage.remote``.

    Stages left unpushed by earlier failures are pushed first, in the same transfer. Returns
    ``{stage, remote, targets, files_pushed, completed_pending, attempts, seconds}``. Raises
    ``StorageError`` when the push fails for good; every target is then (still) listed as unpushed.
    """
    root = Path(root or ".").resolve()
    if not locked_outputs(stage, root):
        raise StorageError(f"stage {stage!r} has no outputs recorded in dvc.lock; run it before pushing")
    pending = [s for s in pending_pushes(root) if s != stage]
    targets = [*pending, stage]
    what = f"push of {', '.join(targets)} to remote {storage.remote!r}"
    start = time.perf_counter()
    try:
        files, attempts = _with_retries(what, lambda: _push_and_verify(root, targets, storage), storage)
    except StorageError as err:
        _mark_unpushed(root, targets, storage.remote, str(err))
        raise StorageError(
            f"{err}\n{len(targets)} stage(s) left marked not-pushed in {STATE_FILE}; "
            "the next push of any stage retries them"
        ) from err.__cause__
    _mark_pushed(root, targets)
    return {
        "stage": stage,
        "remote": storage.remote,
        "targets": targets,
        "files_pushed": files,
        "completed_pending": pending,
        "attempts": attempts,
        "seconds": round(time.perf_counter() - start, 3),
    }


def pull_stage_inputs(stage: str, storage: StorageConfig, root: Path | str | None = None) -> dict[str, Any]:
    """Pull the upstream artifacts ``stage`` depends on that are missing from the workspace.

    Returns ``{stage, remote, pulled, present, files_fetched, attempts, seconds}``. An input that no
    upstream run has recorded in dvc.lock cannot be pulled: that raises ``StorageError`` naming it.
    """
    root = Path(root or ".").resolve()
    inputs = upstream_artifacts(stage, root)
    missing = [p for p in inputs if not (root / p).exists()]
    present = [p for p in inputs if p not in missing]
    result: dict[str, Any] = {
        "stage": stage,
        "remote": storage.remote,
        "pulled": missing,
        "present": present,
        "files_fetched": 0,
        "attempts": 0,
        "seconds": 0.0,
    }
    if not missing:
        return result
    recorded = {o["path"] for s in load_stages(root / "dvc.yaml") for o in locked_outputs(s, root)}
    unrecorded = [p for p in missing if p not in recorded]
    if unrecorded:
        raise StorageError(
            f"stage {stage!r} needs {unrecorded}, which no upstream run has recorded in "
            "dvc.lock; run the upstream stages first"
        )

    def pull() -> dict[str, Any]:
        from dvc.repo import Repo  # lazy: dvc

        with Repo(str(root), _wait_for_lock=True) as repo:
            targets = [str(root / p) for p in missing]  # absolute: DVC resolves targets against the cwd
            return (repo.pull(targets=targets, remote=storage.remote, jobs=storage.jobs) or {}).get(
                "stats", {}
            )

    start = time.perf_counter()
    stats, attempts = _with_retries(f"pull of {missing} from remote {storage.remote!r}", pull, storage)
    still_missing = [p for p in missing if not (root / p).exists()]
    if still_missing:
        raise StorageError(f"pull from {storage.remote!r} finished but {still_missing} are still absent")
    result.update(
        files_fetched=int(stats.get("fetched", 0)),
        attempts=attempts,
        seconds=round(time.perf_counter() - start, 3),
    )
    return result
