"""W&B tracking of stage runs: one run per stage, grouped by pipeline run, resumable, references not uploads.

- Mode: ``tracking.mode`` (``auto`` = the WANDB_MODE the CLI set: online when WANDB_API_KEY is present,
  offline otherwise); ``disabled`` writes nothing at all.
- Grouping: ``group`` = the pipeline run id (env ``NPR_PIPELINE_RUN_ID``, set by the Prefect flow; a new
  id otherwise, exported so every stage of this process shares it); ``job_type`` = the stage name.
- Resume: the W&B run id lives in ``<run_dir>/wandb_run_id`` beside the stage's checkpoints, so a
  restarted stage continues the same W&B run (``resume="allow"``) instead of starting a new one, at the
  right step (``StageRun.resume_from``): W&B's service buffers what it is sent, and a killed stage's service
  exits without writing it, so every step logged is also journalled in ``<run_dir>/wandb_log.jsonl`` and
  the last step W&B surely holds (written when the run finished, or the server's step online) in
  ``<run_dir>/wandb_step``. A resumed stage logs again what the kill lost up to its checkpoint, from the
  journal, and nothing W&B is known to hold: the run's steps never go backwards (a service that flushed part
  of its buffer before the kill leaves those steps in its own segment too; the server keeps the first).
  Offline, each restart is another ``offline-run-*-<id>`` directory of the same run (``wandb sync`` merges
  them).
- Datasets and checkpoints are logged as artifact *references* to where DVC keeps them on the remote
  (``components.storage.content_uri``, the object named by the DVC md5 of the output); W&B records the
  URI and digest, never a copy of the bytes. The stage runner (``components.stages.run_stage``) logs the
  outputs a stage produced (``log_reference``) and the inputs it consumed (``use_reference``). A local
  remote's object exists only once the flow has pushed the stage (after `dvc repro`), and W&B refuses a
  ``file://`` reference to a missing file: such references are kept in ``<run_dir>/wandb_pending_refs.json``
  and logged by ``publish_pending_references`` after the push (flows/stage.py), into the same run.
- One run per stage: ``run_stage`` opens it around the whole stage; a ``stage_run`` for the same stage
  inside it (the trainers', the evaluation's) logs into that run instead of starting another.
"""

from __future__ import annotations

import json
import os
import threading
import urllib.parse
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Protocol

from components.ops.config import TrackingConfig

RUN_ID_FILE = "wandb_run_id"
STEP_FILE = "wandb_step"  # the last step W&B surely holds (written after the run finished)
JOURNAL_FILE = "wandb_log.jsonl"  # every step logged, to log again what a killed process lost
PENDING_REFS_FILE = "wandb_pending_refs.json"  # output references whose remote object is not there yet
PIPELINE_RUN_ENV = "NPR_PIPELINE_RUN_ID"
# The open run of each stage in this process (stage -> StageRun), so nested stage_run calls share it.
_ACTIVE: dict[str, StageRun] = {}


def own_wandb_service() -> None:
    """Make this process start its own W&B service instead of joining its parent's.

    wandb exports ``WANDB_SERVICE`` once it starts a service, so a child process (a stage run by the flow,
    by a test, by a retry loop) would otherwise join the parent's. A stage killed mid-run then leaves its
    run's stream registered there, and the rerun that resumes the same run id is refused ("run ID ... is
    in use"). A stage process is the unit that is killed and rerun, so it owns its service.
    """
    os.environ.pop("WANDB_SERVICE", None)


def pipeline_run_id() -> str:
    """The id that groups this pipeline run's stage runs; created (and exported) when the flow set none."""
    run_id = os.environ.get(PIPELINE_RUN_ENV)
    if not run_id:
        run_id = os.environ[PIPELINE_RUN_ENV] = f"run-{uuid.uuid4().hex[:12]}"
    return run_id


def resolve_mode(tracking: TrackingConfig) -> str:
    """online | offline | disabled; ``auto`` follows WANDB_MODE, else whether an API key is present."""
    if tracking.mode != "auto":
        return tracking.mode
    env_mode = os.environ.get("WANDB_MODE")
    if env_mode in ("online", "offline", "disabled"):
        return env_mode
    if env_mode == "dryrun":  # W&B's older spelling of offline
        return "offline"
    return "online" if os.environ.get("WANDB_API_KEY") else "offline"


def _persisted_run_id(run_dir: Path) -> str:
    """The stage's W&B run id: read from ``run_dir`` or created there before the run starts."""
    path = run_dir / RUN_ID_FILE
    if path.exists():
        run_id = path.read_text().strip()
        if run_id:
            return run_id
    run_id = uuid.uuid4().hex[:12]  # W&B accepts [a-z0-9]; written first so a crash still resumes it
    run_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(run_id + "\n")
    os.replace(tmp, path)
    return run_id


def _read_step(path: Path) -> int:
    try:
        return int(path.read_text().strip())
    except (FileNotFoundError, ValueError):  # none yet, or a write cut by a kill: nothing to skip
        return -1


def _read_journal(path: Path) -> list[dict[str, Any]]:
    entries = []
    if path.exists():
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:  # the last line of a killed process, cut short
                break
    return entries


class TrackedConfig(Protocol):
    """What a stage's W&B run reads of the pipeline config (components.config.PipelineConfig, a floor above
    this module): its ``tracking`` section, and the whole resolved config as the run's config."""

    @property
    def tracking(self) -> TrackingConfig: ...

    def model_dump(self, *, mode: str) -> dict[str, Any]: ...


class StageRun:
    """What a stage logs through. Metric keys are namespaced ``<stage>/<key>`` unless already so.

    With a ``run_dir`` (every mode but disabled) the run resumes at the right step: see the module
    docstring, ``resume_from`` and ``close``.
    """

    def __init__(self, run: Any, stage: str, run_dir: Path | None = None) -> None:
        self.run = run
        self.stage = stage
        self.run_dir = Path(run_dir) if run_dir is not None else None
        held = _read_step(self.run_dir / STEP_FILE) if self.run_dir is not None else -1
        # online, a resumed run's step counter starts after the last step the server has
        server = int(getattr(run, "step", 0) or 0) - 1 if self.run_dir is not None else -1
        self.logged_before = max(held, server)  # steps up to here are in W&B already: never logged again
        self._last_step = self.logged_before

    def resume_from(self, step: int) -> None:
        """The stage restored its checkpoint of ``step`` (-1: it starts afresh) and trains on from there.

        Journalled steps up to ``step`` that W&B does not hold (the service of a killed process dropped
        them) are logged again; journalled steps after it are forgotten (the stage computes them again).
        """
        if self.run_dir is None:
            return
        journal = self.run_dir / JOURNAL_FILE
        kept = [e for e in _read_journal(journal) if e["step"] <= step]
        for entry in kept:
            if entry["step"] > self.logged_before:
                self.run.log(entry["metrics"], step=entry["step"])
                self._last_step = max(self._last_step, entry["step"])
        tmp = journal.with_name(f".{journal.name}.tmp")
        tmp.write_text("".join(json.dumps(e) + "\n" for e in kept), encoding="utf-8")
        os.replace(tmp, journal)

    def close(self) -> None:
        """After the run finished (W&B has written everything): record the last step it holds."""
        if self.run_dir is not None and self._last_step >= 0:
            path = self.run_dir / STEP_FILE
            tmp = path.with_name(f".{path.name}.tmp")
            tmp.write_text(f"{self._last_step}\n")
            os.replace(tmp, path)

    @property
    def id(self) -> str:
        return self.run.id

    def _key(self, key: str) -> str:
        return key if key.startswith(f"{self.stage}/") else f"{self.stage}/{key}"

    def log(self, metrics: dict[str, Any], step: int | None = None) -> None:
        """Log scalars (or W&B media) at ``step`` (W&B's own counter when None). A step W&B already holds
        from an earlier process of this stage is not logged again (a resumed stage replays a few steps)."""
        if step is not None and step <= self.logged_before:
            return
        payload = {self._key(k): v for k, v in metrics.items()}
        self.run.log(payload, step=step)
        if step is not None and self.run_dir is not None:
            self._last_step = max(self._last_step, step)
            scalars = {k: v for k, v in payload.items() if isinstance(v, int | float)}
            with (self.run_dir / JOURNAL_FILE).open("a", encoding="utf-8") as f:
                f.write(json.dumps({"step": step, "metrics": scalars}) + "\n")

    def summary(self, values: dict[str, Any]) -> None:
        """Final values shown in the runs table (e.g. the stage's metrics.json)."""
        self.run.summary.update({self._key(k): v for k, v in values.items()})

    def log_reference(self, name: str, uri: str, type: str, metadata: dict[str, Any] | None = None) -> Any:
        """Log an artifact that points at ``uri`` (s3://, file://, ...) without uploading or reading it.

        ``checksum=False``: the URI of a DVC remote object is already content-addressed (its md5 is in the
        path), so W&B need not list or hash the bucket, and no credentials are needed at log time.
        The run config also gets ``outputs/<name>`` (``{uri, ...metadata}``). W&B refuses a ``file://``
        reference to an object that does not exist yet (a local DVC remote before the stage's push): then
        it is kept in ``<run_dir>/wandb_pending_refs.json`` for ``publish_pending_references`` (after the
        push) and nothing is logged now. Returns the W&B artifact or ``None``.
        """
        if self.run.disabled:
            return None
        self.run.config.update({f"outputs/{name}": {"uri": uri, **(metadata or {})}}, allow_val_change=True)
        if not reference_exists(uri):
            if self.run_dir is not None:
                pending = [r for r in _read_pending(self.run_dir) if r["name"] != name]
                pending.append({"name": name, "uri": uri, "type": type, "metadata": metadata or {}})
                _write_pending(self.run_dir, pending)
            return None
        return self.run.log_artifact(_reference_artifact(name, uri, type, metadata))

    def use_reference(self, name: str, uri: str, type: str, metadata: dict[str, Any] | None = None) -> None:
        """Record that the stage consumed the artifact at ``uri`` (the same reference its producer logged).

        Always in the run config under ``inputs/<name>`` (``{uri, ...metadata}``); online also as a W&B
        input artifact (``use_artifact``: lineage in the UI). W&B refuses ``use_artifact`` in offline mode,
        so an offline run keeps the config entry only.
        """
        if self.run.disabled:
            return
        self.run.config.update({f"inputs/{name}": {"uri": uri, **(metadata or {})}}, allow_val_change=True)
        if not self.run.offline:
            self.run.use_artifact(_reference_artifact(name, uri, type, metadata))


def reference_exists(uri: str) -> bool:
    """Whether W&B can log a reference to ``uri`` now: any non-file URI (content-addressed, never listed)
    and a ``file://`` URI whose file exists."""
    if not uri.startswith("file://"):
        return True
    return Path(urllib.parse.unquote(urllib.parse.urlparse(uri).path)).exists()


def _read_pending(run_dir: Path) -> list[dict[str, Any]]:
    path = Path(run_dir) / PENDING_REFS_FILE
    if not path.exists():
        return []
    try:
        return list(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError):  # a write cut by a kill: the stage's rerun writes it again
        return []


def _write_pending(run_dir: Path, pending: list[dict[str, Any]]) -> None:
    path = Path(run_dir) / PENDING_REFS_FILE
    if not pending:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(pending, indent=1), encoding="utf-8")
    os.replace(tmp, path)


_PUBLISH_LOCK = threading.Lock()


def publish_pending_references(cfg: TrackedConfig, stage: str, run_dir: Path | str) -> int:
    """After the stage's push: log, into the stage's own W&B run (resumed), the output references whose
    remote objects exist now. Returns how many were logged; those still missing stay pending."""
    run_dir = Path(run_dir)
    pending = _read_pending(run_dir)
    ready = [r for r in pending if reference_exists(r["uri"])]
    if not ready or not (run_dir / RUN_ID_FILE).exists():
        return 0
    # one at a time: stages of independent branches finish side by side in the flow's threads
    with _PUBLISH_LOCK, stage_run(cfg, stage, run_dir, reinit="create_new") as run:
        if run.run.disabled:
            return 0
        for ref in ready:
            run.run.log_artifact(_reference_artifact(ref["name"], ref["uri"], ref["type"], ref["metadata"]))
    _write_pending(run_dir, [r for r in pending if r not in ready])
    return len(ready)


def _reference_artifact(name: str, uri: str, type: str, metadata: dict[str, Any] | None) -> Any:
    import wandb  # lazy: wandb

    artifact = wandb.Artifact(_artifact_name(name), type=type, metadata={"uri": uri, **(metadata or {})})
    artifact.add_reference(uri, name=name.rsplit("/", 1)[-1], checksum=False)
    return artifact


def step_logger(run: StageRun, every: int = 1) -> Callable[[int, dict[str, Any]], None]:
    """An ``on_step(step, record)`` callback (as ``train_sft`` takes) that logs every ``every``-th step's
    scalars, and step 1, to ``run`` at that step."""
    if every < 1:
        raise ValueError(f"every must be >= 1, got {every}")

    def on_step(step: int, record: dict[str, Any]) -> None:
        if step == 1 or step % every == 0:
            run.log(
                {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}, step=step
            )

    return on_step


def _artifact_name(name: str) -> str:
    """W&B artifact names allow letters, digits, dashes, underscores and dots only."""
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name).strip("-")


@contextmanager
def stage_run(
    cfg: TrackedConfig | TrackingConfig, stage: str, run_dir: Path | str, reinit: str | None = None
) -> Iterator[StageRun]:
    """One W&B run for one stage; resumes the run recorded in ``run_dir`` if there is one.

    ``cfg`` is the PipelineConfig (its ``tracking`` section is used; the whole resolved config becomes the
    run config) or a bare ``TrackingConfig``. The run is finished on exit; an exception inside marks it
    failed (exit code 1) and propagates. Inside an open run of the same stage (the stage runner's), yields
    that run and leaves finishing it to its owner. ``reinit="create_new"``: a run beside others in the
    same process (the flow's), not the process's one run.
    """
    if stage in _ACTIVE:
        yield _ACTIVE[stage]
        return
    import wandb  # lazy: wandb

    tracking = cfg if isinstance(cfg, TrackingConfig) else cfg.tracking
    mode = resolve_mode(tracking)
    group = pipeline_run_id()
    config = {} if isinstance(cfg, TrackingConfig) else cfg.model_dump(mode="json")
    init: dict[str, Any] = {
        "project": tracking.project,
        "entity": tracking.entity,
        "group": group,
        "job_type": stage,
        "name": f"{stage}-{group}",
        "config": config,
        "mode": mode,
        "settings": wandb.Settings(console=tracking.console, silent=True),
    }
    if mode != "disabled":  # a disabled run writes nothing, not even its id
        init.update(id=_persisted_run_id(Path(run_dir)), resume="allow")
    if reinit is not None:
        init["reinit"] = reinit
    run = wandb.init(**init)
    stage_run_ = StageRun(run, stage, Path(run_dir) if mode != "disabled" else None)
    _ACTIVE[stage] = stage_run_
    try:
        yield stage_run_
    except BaseException:
        run.finish(exit_code=1)
        stage_run_.close()
        raise
    else:
        run.finish()
        stage_run_.close()
    finally:
        _ACTIVE.pop(stage, None)
