"""components.tracking with the real W&B service in offline mode (and disabled), reading back its run files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from wandb_records import by_type, read_records, run_files

from components.ops.config import TrackingConfig
from components.tracking import PIPELINE_RUN_ENV, RUN_ID_FILE, resolve_mode, stage_run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def module_wandb_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # W&B fixes its root directory at the first init of a process, so the module shares one WANDB_DIR;
    # every test finds its own files by run id.
    return tmp_path_factory.mktemp("wandb_root")


@pytest.fixture()
def wandb_dir(module_wandb_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    import wandb

    # Another test of the same process may have started W&B with another root: reset its singleton so
    # this WANDB_DIR is read again.
    wandb.teardown()
    monkeypatch.setenv("WANDB_DIR", str(module_wandb_dir))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv(PIPELINE_RUN_ENV, "run-test-1")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    return module_wandb_dir


def _history(records: list) -> list[dict]:
    return [
        {i.nested_key[0] if i.nested_key else i.key: json.loads(i.value_json) for i in h.item}
        for h in by_type(records, "history")
    ]


OFFLINE = TrackingConfig(project="npr-test", mode="offline", console="off")


def test_stage_run_logs_grouped_namespaced_and_resumes(wandb_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "artifacts" / "seed" / "work"
    with stage_run(OFFLINE, "seed", run_dir) as run:
        run.log({"loss": 1.5, "seed/lr": 0.1}, step=0)
        run.log({"loss": 1.25}, step=1)
        run.summary({"accuracy": 0.5})
        run.log_reference(
            "seed/model",
            "s3://bucket/store/files/md5/ab/cdef0123.dir",
            "model",
            metadata={"dvc_path": "artifacts/seed/model"},
        )
        first_id = run.id
    assert (run_dir / RUN_ID_FILE).read_text().strip() == first_id

    with stage_run(OFFLINE, "seed", run_dir) as run:  # the stage restarted: same W&B run
        assert run.id == first_id
        run.log({"loss": 1.0}, step=2)

    files = run_files(wandb_dir, first_id)
    assert len(files) == 2  # two offline segments of one run; `wandb sync` joins them
    records = read_records(files[0])
    (info,) = by_type(records, "run")
    assert (info.run_id, info.run_group, info.job_type, info.project) == (
        first_id,
        "run-test-1",
        "seed",
        "npr-test",
    )
    history = _history(records)
    assert [(h["_step"], h["seed/loss"]) for h in history] == [(0, 1.5), (1, 1.25)]
    assert history[0]["seed/lr"] == 0.1  # already namespaced keys are not prefixed twice
    summary = {
        u.key: json.loads(u.value_json) for s in by_type(records, "summary") for u in s.update if u.key
    }
    assert summary["seed/accuracy"] == 0.5
    (artifact,) = by_type(records, "artifact")
    assert (artifact.name, artifact.type) == ("seed-model", "model")
    (entry,) = artifact.manifest.contents
    assert entry.ref == "s3://bucket/store/files/md5/ab/cdef0123.dir" and entry.path == "model"
    assert json.loads(artifact.metadata)["dvc_path"] == "artifacts/seed/model"
    resumed = read_records(files[1])
    assert [(h["_step"], h["seed/loss"]) for h in _history(resumed)] == [(2, 1.0)]


def test_disabled_writes_nothing(wandb_dir: Path, tmp_path: Path) -> None:
    run_dir = tmp_path / "work"
    before = set(wandb_dir.glob("wandb/*-run-*"))
    with stage_run(TrackingConfig(mode="disabled"), "distill", run_dir) as run:
        run.log({"x": 1}, step=0)
        run.summary({"y": 2})
        assert run.log_reference("d", "s3://b/k", "dataset") is None
    assert not run_dir.exists()
    assert set(wandb_dir.glob("wandb/*-run-*")) == before  # no new run directory, offline or not


def test_failure_inside_marks_run_failed_and_propagates(wandb_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"), stage_run(OFFLINE, "npr_zero", tmp_path / "w") as run:
        run.log({"reward": 0.1}, step=0)
        raise RuntimeError("boom")
    run_id = (tmp_path / "w" / RUN_ID_FILE).read_text().strip()
    (exit_record,) = by_type(read_records(run_files(wandb_dir, run_id)[0]), "exit")
    assert exit_record.exit_code == 1


def test_mode_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WANDB_MODE", raising=False)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    assert resolve_mode(TrackingConfig()) == "offline"
    monkeypatch.setenv("WANDB_API_KEY", "k" * 40)
    assert resolve_mode(TrackingConfig()) == "online"
    assert resolve_mode(TrackingConfig(mode="disabled")) == "disabled"
    monkeypatch.setenv("WANDB_MODE", "offline")  # what the CLI set wins over the key's presence
    assert resolve_mode(TrackingConfig()) == "offline"


def test_pipeline_run_id_is_created_once(monkeypatch: pytest.MonkeyPatch) -> None:
    from components.tracking import pipeline_run_id

    monkeypatch.delenv(PIPELINE_RUN_ENV, raising=False)
    first = pipeline_run_id()
    assert first.startswith("run-") and pipeline_run_id() == first


def test_run_files_finds_segments_started_in_the_same_second(tmp_path):
    """W&B suffixes the directory of a resumed segment started within the same second (``-1``)."""
    for name, rid in [
        ("offline-run-20261130_230202-abc", "abc"),
        ("offline-run-20261130_230202-abc-1", "abc"),
        ("offline-run-20261130_230202-abcd", "abcd"),  # another run whose id starts the same
    ]:
        (tmp_path / "wandb" / name).mkdir(parents=True)
        (tmp_path / "wandb" / name / f"run-{rid}.wandb").write_bytes(b"")
    assert [p.parent.name for p in run_files(tmp_path, "abc")] == [
        "offline-run-20261130_230202-abc",
        "offline-run-20261130_230202-abc-1",
    ]
