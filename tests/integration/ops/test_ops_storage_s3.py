"""components.storage against a real S3-protocol server (moto) and the repository's own `s3` remote."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from ops_testing import (
    VENV_BIN,
    create_bucket,
    git_commit,
    list_keys,
    make_dvc_project,
    run,
    shipped_remote_bucket,
    tree_bytes,
)

from components.ops.config import StorageConfig
from components.storage import (
    STATE_FILE,
    StorageError,
    pending_pushes,
    pull_stage_inputs,
    push_stage_outputs,
    remote_uri,
)

pytestmark = pytest.mark.integration

S3 = StorageConfig(remote="s3", retries=1, backoff_s=0.1)


@pytest.fixture(scope="module")
def reproduced(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The two-stage project, reproduced once per module (each test works on a copy)."""
    base = tmp_path_factory.mktemp("template")
    repo = make_dvc_project(base / "repo")
    run([str(VENV_BIN / "dvc"), "repro", "-q"], repo, env={"NPR_TEST_RUN_LOG": str(base / "runs.log")})
    git_commit(repo, "two stages")
    assert (base / "runs.log").read_text().split() == ["make_data", "train"]
    return base


@pytest.fixture()
def project(reproduced: Path, tmp_path: Path, s3_server, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the reproduced project; its bucket exists on the fresh moto server."""
    create_bucket(shipped_remote_bucket()[0])
    shutil.copytree(reproduced / "repo", tmp_path / "repo", symlinks=True)
    shutil.copy(reproduced / "runs.log", tmp_path / "runs.log")
    monkeypatch.setenv("NPR_TEST_RUN_LOG", str(tmp_path / "runs.log"))
    return tmp_path / "repo"


def _remove_local_copies(repo: Path) -> None:
    shutil.rmtree(repo / ".dvc" / "cache")
    shutil.rmtree(repo / "artifacts")


def test_push_then_pull_is_byte_identical(project: Path) -> None:
    before = tree_bytes(project / "artifacts")
    first = push_stage_outputs("make_data", S3, root=project)
    second = push_stage_outputs("train", S3, root=project)
    # DVC counts data objects and run-cache entries: 4 shards + .dir + 2 run entries; model + .dir + the
    # 2 run entries again (DVC re-sends run-cache entries without checking the remote)
    assert (first["files_pushed"], second["files_pushed"]) == (7, 4)
    assert first["targets"] == ["make_data"] and second["completed_pending"] == []
    bucket, prefix = shipped_remote_bucket()
    keys = list_keys(bucket)
    assert sum(k.startswith(f"{prefix}/files/md5/") for k in keys) == 7
    assert any(k.startswith(f"{prefix}/runs/") for k in keys), "run-cache was not pushed"
    assert pending_pushes(project) == []

    _remove_local_copies(project)
    pulled = pull_stage_inputs("train", S3, root=project)
    assert pulled["pulled"] == ["artifacts/make_data/shards"] and pulled["files_fetched"] == 5
    assert tree_bytes(project / "artifacts") == {k: v for k, v in before.items() if k.startswith("make_data")}
    # inputs already present are left alone
    assert pull_stage_inputs("train", S3, root=project)["pulled"] == []


def test_remote_uri_points_at_the_pushed_object(project: Path) -> None:
    push_stage_outputs("train", S3, root=project)
    uri = remote_uri("artifacts/train/model", S3, root=project)
    bucket, prefix = shipped_remote_bucket()
    assert uri.startswith(f"s3://{bucket}/{prefix}/files/md5/") and uri.endswith(".dir")
    assert uri[len(f"s3://{bucket}/") :] in list_keys(bucket)


def test_server_gone_mid_push_marks_not_pushed_and_next_push_completes(project: Path, s3_server) -> None:
    bucket, prefix = shipped_remote_bucket()
    s3_server.go_down_after_puts(2)  # two of make_data's four shards get through, then the server is gone
    one_at_a_time = S3.model_copy(update={"jobs": 1})  # so that exactly two uploads finish first
    with pytest.raises(StorageError) as info:
        push_stage_outputs("make_data", one_at_a_time, root=project)
    message = str(info.value)
    assert "make_data" in message and "'s3'" in message and "not-pushed" in message
    assert pending_pushes(project) == ["make_data"]
    state = json.loads((project / STATE_FILE).read_text())["unpushed"]["make_data"]
    assert state["remote"] == "s3" and state["attempts"] == 1 and state["last_error"]

    s3_server.start()  # same port, same stored objects
    partial = [k for k in list_keys(bucket) if k.startswith(f"{prefix}/files/")]
    assert len(partial) == 2, partial  # only what really arrived; the .dir listing is not among it
    status = run([str(VENV_BIN / "dvc"), "status", "--cloud", "-r", "s3", "make_data"], project).stdout
    assert "new:" in status and "artifacts/make_data/shards" in status  # DVC agrees: not on the remote

    result = push_stage_outputs("train", S3, root=project)  # any stage's push completes the pending one
    assert result["completed_pending"] == ["make_data"] and result["targets"] == ["make_data", "train"]
    assert pending_pushes(project) == []
    _remove_local_copies(project)
    run([str(VENV_BIN / "dvc"), "pull", "-r", "s3"], project)
    assert len(list((project / "artifacts/make_data/shards").iterdir())) == 4


def test_permanent_errors_fail_fast_and_are_recorded(project: Path) -> None:
    with pytest.raises(StorageError, match="nope"):
        push_stage_outputs("make_data", StorageConfig(remote="nope", retries=5, backoff_s=10), root=project)
    assert pending_pushes(project) == [
        "make_data"
    ]  # no 5 x 10 s of backoff: a wrong remote name is not retried
    with pytest.raises(StorageError, match="no outputs recorded"):
        push_stage_outputs("never_ran", S3, root=project)


def test_fresh_clone_pulls_and_skips_work(project: Path, tmp_path: Path) -> None:
    push_stage_outputs("make_data", S3, root=project)
    push_stage_outputs("train", S3, root=project)
    expected = tree_bytes(project / "artifacts")
    log = tmp_path / "runs.log"
    ran_before = log.read_text()

    clone = tmp_path / "clone"
    run(["git", "clone", "-q", str(project), str(clone)], tmp_path)
    # a machine that works against S3 makes it its default remote in the git-ignored config.local
    run([str(VENV_BIN / "dvc"), "remote", "default", "--local", "s3"], clone)
    out = run([str(VENV_BIN / "dvc"), "repro", "--pull"], clone).stdout
    assert log.read_text() == ran_before, out  # nothing was recomputed
    assert tree_bytes(clone / "artifacts") == expected

    # Without dvc.lock only the run-cache knows the results: pull it and repro restores instead of running.
    clone2 = tmp_path / "clone2"
    run(["git", "clone", "-q", str(project), str(clone2)], tmp_path)
    (clone2 / "dvc.lock").unlink()
    run([str(VENV_BIN / "dvc"), "remote", "default", "--local", "s3"], clone2)
    run([str(VENV_BIN / "dvc"), "fetch", "--run-cache"], clone2)
    out = run([str(VENV_BIN / "dvc"), "repro", "--pull"], clone2).stdout
    assert log.read_text() == ran_before, out
    assert "skipping run" in out
    assert tree_bytes(clone2 / "artifacts") == expected
