"""A real local Prefect server: work pools, the deployments of prefect.yaml, a cpu worker, one pipeline run.

The run goes through the API exactly as the UI's "Run" button does, on a temporary copy of the repository
(its own git, DVC, params.yaml, data/ and local DVC remote), selecting the fastest real stage.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import pytest
import yaml
from ops_testing import REPO, VENV_BIN, copy_checkout, free_port, group_alive, run

from components.config import load_orchestration
from components.ops.prefect_ops import (
    api_url,
    launch_server,
    launch_worker,
    register_all,
    stop_process_group,
    wait_healthy,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]

FINAL = {"COMPLETED", "FAILED", "CRASHED", "CANCELLED"}


EVAL_BENCH = {
    "n_problems": 3, "n_samples": 2, "k": 2, "accuracy": 0.5, "pass@k": 0.6667, "format_valid_rate": 0.9,
    "parallel_rate": 0.8, "parallel_rate_any": 0.9, "mean_branches_per_block": 2.0, "mean_tokens": 40.0,
    "truncation_rate": 0.0,
}  # fmt: skip
EVAL_METRICS = {
    "settings": {"sampling": {"temperature": 1.0}, "prompt_hash": "abc", "engine_version": {"torch": "2.13.0"}},
    "checkpoints": {
        name: {
            "mode": mode, "benchmarks": {"tiny_test": {**EVAL_BENCH, "accuracy": acc}}, "average_accuracy": acc,
            "throughput": {"tokens_per_s": 900.0, "ideal_speedup": 1.9, "mean_tokens": 40.0,
                           **({"achieved_speedup": 1.61, "sequential_tokens_per_s": 560.0} if mode == "parallel" else {})},
        }
        for name, mode, acc in (("seed", "sequential", 0.125), ("papo_rl", "parallel", 0.375))
    },
    "wall_time_s": 12.5,
    "provenance": {"stage": "evaluate", "profile": "tiny"},
}  # fmt: skip


def _enum(schema: dict, prop: dict) -> list:
    """The choices of one form field (a Literal, possibly inside list[...] | None or a $ref)."""
    if "enum" in prop:
        return prop["enum"]
    if "$ref" in prop:
        return _enum(schema, schema["definitions"][prop["$ref"].rsplit("/", 1)[-1]])
    for key in ("items", "anyOf", "allOf"):
        for sub in [prop[key]] if isinstance(prop.get(key), dict) else prop.get(key, []):
            if found := _enum(schema, sub):
                return found
    return []


def _wait(client, flow_run, timeout_s: float = 240):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        flow_run = client.read_flow_run(flow_run.id)
        if flow_run.state and flow_run.state.type.value in FINAL:
            break
        time.sleep(2)
    return flow_run


def _stage_runs(client, flow_run) -> list:
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])))
    return [t for t in runs if t.name.startswith("stage-")]


def _artifacts(client, flow_run) -> dict[str, str]:
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterFlowRunId

    found = client.read_artifacts(
        artifact_filter=ArtifactFilter(flow_run_id=ArtifactFilterFlowRunId(any_=[flow_run.id]))
    )
    return {a.key: a.data for a in found if a.key}


def test_server_deployments_worker_and_a_pipeline_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from components.fingerprint import stage_fingerprint

    started = time.monotonic()
    root = copy_checkout(tmp_path / "repo")
    # what `make run` does on a clean clone: raw data, then params.yaml from the profile
    run([str(VENV_BIN / "npr"), "data", "fetch"], root)
    run(
        [
            str(VENV_BIN / "npr"),
            "config",
            "use",
            "tiny",
            "--set",
            "sample_orz.synthetic_pool=3000",
            "--set",
            "sample_orz.n=1000",
            "--set",
            "sample_orz.test_n=100",
            "--set",
            "sample_orz.val_n=50",
        ],
        root,
    )
    timings = {"copy+fetch": time.monotonic() - started}
    for key, value in {
        "PREFECT_HOME": str(tmp_path / "prefect_home"),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "DO_NOT_TRACK": "1",
        "NPR_PIPELINE_RUN_ID": "ops-prefect-test",
    }.items():
        monkeypatch.setenv(key, value)
    cfg = load_orchestration(root)
    url = api_url("127.0.0.1", free_port())
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
            pipeline = deployments["npr-pipeline"]
            schema = pipeline.parameter_openapi_schema
            form = schema["properties"]
            assert {"profile", "stages", "overrides"} <= set(form)
            # the run form's choices come from configs/ and dvc.yaml
            assert sorted(_enum(schema, form["profile"])) == sorted(
                p.stem for p in (root / "configs").glob("*.yaml")
            )
            assert _enum(schema, form["stages"]) == list(
                yaml.safe_load((root / "dvc.yaml").read_text())["stages"]
            )
            assert "<" not in form["profile"].get("description", "")  # no markup the UI would swallow
            assert pipeline.enforce_parameter_schema
            # a wrong value is refused at submission, not discovered by a failing run
            for bad in ({"profile": "tiny2"}, {"profile": "tiny", "stages": ["sample-orz"]}):
                with pytest.raises(Exception, match="(?i)valid"):
                    client.create_flow_run_from_deployment(pipeline.id, parameters=bad)

            runs = []
            for _ in range(2):  # the second run finds the stage up to date
                flow_run = client.create_flow_run_from_deployment(
                    pipeline.id, parameters={"profile": "tiny", "stages": ["sample_orz"]}
                )
                runs.append(_wait(client, flow_run))
                logs = (tmp_path / "worker.log").read_text(errors="replace")[-4000:]
                assert runs[-1].state is not None and runs[-1].state.type.value == "COMPLETED", logs
            timings["two flow runs"] = time.monotonic() - mark
            stage_runs = [_stage_runs(client, r) for r in runs]
            artifacts = [_artifacts(client, r) for r in runs]

            # an evaluation's artifacts, published inside a flow run on this server
            mark = time.monotonic()
            report_dir = tmp_path / "evalroot" / "artifacts" / "evaluate" / "report"
            _write_report(report_dir)
            eval_run_id = _publish_evaluation(url, tmp_path / "evalroot")
            eval_artifacts = {
                a.key: a.data for a in client.read_artifacts() if str(a.flow_run_id) == eval_run_id
            }
            timings["evaluation artifacts"] = time.monotonic() - mark
            print("timings (s):", {k: round(v, 1) for k, v in timings.items()})
    finally:
        if worker is not None:
            stop_process_group(worker)  # workers first: one whose server is gone ignores SIGTERM
        stop_process_group(server)

    # task run names are "<task name>-<short suffix>"; the task is named stage-<stage>
    assert [t.name.rsplit("-", 1)[0] for t in stage_runs[0]] == ["stage-sample_orz"]
    # whether the stage ran or DVC found it up to date is the task's state name
    assert [r[0].state.name for r in stage_runs] == ["Ran", "Up to date"]
    monkeypatch.chdir(root)
    from components.config import load_config
    from components.dag import load_stages

    expected_version = stage_fingerprint(load_stages()["sample_orz"], load_config())
    assert stage_runs[0][0].task_version == expected_version
    assert (root / "artifacts/sample_orz/problems").is_dir()
    assert any((root / "dvc-remote" / "files" / "md5").rglob("*.dir"))  # pushed to the local remote
    # W&B lineage in this default setup (local remote, offline): the outputs the flow pushed are reference
    # artifacts of the stage's run, logged after the push into the same run
    from wandb_records import by_type, read_records, run_files

    run_id = (root / "artifacts/sample_orz/work/wandb_run_id").read_text().strip()
    logged = {a.name: a for seg in run_files(root, run_id) for a in by_type(read_records(seg), "artifact")}
    assert {"sample_orz-problems", "sample_orz-audit"} <= set(logged), sorted(logged)
    (ref,) = logged["sample_orz-problems"].manifest.contents
    assert ref.ref.startswith("file://") and Path(ref.ref.removeprefix("file://")).exists()
    # the artifact carries the stage's real numbers, and says how the task went
    flat = json.loads((root / "metrics/sample_orz.json").read_text())
    first, second = artifacts[0]["sample-orz-metrics"], artifacts[1]["sample-orz-metrics"]
    assert f"| n_train | {flat['n_train']} |" in first and f"| rows_in | {flat['rows_in']} |" in first
    assert "ran in" in first and "up to date" in second
    # the stage's progress lines became a progress artifact of its task: finished at 100 %
    assert float(artifacts[0]["sample-orz-progress"]) == 100.0
    assert "quarantine_reasons" not in first or "| quarantine_reasons/" in first  # nested -> flattened
    # the evaluation's tables and the report's plots, embedded (a Prefect artifact cannot link files)
    metrics = eval_artifacts["evaluate-metrics"]
    assert "| papo_rl | parallel | 37.5 | 37.5 |" in metrics  # Table 2: accuracy per benchmark, average
    assert "1.61" in metrics and "| papo_rl/speedup | 1.61 |" in metrics
    report = eval_artifacts["evaluate-report"]
    assert report.count("](data:image/png;base64,") == 2 and "](accuracy.png)" not in report
    for proc in (worker, server):
        assert not group_alive(proc.pid), f"process group {proc.pid} still running"


def _write_report(report_dir: Path) -> None:
    from components.evaluation.plots import render_pngs
    from components.evaluation.report import render_report

    images = render_pngs(EVAL_METRICS, report_dir)
    text = render_report(EVAL_METRICS, "Evaluation", [p.name for p in images.values()])
    (report_dir / "report.md").write_text(text)


PUBLISH = """
import json, sys
from prefect import flow
from prefect.runtime import flow_run
from flows.pipeline import _publish

metrics = json.load(open(sys.argv[1]))


@flow(name="publish-evaluation-test")
def publish() -> str:
    _publish("evaluate", "test-version", metrics, "ran", 13.0)
    return str(flow_run.get_id())


print("FLOW_RUN", publish())
"""


def _publish_evaluation(url: str, cwd: Path) -> str:
    """Publish an evaluation's artifacts from a flow run on the server at ``url``, in a process of its own:
    a flow run in this process would leave Prefect's event and log workers bound to a server the test
    then stops (the next Prefect test of the process hung in its teardown)."""
    (cwd / "metrics.json").write_text(json.dumps(EVAL_METRICS))
    env = {
        **os.environ,
        "PREFECT_API_URL": url,
        "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]),
    }
    out = run([sys.executable, "-c", PUBLISH, str(cwd / "metrics.json")], cwd, env=env).stdout
    return out.rsplit("FLOW_RUN ", 1)[1].split()[0]
