"""The pipeline's gpu-pool path: each stage's job asks for the GPUs its own settings use and carries the
launching commit, this machine's params.yaml and dvc.lock entries; the result is restored here from the
DVC run-cache, and a restore never runs the stage here."""

from __future__ import annotations

import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

import flows.pipeline as pipeline
from components.cli import app
from components.config import load_config


@pytest.mark.parametrize(
    ("stage", "gpus"),
    [("papo_rl", 8), ("npr_zero", 8), ("parallel_warmup", 8), ("distill", 8), ("evaluate", 8), ("pr1_coldstart", 8), ("pr1_rl", 8), ("seed", 0)],
)
def test_each_gpu_stage_asks_for_the_gpus_its_settings_use(stage, gpus, in_repo, monkeypatch):
    monkeypatch.setattr(pipeline, "launching_commit", lambda: {"NPR_GIT_COMMIT": "abc"})
    variables = pipeline.gpu_job_variables(stage, load_config(profile="qwen3-4b"), "run-1")
    assert variables["gpu_count"] == gpus
    env = variables["env"]
    assert {k: env[k] for k in ("NPR_PIPELINE_RUN_ID", "NPR_GIT_COMMIT")} == {
        "NPR_PIPELINE_RUN_ID": "run-1",
        "NPR_GIT_COMMIT": "abc",
    }
    # the remote this checkout resolves travels with the job (the user's bucket is in config.local)
    assert env["NPR_DVC_REMOTE"] == "s3" and env["NPR_DVC_REMOTE_URL"].startswith("s3://")


def test_a_verl_stage_on_a_running_ray_cluster_asks_for_no_gpu(in_repo, monkeypatch):
    monkeypatch.setattr(pipeline, "launching_commit", dict)
    cfg = load_config(
        profile="qwen3-4b",
        overrides=["papo_rl.verl.ray_address=http://head:8265", "papo_rl.verl.shared_dir=/fsx"],
    )
    assert pipeline.gpu_job_variables("papo_rl", cfg, "r")["gpu_count"] == 0


def test_dispatch_sends_params_and_lock_and_restores_from_the_run_cache(in_repo, monkeypatch):
    calls = {}

    def run_deployment(name, parameters, job_variables, timeout):
        calls.update(name=name, parameters=parameters, job_variables=job_variables, timeout=timeout)
        return SimpleNamespace(state=SimpleNamespace(is_completed=lambda: True))

    monkeypatch.setattr("prefect.deployments.run_deployment", run_deployment)
    monkeypatch.setattr(
        pipeline, "restore_from_run_cache", lambda stage, timeout_s: calls.setdefault("restored", stage)
    )
    monkeypatch.setattr(pipeline, "launching_commit", lambda: {"NPR_GIT_COMMIT": "c0ffee"})
    monkeypatch.setattr(pipeline, "load_config", lambda *a, **k: load_config(profile="qwen3-4b"))
    pipeline._run_stage("evaluate", "qwen3-4b", True, "run-9", None)
    assert calls["restored"] == "evaluate"
    params = calls["parameters"]
    assert params["stage"] == "evaluate" and params["params_yaml"] == Path("params.yaml").read_text()
    assert "evaluate" not in params["upstream_lock"] and "papo_rl" in params["upstream_lock"]
    assert calls["job_variables"]["gpu_count"] == 8  # its SGLang server: TP 1 x DP 8
    assert calls["job_variables"]["env"]["NPR_GIT_COMMIT"] == "c0ffee"


def test_the_launching_commit_is_head_and_uncommitted_code_is_refused(tmp_path):
    repo = tmp_path / "repo"
    git = lambda *a: subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True)  # noqa: E731
    repo.mkdir()
    git("init", "-q")
    (repo / "code.py").write_text("x = 1\n")
    (repo / "params.yaml").write_text("a: 1\n")
    git("add", "-A")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "one")
    head = git("rev-parse", "HEAD").stdout.strip()
    assert pipeline.launching_commit(repo) == {"NPR_GIT_COMMIT": head}
    (repo / "params.yaml").write_text("a: 2\n")  # travels as a flow parameter: allowed
    assert pipeline.launching_commit(repo)["NPR_GIT_COMMIT"] == head
    (repo / "code.py").write_text("x = 2\n")
    with pytest.raises(RuntimeError, match=r"uncommitted changes to \['code.py'\]"):
        pipeline.launching_commit(repo)


def test_npr_stage_refuses_to_run_while_restoring(in_repo, monkeypatch):
    monkeypatch.setenv("NPR_RESTORE_ONLY", "1")
    result = CliRunner().invoke(app, ["stage", "papo_rl"])
    assert result.exit_code == 2
    assert "run-cache" in result.output


def test_lock_entries_round_trip_into_another_dvc_lock(tmp_path):
    from flows.stage import adopt_lock_entries, lock_entries

    (tmp_path / "dvc.lock").write_text(
        "schema: '2.0'\nstages:\n  a:\n    cmd: x\n    outs:\n    - path: artifacts/a/out\n      md5: 1.dir\n  b:\n    cmd: y\n"
    )
    entries = lock_entries(exclude="b", root=tmp_path)
    assert list(entries) == ["a"]
    other = tmp_path / "other"
    other.mkdir()
    (other / "dvc.lock").write_text("schema: '2.0'\nstages:\n  c:\n    cmd: z\n")
    adopt_lock_entries(entries, root=other)
    import yaml

    merged = yaml.safe_load((other / "dvc.lock").read_text())
    assert set(merged["stages"]) == {"a", "c"} and merged["stages"]["a"]["outs"][0]["md5"] == "1.dir"
