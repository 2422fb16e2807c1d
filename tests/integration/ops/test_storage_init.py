"""`npr storage init s3://bucket/prefix` against a real S3-protocol server (moto): the bucket, the DVC remote
in .dvc/config.local, a probe object; then a plain `dvc push` lands under the prefix."""

from __future__ import annotations

import configparser
import os
import subprocess
from pathlib import Path

import pytest
from ops_testing import VENV_BIN, create_bucket, list_keys, make_dvc_project, run
from typer.testing import CliRunner

from components.cli import app

pytestmark = pytest.mark.integration


@pytest.fixture()
def repo(tmp_path: Path, s3_server, monkeypatch: pytest.MonkeyPatch) -> Path:
    root = make_dvc_project(tmp_path / "repo")
    monkeypatch.chdir(root)
    return root


def _local_config(root: Path) -> configparser.ConfigParser:
    parser = configparser.ConfigParser()
    parser.read(root / ".dvc" / "config.local")
    return parser


def test_init_creates_the_bucket_configures_the_remote_and_probes_it(repo: Path) -> None:
    result = CliRunner().invoke(app, ["storage", "init", "s3://fresh-bucket/npr/store"])
    assert result.exit_code == 0, (result.output, result.exception)
    assert "bucket fresh-bucket: created" in result.output
    assert "probe: ok" in result.output
    conf = _local_config(repo)
    assert conf["'remote \"s3\"'"]["url"] == "s3://fresh-bucket/npr/store"
    assert conf["core"]["remote"] == "s3"
    assert list_keys("fresh-bucket") == []  # the probe object was removed
    # the remote DVC now uses by default takes a real push, under the prefix
    run([str(VENV_BIN / "dvc"), "repro", "-q"], repo, env={"NPR_TEST_RUN_LOG": str(repo.parent / "runs.log")})
    run([str(VENV_BIN / "dvc"), "push", "-q"], repo)
    keys = list_keys("fresh-bucket")
    assert keys and all(k.startswith("npr/store/files/md5/") for k in keys), keys
    # a second init finds the bucket
    again = CliRunner().invoke(app, ["storage", "init", "s3://fresh-bucket/npr/store"])
    assert again.exit_code == 0 and "bucket fresh-bucket: exists" in again.output


def test_an_existing_bucket_is_used_and_not_made_the_default_when_asked(repo: Path) -> None:
    create_bucket("team-bucket")
    result = CliRunner().invoke(
        app, ["storage", "init", "s3://team-bucket", "--remote", "team", "--no-default"]
    )
    assert result.exit_code == 0, (result.output, result.exception)
    assert "bucket team-bucket: exists" in result.output
    conf = _local_config(repo)
    assert conf["'remote \"team\"'"]["url"] == "s3://team-bucket"
    assert not conf.has_option("core", "remote")


@pytest.mark.parametrize(
    ("args", "needles"),
    [
        (
            ["s3://missing-bucket/x", "--no-create"],
            ["missing-bucket does not exist", "aws s3 mb s3://missing-bucket"],
        ),
        (["http://not-s3/x"], ["not an s3:// URL"]),
        (["s3:///prefix"], ["no bucket name"]),
    ],
    ids=["no-create", "not-s3", "no-bucket"],
)
def test_bad_input_is_one_line_and_exit_2(repo: Path, args: list[str], needles: list[str]) -> None:
    result = CliRunner().invoke(app, ["storage", "init", *args])
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0]
    assert (
        not (repo / ".dvc" / "config.local").exists()
        or "missing-bucket" not in (repo / ".dvc" / "config.local").read_text()
    )


CHECKOUT_SH = Path(__file__).resolve().parents[3] / "infra" / "gpu" / "checkout.sh"


def test_a_gpu_pool_job_uses_the_bucket_storage_init_configured(repo: Path, tmp_path: Path) -> None:
    """The user's bucket lives in .dvc/config.local, which no pod's checkout has (git ignores it, the image
    leaves it out): the flow forwards the remote it resolves and checkout.sh writes it where the job runs,
    so the job's push lands in the user's bucket, not the committed one."""
    from components.ops.config import StorageConfig
    from components.storage import remote_forwarding

    result = CliRunner().invoke(app, ["storage", "init", "s3://user-bucket/store"])
    assert result.exit_code == 0, (result.output, result.exception)
    (repo / ".dvc" / "config.local").write_text(
        (repo / ".dvc" / "config.local").read_text() + "    access_key_id = never-forwarded\n"
    )
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "project"], repo)
    forwarded = remote_forwarding(StorageConfig(remote="s3"), repo)
    assert forwarded == {"NPR_DVC_REMOTE": "s3", "NPR_DVC_REMOTE_URL": "s3://user-bucket/store"}
    create_bucket("npr-pipeline-dvc")  # the committed default exists too: a pod using it would "work"

    pod_repo = tmp_path / "pod-image"  # the image's copy: the commit, without config.local
    run(["git", "clone", "-q", str(repo), str(pod_repo)], tmp_path)
    assert not (pod_repo / ".dvc" / "config.local").exists()
    env = {"NPR_REPO_DIR": str(pod_repo), "NPR_CHECKOUT_ROOT": str(tmp_path / "checkouts"), **forwarded}
    workdir = Path(run(["bash", str(CHECKOUT_SH)], tmp_path, env=env).stdout.strip())
    assert workdir == pod_repo
    run([str(VENV_BIN / "dvc"), "repro", "-q"], workdir, env={"NPR_TEST_RUN_LOG": str(tmp_path / "runs.log")})
    run([str(VENV_BIN / "dvc"), "push", "-q"], workdir)
    assert list_keys("user-bucket") and list_keys("npr-pipeline-dvc") == []
    assert "never-forwarded" not in (workdir / ".dvc" / "config.local").read_text()

    # a job for a later commit gets its own checkout: the remote is written there too
    (repo / "note.txt").write_text("later\n")
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "later"], repo)
    later = run(["git", "rev-parse", "HEAD"], repo).stdout.strip()
    env = {**env, "NPR_GIT_COMMIT": later, "NPR_GIT_REMOTE": str(repo)}
    checkout = Path(run(["bash", str(CHECKOUT_SH)], tmp_path, env=env).stdout.strip())
    assert checkout == tmp_path / "checkouts" / later
    url = run([str(VENV_BIN / "dvc"), "config", "remote.s3.url"], checkout).stdout.strip()
    default = run([str(VENV_BIN / "dvc"), "config", "core.remote"], checkout).stdout.strip()
    assert (url, default) == ("s3://user-bucket/store", "s3")


def test_a_forwarded_url_without_its_remote_name_is_refused(tmp_path: Path) -> None:
    image = make_dvc_project(tmp_path / "image")
    env = {"NPR_REPO_DIR": str(image), "NPR_DVC_REMOTE_URL": "s3://user-bucket/store"}
    proc = subprocess.run(
        ["bash", str(CHECKOUT_SH)], cwd=tmp_path, env={**os.environ, **env}, capture_output=True, text=True
    )
    assert proc.returncode == 2 and "without NPR_DVC_REMOTE" in proc.stderr


def test_the_k8s_server_pulls_the_checkpoint_named_by_its_md5(repo: Path, tmp_path: Path) -> None:
    """infra/k8s/sglang-server.yaml's init container, run as written: a .dvc file of NPR_SERVE_MD5 (the
    pipeline's dvc.lock entry) pulled from the S3 remote, whatever dvc.lock the image holds."""
    import yaml

    result = CliRunner().invoke(app, ["storage", "init", "s3://serve-bucket/store"])
    assert result.exit_code == 0, (result.output, result.exception)
    run([str(VENV_BIN / "dvc"), "repro", "-q"], repo, env={"NPR_TEST_RUN_LOG": str(tmp_path / "runs.log")})
    run([str(VENV_BIN / "dvc"), "push", "-q"], repo)
    lock = yaml.safe_load((repo / "dvc.lock").read_text())
    md5 = next(o["md5"] for o in lock["stages"]["train"]["outs"] if o["path"] == "artifacts/train/model")
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "project"], repo)
    image = tmp_path / "image"  # the image's checkout: another dvc.lock, no cache, no outputs
    run(["git", "clone", "-q", str(repo), str(image)], tmp_path)
    (image / ".dvc" / "config.local").write_text((repo / ".dvc" / "config.local").read_text())
    (image / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    manifest = next(yaml.safe_load_all((CHECKOUT_SH.parents[2] / "infra/k8s/sglang-server.yaml").read_text()))
    init = manifest["spec"]["template"]["spec"]["initContainers"][0]
    (image / init["volumeMounts"][0]["mountPath"].removeprefix("/opt/npr/")).mkdir(parents=True)
    run(init["command"], image, env={"NPR_SERVE_MD5": md5})
    assert (image / "artifacts/served/model/weights.bin").read_bytes() == (
        repo / "artifacts/train/model/weights.bin"
    ).read_bytes()
    missing = subprocess.run(init["command"], cwd=image, env={**os.environ, "NPR_SERVE_MD5": ""})
    assert missing.returncode != 0  # no md5 given: the pod fails instead of serving nothing
