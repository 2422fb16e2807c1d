"""components.storage's retry loop and not-pushed ledger, on a real DVC repo with a local remote."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.ops.config import StorageConfig
from components.storage import (
    StorageError,
    locked_outputs,
    pending_pushes,
    push_stage_outputs,
    remote_uri,
    upstream_artifacts,
)

DVC = str(Path(sys.executable).with_name("dvc"))


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One stage whose output is 2 files; remotes `good` (a directory) and `broken` (a path under a file)."""
    root = tmp_path_factory.mktemp("repo")
    (root / "blocker").write_text("a file where the broken remote expects a directory\n")
    (root / "dvc.yaml").write_text(
        "stages:\n  make:\n    cmd: mkdir -p artifacts/make/out && echo a > artifacts/make/out/a"
        " && echo b > artifacts/make/out/b\n    outs: [artifacts/make/out]\n"
        "  use:\n    cmd: cat artifacts/make/out/a > used\n    deps: [artifacts/make/out]\n"
        "    outs: [used]\n"
    )
    for cmd in (
        ["git", "init", "-q"],
        [DVC, "init", "-q"],
        [DVC, "remote", "add", "good", str(root / "remote")],
        [DVC, "remote", "add", "broken", str(root / "blocker" / "remote")],
        [DVC, "repro", "-q", "make"],
    ):
        subprocess.run(
            cmd,
            cwd=root,
            check=True,
            capture_output=True,
            env={"DVC_NO_ANALYTICS": "1", "PATH": "/usr/bin:/bin"},
        )
    return root


def test_transient_failures_are_retried_with_backoff_then_recorded(repo: Path) -> None:
    broken = StorageConfig(remote="broken", retries=2, backoff_s=0.2, max_backoff_s=0.3)
    start = time.perf_counter()
    with pytest.raises(StorageError, match=r"failed after 3 attempt\(s\)") as info:
        push_stage_outputs("make", broken, root=repo)
    assert time.perf_counter() - start >= 0.2 + 0.3  # waits 0.2 then min(0.4, cap 0.3)
    assert "not-pushed" in str(info.value)
    assert pending_pushes(repo) == ["make"]
    with pytest.raises(StorageError):  # a second failure keeps one entry and counts the attempt
        push_stage_outputs("make", broken.model_copy(update={"retries": 0}), root=repo)
    assert pending_pushes(repo) == ["make"]

    result = push_stage_outputs("make", StorageConfig(remote="good", retries=0), root=repo)
    assert result["targets"] == ["make"] and result["attempts"] == 1 and pending_pushes(repo) == []
    (out,) = locked_outputs("make", repo)
    md5 = out["md5"]
    assert remote_uri("artifacts/make/out", StorageConfig(remote="good"), root=repo) == (
        (repo / "remote").as_uri() + f"/files/md5/{md5[:2]}/{md5[2:]}"
    )
    assert (repo / "remote" / "files" / "md5" / md5[:2] / md5[2:]).is_file()


def test_upstream_artifacts_are_outputs_of_other_stages(repo: Path) -> None:
    assert upstream_artifacts("use", repo) == ["artifacts/make/out"]
    assert upstream_artifacts("make", repo) == []
    with pytest.raises(StorageError, match="unknown stage"):
        upstream_artifacts("nope", repo)
    with pytest.raises(StorageError, match="not a recorded output"):
        remote_uri("used", StorageConfig(remote="good"), root=repo)


def test_dvc_add_failure_is_a_user_error_with_dvcs_message(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from components.errors import UserError
    from components.storage import dvc_add, dvc_executable

    assert Path(dvc_executable()).name == "dvc"
    monkeypatch.chdir(tmp_path)  # not a DVC repository
    (tmp_path / "baseline.yaml").write_text("x: 1\n")
    with pytest.raises(UserError, match=r"dvc add baseline.yaml failed: .*(not inside of a DVC repository|dvc init)"):
        dvc_add(Path("baseline.yaml"))
