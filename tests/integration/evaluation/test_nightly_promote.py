"""`npr nightly promote` and `npr nightly run` in a workspace of their own, on real checkpoints.

The committed tiny seed (`models/tiny-instruct`, which answers about half of the synthetic problems) is the
promoted checkpoint; a random-init model of the test world is the degraded one. 10 problems x 1 sample:
each evaluation is one short decode. The nightly runs under a temporary Prefect API (the real flow).
"""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
import yaml
from typer.testing import CliRunner

from components.artifacts import write_shards
from components.cli import app

REPO = Path(__file__).resolve().parents[3]
N_PROBLEMS = 10
FAST = [
    "evaluate.benchmarks=[{name: tiny_test, n_samples: 1, k: 1, max_problems: 10}]",
    "nightly.benchmarks=[tiny_test]",
    "grading.workers=1",
    "run.torch_threads=1",
    "tracking.mode=disabled",
    # the seed answers outside the schema most of the time: the floors are the parallel checkpoints' matter
    "nightly.format_valid_floor=0.0",
    "nightly.parallel_rate_floor=0.0",
]

pytestmark = [pytest.mark.slow, pytest.mark.integration]


class Receiver:
    """An HTTP receiver on 127.0.0.1 that keeps the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        bodies = self.bodies

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - http.server's name
                bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self.send_response(200)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}/hooks/secret"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.fixture(scope="module")
def workspace(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A checkout's config files, a DVC repository, the held-out problems, and the promoted seed."""
    import subprocess
    import sys

    from prefect.testing.utilities import prefect_test_harness

    from components.data.synthetic import generate_problems

    mp = pytest.MonkeyPatch()
    ws = tmp_path_factory.mktemp("nightly_ws")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, ws / name)
    for name in ("configs", "prompts"):
        shutil.copytree(REPO / name, ws / name)
    dvc = Path(sys.executable).with_name("dvc")
    subprocess.run([str(dvc), "init", "--no-scm", "-q"], cwd=ws, check=True)
    problems = [dict(p, split="test") for p in generate_problems(N_PROBLEMS, 11, None)]
    write_shards(ws / "artifacts" / "sample_orz" / "problems", problems, 1, stem="test")
    shutil.copytree(REPO / "models" / "tiny-instruct", ws / "artifacts" / "seed" / "model")
    receiver = Receiver()
    import flows.nightly as nightly
    from components.config import load_config

    mp.chdir(ws)
    mp.setenv("WANDB_DIR", str(ws))
    mp.setenv("NPR_ALERT_WEBHOOK", receiver.url)
    mp.setattr(nightly, "load_config", lambda profile: load_config(profile=profile, overrides=FAST))
    with prefect_test_harness(server_startup_timeout=120):
        promoted = CliRunner().invoke(
            app, ["nightly", "promote", "artifacts/seed/model", "--profile", "tiny"]
        )
        assert promoted.exit_code == 0, (promoted.output, promoted.exception)
        yield {"ws": ws, "receiver": receiver, "promote_output": promoted.output}
    mp.undo()
    receiver.server.shutdown()


def _invoke(*args: str) -> Any:
    return CliRunner().invoke(app, list(args))


def test_promote_writes_a_dvc_tracked_baseline_of_this_checkpoint(workspace: dict[str, Any]) -> None:
    from components.evaluation.runner import checkpoint_hash

    ws = workspace["ws"]
    baseline = yaml.safe_load((ws / "baselines" / "tiny-seed.yaml").read_text())
    assert baseline["checkpoint_hash"] == checkpoint_hash(ws / "artifacts" / "seed" / "model")
    assert baseline["checkpoint_path"] == "artifacts/seed/model"
    assert set(baseline["grader_version"]) == {"math-verify", "settings"}
    assert baseline["benchmarks"]["tiny_test"]["n_problems"] == N_PROBLEMS
    assert baseline["benchmarks"]["tiny_test"]["metrics"]["accuracy"] >= 0.3  # a checkpoint worth gating
    assert (ws / "baselines" / "tiny-seed.yaml.dvc").exists()  # DVC-tracked: commit the .dvc file
    assert "tracked by baselines/tiny-seed.yaml.dvc" in workspace["promote_output"]


def test_the_nightly_of_the_promoted_checkpoint_passes(workspace: dict[str, Any]) -> None:
    result = _invoke("nightly", "run", "--profile", "tiny", "--checkpoint", "seed")
    assert result.exit_code == 0, (result.output, result.exception)
    assert "nightly gate: PASS" in result.output
    state = json.loads((workspace["ws"] / "artifacts" / "nightly" / "last_green.json").read_text())
    assert state["verdict"] == "pass"


def test_a_grading_regression_fails_the_night_and_alerts(
    workspace: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Same checkpoint, same settings, a grader that has broken (every answer judged wrong)."""
    import dataclasses

    import components.evaluation.runner as runner

    real = runner.judge_many

    def broken(*args: Any, **kwargs: Any) -> Any:
        return [dataclasses.replace(j, correct=False) for j in real(*args, **kwargs)]

    # the evaluation's grader, as the runner calls it (imported at its module top)
    monkeypatch.setattr(runner, "judge_many", broken)
    before = len(workspace["receiver"].bodies)
    result = _invoke("nightly", "run", "--profile", "tiny", "--checkpoint", "seed")
    assert result.exit_code == 1, (result.output, result.exception)
    line = result.stderr.strip().splitlines()[-1]
    assert "nightly gate FAILED: regression: tiny_test/accuracy" in line and "alerts.jsonl" in line
    assert "webhook: sent (HTTP 200)" in line
    alert = json.loads(
        (workspace["ws"] / "artifacts" / "nightly" / "alerts.jsonl").read_text().splitlines()[-1]
    )
    assert alert["verdict"] == "fail" and alert["checkpoint"] == "seed"
    (posted,) = workspace["receiver"].bodies[before:]
    assert posted["verdict"] == "fail" and "tiny_test/accuracy" in posted["text"]


def test_a_degraded_candidate_is_not_promoted_and_alerts(workspace: dict[str, Any]) -> None:
    from components.models.loading import save_model
    from components.models.tiny import tiny_test_world

    ws = workspace["ws"]
    model, tokenizer = tiny_test_world(seed=3)
    save_model(model, tokenizer, ws / "candidates" / "seed" / "model")
    before = (ws / "baselines" / "tiny-seed.yaml").read_text()
    result = _invoke("nightly", "promote", "candidates/seed/model", "--profile", "tiny")
    assert result.exit_code == 1, (result.output, result.exception)
    line = result.stderr.strip().splitlines()[-1]  # after the evaluation's progress lines
    assert (
        line.startswith("error: not promoted: candidates/seed/model regresses")
        and "tiny_test/accuracy" in line
    )
    assert "--force" in line and "alerts.jsonl" in line
    assert (ws / "baselines" / "tiny-seed.yaml").read_text() == before  # the promoted baseline stays
    assert workspace["receiver"].bodies[-1]["checkpoint"] == "candidates/seed/model"


def test_a_baseline_of_another_checkpoint_is_refused_not_a_regression(workspace: dict[str, Any]) -> None:
    """The fresh clone's case: artifacts/seed/model is not the checkpoint the baseline was promoted from."""
    from components.models.loading import save_model
    from components.models.tiny import tiny_test_world

    ws = workspace["ws"]
    alerts_file = ws / "artifacts" / "nightly" / "alerts.jsonl"
    alerts = alerts_file.read_text() if alerts_file.exists() else None
    shutil.rmtree(ws / "artifacts" / "seed" / "model")
    # another checkpoint of its own (not the earlier test's candidate: xdist need not keep the file's order)
    save_model(*tiny_test_world(seed=3), ws / "artifacts" / "seed" / "model")
    result = _invoke("nightly", "run", "--profile", "tiny", "--checkpoint", "seed")
    assert result.exit_code == 2, (result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # refused before anything was evaluated
    line = lines[0]
    assert "nightly gate refused" in line and "not a regression" in line
    assert "npr nightly promote artifacts/seed/model" in line
    assert (alerts_file.read_text() if alerts_file.exists() else None) == alerts  # no alert: no verdict
