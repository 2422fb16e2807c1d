"""A real local Prefect server: work pools, the deployments of prefect.yaml, a cpu worker, one pipeline run.

The run goes through the API exactly as the UI's "Run" button does, on a temporary copy of the repository
(its own git, DVC, params.yaml, data/ and local DVC remote), selecting the fastest real stage.
"""

from __future__ import annotations

import os
import socket
import time
from pathlib import Path

import pytest
from ops_testing import VENV_BIN, copy_checkout, run

from components.ops.prefect_ops import (
    api_url,
    launch_server,
    launch_worker,
    load_orchestration,
    register_all,
    stop_process_group,
    wait_healthy,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _group_alive(pid: int, grace_s: float = 5.0) -> bool:
    """Whether any process of the group exists after ``grace_s`` (killed orphans take a moment to be reaped)."""
    deadline = time.monotonic() + grace_s
    while True:
        try:
            os.killpg(pid, 0)
        except ProcessLookupError:
            return False
        if time.monotonic() > deadline:
            return True
        time.sleep(0.1)


def test_server_deployments_worker_and_a_pipeline_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from components.fingerprint import stage_fingerprint

    started = time.monotonic()
    root = copy_checkout(tmp_path / "repo")
    # what `make run` does on a clean clone: raw data, then params.yaml from the profile
    run([str(VENV_BIN / "npr"), "data", "fetch"], root)
    run([str(VENV_BIN / "npr"), "config", "use", "tiny"], root)
    timings = {"copy+fetch": time.monotonic() - started}
    for key, value in {
        "PREFECT_HOME": str(tmp_path / "prefect_home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "NPR_PIPELINE_RUN_ID": "ops-prefect-test",
    }.items():
        monkeypatch.setenv(key, value)
    cfg = load_orchestration(root)
    url = api_url("127.0.0.1", _free_port())
    server = launch_server("127.0.0.1", int(url.rsplit(":", 1)[1].split("/")[0]), log=tmp_path / "server.log")
    worker = None
    try:
        timings["server healthy"] = wait_healthy(url, 150, server)
        mark = time.monotonic()
        assert register_all(cfg, url, root) == {"cpu": "created", "gpu": "created"}
        timings["pools+deployments"] = time.monotonic() - mark
        mark = time.monotonic()
        worker = launch_worker("cpu", url, root, log=tmp_path / "worker.log")
        with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
            deployments = {f"{d.name}": d for d in client.read_deployments()}
            assert set(deployments) == {"npr-pipeline", "npr-stage", "nightly-eval"}
            assert deployments["npr-stage"].work_pool_name == "gpu"
            assert deployments["nightly-eval"].work_pool_name == "cpu"  # tiny: orchestration.nightly_pool
            (schedule,) = deployments["nightly-eval"].schedules
            assert (schedule.schedule.cron, schedule.schedule.timezone) == ("0 3 * * *", "UTC")
            form = deployments["npr-pipeline"].parameter_openapi_schema["properties"]
            assert {"profile", "stages", "overrides"} <= set(form)

            flow_run = client.create_flow_run_from_deployment(
                deployments["npr-pipeline"].id, parameters={"profile": "tiny", "stages": ["sample_orz"]}
            )
            deadline = time.monotonic() + 240
            while time.monotonic() < deadline:
                flow_run = client.read_flow_run(flow_run.id)
                if flow_run.state and flow_run.state.type.value in FINAL:
                    break
                time.sleep(2)
            timings["flow run"] = time.monotonic() - mark
            print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
            logs = (tmp_path / "worker.log").read_text(errors="replace")[-4000:]
            assert flow_run.state is not None and flow_run.state.type.value == "COMPLETED", logs
            task_runs = client.read_task_runs(
                flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id]))
            )
    finally:
        if worker is not None:
            stop_process_group(worker)  # workers first: one whose server is gone ignores SIGTERM
        stop_process_group(server)

    stage_runs = [t for t in task_runs if t.name.startswith("stage-")]
    # task run names are "<task name>-<short suffix>"; the task is named stage-<stage>
    assert [t.name.rsplit("-", 1)[0] for t in stage_runs] == ["stage-sample_orz"]
    monkeypatch.chdir(root)
    from components.config import load_config
    from components.dag import load_stages

    expected_version = stage_fingerprint(load_stages()["sample_orz"], load_config())
    assert stage_runs[0].task_version == expected_version
    assert (root / "artifacts/sample_orz/problems").is_dir()
    assert any((root / "dvc-remote" / "files" / "md5").rglob("*.dir"))  # pushed to the local remote
    for proc in (worker, server):
        assert not _group_alive(proc.pid), f"process group {proc.pid} still running"
