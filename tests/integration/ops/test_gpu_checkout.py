"""A gpu-pool job runs the commit that launched the pipeline, not the one in its image: the npr-stage
deployment's own pull steps (prefect.yaml, run by Prefect's step runner) check the commit out, the flow
runs there, and `npr stage` subprocesses import that checkout's code (flows/stage.py's PYTHONPATH)."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = [pytest.mark.integration]
ROOT = Path(__file__).resolve().parents[3]


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
        check=True,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


@pytest.fixture
def baked_and_launched(tmp_path) -> tuple[Path, Path, str, str]:
    """A remote with two commits; the "image" holds the first, the pipeline launched the second."""
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(ROOT), str(remote)], check=True)
    work = tmp_path / "dev"
    subprocess.run(["git", "clone", "-q", str(remote), str(work)], check=True)
    baked = _git(work, "rev-parse", "HEAD")
    (work / "components" / "launched_marker.py").write_text("WHICH = 'launched'\n")
    _git(work, "add", "-A")
    _git(work, "commit", "-qm", "the commit the pipeline runs")
    _git(work, "push", "-q", "origin", "HEAD")
    launched = _git(work, "rev-parse", "HEAD")
    image = tmp_path / "opt-npr"
    subprocess.run(["git", "clone", "-q", str(remote), str(image)], check=True)
    _git(image, "checkout", "-q", "--detach", baked)
    return remote, image, baked, launched


def _npr_stage_pull_steps() -> list[dict]:
    spec = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    deployment = next(d for d in spec["deployments"] if d["name"] == "npr-stage")
    return deployment["pull"]


def test_the_pull_steps_check_out_the_launching_commit(baked_and_launched, tmp_path, monkeypatch):
    from prefect.deployments.steps.core import run_steps

    remote, image, baked, launched = baked_and_launched
    monkeypatch.chdir(tmp_path)
    for key, value in {
        "NPR_REPO_DIR": str(image),
        "NPR_GIT_COMMIT": launched,
        "NPR_GIT_REMOTE": str(remote),
        "NPR_CHECKOUT_ROOT": str(tmp_path / "checkouts"),
    }.items():
        monkeypatch.setenv(key, value)
    asyncio.run(run_steps(_npr_stage_pull_steps(), {}))
    here = Path.cwd()
    assert here == (tmp_path / "checkouts" / launched).resolve()
    assert _git(here, "rev-parse", "HEAD") == launched
    assert (here / "components" / "launched_marker.py").exists()
    assert not (image / "components" / "launched_marker.py").exists()  # the image's copy is untouched
    # what a stage subprocess imports: this checkout's code, not the image's (nor this test's repo)
    from flows.stage import stage_env

    probe = "import components.launched_marker as m, components; print(m.WHICH, components.__file__)"
    out = subprocess.run(
        [sys.executable, "-c", probe], env=stage_env(), capture_output=True, text=True, check=True
    )
    which, path = out.stdout.split()
    assert which == "launched" and Path(path).resolve().is_relative_to(here)


def test_without_a_commit_the_image_code_runs_and_a_missing_commit_is_an_error(
    baked_and_launched, tmp_path, monkeypatch
):
    _, image, baked, launched = baked_and_launched
    script = ROOT / "infra" / "gpu" / "checkout.sh"
    env = {**os.environ, "NPR_REPO_DIR": str(image), "NPR_CHECKOUT_ROOT": str(tmp_path / "c")}
    env.pop("NPR_GIT_COMMIT", None)
    env.pop("NPR_GIT_REMOTE", None)
    assert subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True
    ).stdout.strip() == str(image)
    env["NPR_GIT_COMMIT"] = baked  # the image already holds it
    assert subprocess.run(
        ["bash", str(script)], env=env, capture_output=True, text=True
    ).stdout.strip() == str(image)
    env["NPR_GIT_COMMIT"] = "0" * 40  # neither here nor fetchable: a clear error, no silent fallback
    failed = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True)
    assert failed.returncode == 2 and "NPR_GIT_REMOTE is not set" in failed.stderr


def test_a_retried_job_finds_the_work_of_the_pod_that_died(baked_and_launched, tmp_path):
    """The GPU image checks every job out under NPR_CHECKOUT_ROOT (NPR_CHECKOUT_PERSISTENT=1), which on
    Kubernetes is the work volume: a second pod for the same commit (the pipeline's retry after the first
    died) gets the same directory, with the stage's checkpoints in artifacts/<stage>/work, even when the
    image itself holds that commit."""
    _, image, baked, _ = baked_and_launched
    script = ROOT / "infra" / "gpu" / "checkout.sh"
    volume = tmp_path / "volume"  # what survives a pod; the pod's own /tmp does not
    env = {
        **os.environ,
        "NPR_REPO_DIR": str(image),
        "NPR_GIT_COMMIT": baked,  # the image already holds it: without the flag the image's copy would run
        "NPR_CHECKOUT_ROOT": str(volume / "checkouts"),
        "NPR_CHECKOUT_PERSISTENT": "1",
    }
    env.pop("NPR_GIT_REMOTE", None)
    first = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    run_dir = Path(first.stdout.strip())
    assert run_dir == volume / "checkouts" / baked
    checkpoint = run_dir / "artifacts" / "papo_rl" / "work" / "global_step_1" / "state.pt"
    checkpoint.parent.mkdir(parents=True)
    checkpoint.write_bytes(b"step 1")
    retry = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    assert Path(retry.stdout.strip()) == run_dir and checkpoint.read_bytes() == b"step 1"
    env.pop("NPR_CHECKOUT_PERSISTENT")  # a local worker: the image's (here: its own) copy serves
    local = subprocess.run(["bash", str(script)], env=env, capture_output=True, text=True, check=True)
    assert Path(local.stdout.strip()) == image


def test_the_image_checks_out_on_the_volume_the_pool_template_mounts():
    dockerfile = (ROOT / "infra" / "gpu" / "Dockerfile").read_text()
    root = re.search(r"NPR_CHECKOUT_ROOT=(\S+)", dockerfile)
    assert root and "NPR_CHECKOUT_PERSISTENT=1" in dockerfile
    template = json.loads((ROOT / "infra" / "k8s" / "gpu-pool-template.json").read_text())
    pod = template["job_configuration"]["job_manifest"]["spec"]["template"]["spec"]
    mounts = {m["name"]: m["mountPath"] for m in pod["containers"][0]["volumeMounts"]}
    claim = next(v for v in pod["volumes"] if v["name"] == "work")["persistentVolumeClaim"]["claimName"]
    assert Path(root.group(1)).is_relative_to(mounts["work"])
    volume = yaml.safe_load((ROOT / "infra" / "k8s" / "work-volume.yaml").read_text())
    assert claim == "{{ work_claim }}"
    assert template["variables"]["properties"]["work_claim"]["default"] == volume["metadata"]["name"]
    assert "ReadWriteMany" in volume["spec"]["accessModes"]
