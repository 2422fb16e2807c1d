"""A verl stage placed on a running Ray cluster (``verl.ray_address``), with real processes on CPU: the flow
submits it as a Ray job (infra/ray/job.yaml) to a token-authenticated head, the job reproduces the stage
with DVC in the uploaded checkout and pushes its outputs and run-cache from there, with W&B and S3 settings
in its runtime env; the submitting machine then restores the outputs from the run-cache without running
the stage itself."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from components.config import load_config
from components.training.verl import ray_cluster

# xdist_group("ray"): the test files that start Ray clusters run on one worker (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("ray")]
ROOT = Path(__file__).resolve().parents[3]

# The stage's command: refuses to run anywhere but inside the submitted job (and never during a restore),
# and records what it saw there.
STAGE_CMD = (
    'python -c "import json, os, pathlib, sys; '
    "sys.exit(3) if os.environ.get('NPR_RESTORE_ONLY') else None; "
    "sys.exit(4) if not os.environ.get('NPR_RAY_INSIDE_JOB') else None; "
    "out = pathlib.Path('artifacts/papo_rl/model'); out.mkdir(parents=True, exist_ok=True); "
    "keys = ('WANDB_API_KEY', 'AWS_ACCESS_KEY_ID', 'NPR_PIPELINE_RUN_ID', 'RAY_AUTH_MODE'); "
    "(out / 'seen.json').write_text(json.dumps({k: os.environ.get(k) for k in keys} | {'cwd': os.getcwd()})); "
    "(out / 'weights.txt').write_text(pathlib.Path('inputs/init.txt').read_text() + ' trained')\""
)


@pytest.fixture
def stage_repo(tmp_path: Path) -> tuple[Path, Path]:
    """A git+DVC checkout with one stage named like the RL stage, a DVC remote named as the job spec pushes."""
    repo, remote = tmp_path / "repo", tmp_path / "remote"
    repo.mkdir()
    (repo / "inputs").mkdir()
    (repo / "inputs" / "init.txt").write_text("init")
    (repo / "infra" / "ray").mkdir(parents=True)
    shutil.copy(ROOT / "infra" / "ray" / "job.yaml", repo / "infra" / "ray" / "job.yaml")
    (repo / "dvc.yaml").write_text(
        "stages:\n  papo_rl:\n"
        f"    cmd: {json.dumps(STAGE_CMD)}\n"
        "    deps: [inputs/init.txt]\n    outs: [artifacts/papo_rl/model]\n"
    )

    def run(*cmd: str) -> None:
        subprocess.run(cmd, cwd=repo, check=True, capture_output=True)

    run("git", "init", "-q")
    run("dvc", "init", "-q")
    run("dvc", "remote", "add", "-q", "-d", "s3", str(remote))  # the job spec pushes to the remote named s3
    run("git", "add", "-A")
    run("git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "stage")
    return repo, remote


def test_a_stage_on_a_running_cluster_runs_there_and_is_restored_here(stage_repo, monkeypatch, in_repo):
    from flows.stage import execute_stage

    repo, remote = stage_repo
    token = secrets.token_hex(16)
    monkeypatch.setenv("RAY_AUTH_TOKEN", token)
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    monkeypatch.setenv("WANDB_API_KEY", "wandb-key")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "s3-key")
    monkeypatch.delenv("NPR_RAY_INSIDE_JOB", raising=False)
    with ray_cluster.RayHead.start("127.0.0.1", num_gpus=0, num_cpus=1) as head:  # "the cluster"
        cfg = load_config(
            profile="qwen3-4b",
            overrides=[f"papo_rl.verl.ray_address={head.dashboard_url}", "papo_rl.verl.shared_dir=/shared"],
        )
        monkeypatch.chdir(repo)
        execute_stage("papo_rl", cfg, pipeline_run_id="run-7")
    out = repo / "artifacts" / "papo_rl" / "model"
    assert (out / "weights.txt").read_text() == "init trained"  # restored here from the run-cache
    seen = json.loads((out / "seen.json").read_text())
    assert seen["WANDB_API_KEY"] == "wandb-key" and seen["AWS_ACCESS_KEY_ID"] == "s3-key"
    assert seen["NPR_PIPELINE_RUN_ID"] == "run-7"
    assert seen["RAY_AUTH_MODE"] != "disabled"
    assert Path(seen["cwd"]).resolve() != repo.resolve()  # it ran in the job's copy of the checkout
    lock = (repo / "dvc.lock").read_text()
    assert "papo_rl" in lock and "artifacts/papo_rl/model" in lock
    assert any(remote.rglob("*"))  # pushed from the cluster
    assert not list(
        (repo / "artifacts" / "papo_rl" / "work").glob("ray-runtime-env-*")
    )  # secrets file removed


def test_a_heads_workers_run_at_its_priority(monkeypatch):
    """Ray runs workers at nice 15 unless told otherwise (raylet's worker_niceness); verl's actors are Ray
    workers, so a stage's training would get almost no CPU beside any other busy process (another lane of
    the pipeline, the other pytest worker). A head the stage starts runs them at its own priority."""
    monkeypatch.delenv("RAY_worker_niceness", raising=False)  # the suite's default (tests/conftest.py) aside
    code = (
        "import os, ray; ray.init(address=os.environ['RAY_ADDRESS'], log_to_driver=False); "
        "print(ray.get(ray.remote(lambda: os.nice(0)).remote()))"
    )
    with ray_cluster.RayHead.start("127.0.0.1", num_gpus=0, num_cpus=1, dashboard=False) as head:
        env = {**head.env, "RAY_ADDRESS": head.address}
        out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert int(out.stdout.split()[-1]) == os.nice(0)
