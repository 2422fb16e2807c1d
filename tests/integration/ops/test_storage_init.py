"""`npr storage init s3://bucket/prefix` against a real S3-protocol server (moto): the bucket, the DVC remote
in .dvc/config.local, a probe object; then a plain `dvc push` lands under the prefix."""

from __future__ import annotations

import configparser
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
