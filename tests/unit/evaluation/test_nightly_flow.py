"""The nightly flow's logic via ``nightly_eval.fn`` on canned evaluation results (no Prefect server).

Only the evaluation step is replaced by canned results (it needs a trained checkpoint); the gate, the diff
table, publishing and the last-green state run for real.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

import flows.nightly as nightly
from components.artifacts import read_json
from components.config import load_config
from components.evaluation.gate import GateRefused, gate_checkpoint, load_baseline, write_baseline
from components.evaluation.runner import EvalResult, checkpoint_hash
from tests.unit.evaluation.conftest import SETTINGS


class CannedEvaluation:
    """Stands in for the evaluate task: returns queued canned results and counts calls."""

    def __init__(self) -> None:
        self.queue: list[dict[str, Any]] = []
        self.calls = 0

    def fn(self, cfg: Any, checkpoint: Any, out_dir: Path) -> EvalResult:
        self.calls += 1
        assert checkpoint.name == "papo_rl" and checkpoint.mode == "parallel"
        return EvalResult(metrics=self.queue.pop(0))


@pytest.fixture()
def setup(tmp_path: Path, in_repo: Path, monkeypatch: pytest.MonkeyPatch, make_eval: Any) -> dict[str, Any]:
    cfg = load_config(
        profile="tiny",
        overrides=[
            f"nightly.baseline_dir={tmp_path / 'baselines'}",
            f"nightly.state_file={tmp_path / 'state' / 'last_green.json'}",
            f"nightly.report_dir={tmp_path / 'nightly'}",
            f"nightly.alert_file={tmp_path / 'nightly' / 'alerts.jsonl'}",
            "tracking.mode=disabled",  # W&B offline costs seconds per run; one test below uses it
        ],
    )
    monkeypatch.setenv("WANDB_DIR", str(tmp_path))
    monkeypatch.delenv("NPR_ALERT_WEBHOOK", raising=False)
    monkeypatch.setattr(nightly, "load_config", lambda profile: cfg)
    canned = CannedEvaluation()
    monkeypatch.setattr(nightly, "evaluate_promoted", canned)
    checkpoint = tmp_path / "papo_rl" / "model"
    checkpoint.mkdir(parents=True)
    (checkpoint / "model.safetensors").write_bytes(b"weights")
    digest = checkpoint_hash(checkpoint)
    # canned evaluations of this checkpoint with this profile's settings (what the real runner records)
    _, settings = nightly.planned_evaluation(cfg, nightly.resolve_checkpoint(cfg, str(checkpoint)), digest)

    def ev(accuracy: float = 0.60, **kw: Any) -> dict[str, Any]:
        kw.setdefault("settings", {**settings, "engine_version": SETTINGS["engine_version"]})
        return make_eval(accuracy, checkpoint_hash=kw.pop("checkpoint_hash", digest), n_samples=2, k=2, **kw)

    write_baseline(ev(0.60), cfg, Path(cfg.nightly.baseline_dir) / "tiny-papo_rl.yaml", command="pytest")
    return {"cfg": cfg, "canned": canned, "checkpoint": str(checkpoint), "tmp": tmp_path, "ev": ev}


def test_green_night_completes_writes_the_diff_and_becomes_last_green(setup: dict, make_eval: Any) -> None:
    setup["canned"].queue.append(setup["ev"](0.61))
    summary = nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert summary["verdict"] == "pass" and summary["failures"] == []
    assert summary["published"] is False and summary["alerted"] is False  # no flow run, W&B offline
    gate_md = Path(summary["diff_table"]).read_text()
    assert "| tiny_test | accuracy | baseline | 0.6000 | 0.6100 | +0.0100 |" in gate_md
    state = read_json(setup["cfg"].nightly.state_file)
    assert state["checkpoint"]["benchmarks"]["tiny_test"]["accuracy"] == 0.61


def test_regression_ends_failed_and_keeps_the_last_green(setup: dict, make_eval: Any) -> None:
    setup["canned"].queue += [setup["ev"](0.61), setup["ev"](0.45)]
    nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    state = nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert state.is_failed()
    assert "tiny_test/accuracy" in state.message
    gate = read_json(Path(setup["cfg"].nightly.report_dir) / "gate.json")
    assert gate["verdict"] == "fail"
    # The failed night did not replace the drift reference.
    last = read_json(setup["cfg"].nightly.state_file)["checkpoint"]["benchmarks"]["tiny_test"]
    assert last["accuracy"] == 0.61


def test_a_failed_night_alerts_through_the_webhook_and_the_alert_file(
    setup: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    received: list[dict] = []

    class Receiver(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - http.server's name
            received.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
            self.send_response(204)
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("NPR_ALERT_WEBHOOK", f"http://127.0.0.1:{server.server_port}/hook")
    try:
        setup["canned"].queue.append(setup["ev"](0.45))
        state = nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    finally:
        server.shutdown()
    assert state.is_failed()
    summary = state.data
    assert summary["webhook"] == "sent (HTTP 204)"
    (posted,) = received
    assert posted["verdict"] == "fail" and posted["checkpoint"] == "papo_rl"
    assert "tiny_test/accuracy" in posted["text"] and posted["diff_table"].endswith("gate.md")
    (line,) = Path(summary["alert_file"]).read_text().splitlines()
    assert json.loads(line)["failures"] == posted["failures"]


def test_an_unreachable_webhook_is_recorded_and_the_night_still_fails(
    setup: dict, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NPR_ALERT_WEBHOOK", "http://127.0.0.1:9/hook")  # nothing listens on port 9
    setup["canned"].queue.append(setup["ev"](0.45))
    state = nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert state.is_failed() and state.data["webhook"].startswith("failed: ")
    assert "failed: " in Path(state.data["alert_file"]).read_text()


def test_a_green_night_alerts_no_one(setup: dict) -> None:
    setup["canned"].queue.append(setup["ev"](0.61))
    nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert not Path(setup["cfg"].nightly.alert_file).exists()


def test_format_collapse_fails_the_night(setup: dict, make_eval: Any) -> None:
    setup["canned"].queue.append(setup["ev"](0.61, format_valid_rate=0.2))
    state = nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert state.is_failed() and "format_valid_rate" in state.message


def test_drift_from_last_green_warns_and_compares_with_both(setup: dict, make_eval: Any) -> None:
    setup["canned"].queue += [setup["ev"](0.80), setup["ev"](0.62)]
    assert nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])["verdict"] == "pass"
    summary = nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert summary["verdict"] == "warn"
    assert sorted(w.split(":")[0] for w in summary["warnings"]) == ["tiny_test/accuracy", "tiny_test/pass@k"]
    assert all("drift" in w for w in summary["warnings"])
    gate_md = Path(summary["diff_table"]).read_text()
    assert "| last_green | 0.8000 | 0.6200 |" in gate_md and "| baseline | 0.6000 | 0.6200 |" in gate_md


def test_missing_baseline_fails_before_evaluating(setup: dict) -> None:
    with pytest.raises(FileNotFoundError, match="npr nightly promote"):
        nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"], baseline="no-such-tag")
    assert setup["canned"].calls == 0


def test_a_baseline_of_another_checkpoint_is_refused_before_evaluating(setup: dict) -> None:
    """The fresh clone's case: the workspace's checkpoint was retrained since the baseline was promoted."""
    Path(setup["checkpoint"], "model.safetensors").write_bytes(b"retrained weights")
    with pytest.raises(GateRefused) as err:
        nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    message = str(err.value)
    assert "baseline of checkpoint" in message and "not a regression" in message
    assert f"npr nightly promote {setup['checkpoint']}" in message
    assert setup["canned"].calls == 0
    assert not (Path(setup["cfg"].nightly.report_dir) / "gate.json").exists()


def test_other_settings_are_refused_before_evaluating(setup: dict) -> None:
    setup["cfg"].evaluate.generation.merge_mode = "reprefill"
    with pytest.raises(GateRefused, match="sampling.merge_mode shared_kv in the baseline, reprefill now"):
        nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    setup["cfg"].evaluate.generation.merge_mode = "shared_kv"
    setup["cfg"].evaluate.benchmarks[0].k = 1
    with pytest.raises(GateRefused, match="tiny_test.k 2 in the baseline, 1 now"):
        nightly.nightly_eval.fn(profile="tiny", checkpoint=setup["checkpoint"])
    assert setup["canned"].calls == 0


def test_baseline_resolution_and_benchmark_selection(setup: dict) -> None:
    cfg = setup["cfg"]
    base_dir = Path(cfg.nightly.baseline_dir)
    assert nightly.resolve_baseline(cfg, "papo_rl", None) == base_dir / "tiny-papo_rl.yaml"
    assert nightly.resolve_baseline(cfg, "papo_rl", "v2") == base_dir / "v2.yaml"
    assert nightly.resolve_baseline(cfg, "papo_rl", "x/y.yaml") == Path("x/y.yaml")
    assert [b.name for b in nightly.nightly_benchmarks(cfg)] == ["tiny_test"]  # the tiny profile's subset
    picked = cfg.model_copy(deep=True)
    picked.nightly.benchmarks = None
    assert [b.name for b in nightly.nightly_benchmarks(picked)] == [b.name for b in cfg.evaluate.benchmarks]
    picked.nightly.benchmarks = ["nope"]
    with pytest.raises(ValueError, match="nope"):
        nightly.nightly_benchmarks(picked)


def test_a_failed_night_is_logged_to_wandb_offline_without_alerting(setup: dict, make_eval: Any) -> None:
    cfg = setup["cfg"]
    cfg.tracking.mode = "offline"
    result = EvalResult(metrics=setup["ev"](0.45))
    baseline = load_baseline(Path(cfg.nightly.baseline_dir) / "tiny-papo_rl.yaml")
    gate = gate_checkpoint(
        result.metrics["checkpoints"]["papo_rl"], result.metrics["settings"], baseline, cfg.nightly
    )
    out_dir = Path(cfg.nightly.report_dir)
    outcome = nightly.publish_outcome.fn(cfg, result, gate, "table", out_dir, "papo_rl")
    # run.alert needs W&B online; offline the night is still recorded as a run (id kept in the work dir).
    assert outcome == {"published": False, "alerted": False}
    assert (out_dir / "work" / "wandb_run_id").read_text().strip()
    assert read_json(out_dir / "gate.json")["verdict"] == "fail"


def test_entrypoint_signature_and_schedule_match_the_config(in_repo: Path) -> None:
    assert list(nightly.nightly_eval.parameters.properties) == ["profile", "checkpoint", "baseline"]
    assert nightly.nightly_eval.name == "nightly-eval"
    deployments_file = Path("prefect.yaml")
    if not deployments_file.exists():
        pytest.skip("prefect.yaml (ops) is not in this checkout yet")
    deployments = {d["name"]: d for d in yaml.safe_load(deployments_file.read_text())["deployments"]}
    deployment = deployments["nightly-eval"]
    assert deployment["entrypoint"] == "flows/nightly.py:nightly_eval"
    cfg = load_config(profile=deployment.get("parameters", {}).get("profile", "tiny"))
    schedule = deployment["schedules"][0]
    assert (schedule["cron"], schedule.get("timezone", "UTC")) == (cfg.nightly.cron, cfg.nightly.timezone)
