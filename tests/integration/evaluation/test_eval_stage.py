"""The evaluate stage end to end on real tiny models (random-init, saved as checkpoints) and a few problems.

Runs the real path: model loading, prompt rendering, the engine in both modes, grading, structure metrics,
records, report, PNG plots, plot data and metrics.json; then `npr eval`'s function and a baseline from the
run. Numbers of a random model are meaningless; what is pinned is that every number agrees with the records.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from components.artifacts import read_json, read_shards, write_shards
from components.config import load_config
from components.dag import StageIO
from components.evaluation.gate import gate_checkpoint, load_baseline, write_baseline
from components.evaluation.metrics import per_problem_accuracy

REPO = Path(__file__).resolve().parents[3]
N_PROBLEMS, N_SAMPLES = 3, 2


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    import torch

    from components.data.synthetic import generate_problems
    from components.models.loading import save_model
    from components.models.tiny import TEST_WORLD_ARCH, build_tiny_model, tiny_test_world

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("evalworld")
    cwd = os.getcwd()
    wandb_dir = os.environ.get("WANDB_DIR")
    os.environ["WANDB_DIR"] = str(root)  # the stage logs to W&B offline; keep its files out of the repo
    os.chdir(REPO)  # prompt files and dvc.yaml are read relative to the repository root
    try:
        model, tokenizer = tiny_test_world(seed=0)
        save_model(model, tokenizer, root / "seed" / "model")
        # Different weights, same tokenizer (training a second tokenizer would only cost time).
        save_model(
            build_tiny_model(TEST_WORLD_ARCH, tokenizer, seed=1), tokenizer, root / "papo_rl" / "model"
        )
        problems = [dict(p, split="test") for p in generate_problems(N_PROBLEMS, 7, None)]
        write_shards(root / "sample_orz" / "problems", problems, 1, stem="test")
        cfg = load_config(
            profile="tiny",
            overrides=[
                "evaluate.checkpoints=[seed, papo_rl]",
                "evaluate.parallel_checkpoints=[papo_rl]",
                f"evaluate.benchmarks=[{{name: tiny_test, n_samples: {N_SAMPLES}, k: 2, max_problems: 5}}]",
                "evaluate.generation.max_new_tokens=24",
                "evaluate.generation.batch_size=8",
                "grading.workers=1",
                "run.torch_threads=1",
            ],
        )
        io = StageIO(
            stage="evaluate",
            inputs={
                "seed/model": root / "seed" / "model",
                "papo_rl/model": root / "papo_rl" / "model",
                "sample_orz/problems": root / "sample_orz" / "problems",
            },
            outputs={"records": root / "evaluate" / "records", "report": root / "evaluate" / "report"},
            metrics=root / "evaluate" / "metrics.json",
            summary=root / "metrics" / "evaluate",
            plots=root / "plots" / "evaluate",
        )
        from components.stages import run_stage

        metrics = run_stage("evaluate", cfg, io)
        yield {"root": root, "cfg": cfg, "io": io, "metrics": metrics}
    finally:
        os.chdir(cwd)
        if wandb_dir is None:
            os.environ.pop("WANDB_DIR", None)
        else:
            os.environ["WANDB_DIR"] = wandb_dir


pytestmark = pytest.mark.slow


def test_metrics_json_has_every_checkpoint_and_provenance(world: dict[str, Any]) -> None:
    saved = read_json(world["io"].metrics)
    assert saved["provenance"]["stage"] == "evaluate"
    ckpts = saved["checkpoints"]
    assert {n: c["mode"] for n, c in ckpts.items()} == {"seed": "sequential", "papo_rl": "parallel"}
    assert ckpts["seed"]["checkpoint_hash"] != ckpts["papo_rl"]["checkpoint_hash"]
    bench = ckpts["papo_rl"]["benchmarks"]["tiny_test"]
    assert (bench["n_problems"], bench["n_samples"], bench["k"]) == (N_PROBLEMS, N_SAMPLES, 2)
    # Only the parallel checkpoint gets the speedup decode (both modes on the same prompts).
    assert "speedup" in ckpts["papo_rl"] and "speedup" not in ckpts["seed"]
    assert ckpts["papo_rl"]["speedup"]["n_problems"] == N_PROBLEMS
    # The recipe table compares the two checkpoints on the held-out problems, paired.
    assert [r["checkpoint"] for r in saved["recipe"]["rows"]] == ["seed", "papo_rl"]
    assert [c["claim"] for c in saved["recipe"]["claims"]] == ["NPR ≥ seed (instruct)"]
    assert saved["settings"]["sampling"]["max_new_tokens"] == 24
    # the merge the checkpoints were trained in and decoded with, pinned and reported (never mixed)
    assert saved["settings"]["sampling"]["merge_semantics"] == "isolated"
    assert saved["settings"]["merge"] == {"semantics": "isolated", "mode": "shared_kv", "exact": True}
    assert saved["n_records"] == 2 * N_PROBLEMS * N_SAMPLES
    # Logged to W&B (offline), the run id kept in the stage's work dir beside its outputs.
    assert (world["root"] / "evaluate" / "work" / "wandb_run_id").read_text().strip()


def m_of(name: str, world: dict[str, Any]) -> float:
    return world["metrics"]["checkpoints"][name]["benchmarks"]["tiny_test"]["accuracy"]


def test_every_number_agrees_with_the_records(world: dict[str, Any]) -> None:
    records_dir = world["io"].output("records")
    for name, ckpt in world["metrics"]["checkpoints"].items():
        records = read_shards(records_dir / name, stem="tiny_test")
        m = ckpt["benchmarks"]["tiny_test"]
        assert len(records) == N_PROBLEMS * N_SAMPLES
        assert {r["mode"] for r in records} == {ckpt["mode"]}
        assert {(r["merge_semantics"], r["merge_mode"]) for r in records} == {("isolated", "shared_kv")}
        acc = per_problem_accuracy(records)
        assert m["accuracy"] == pytest.approx(sum(acc) / len(acc))
        assert m["total_tokens"] == sum(r["n_tokens"] for r in records)
        assert all(0 < r["n_tokens"] <= 24 for r in records)
        assert m["format_valid_rate"] == pytest.approx(sum(r["valid"] for r in records) / len(records))
        assert m["tokens_per_s"] == pytest.approx(m["total_tokens"] / m["wall_s"])
    seq = read_shards(records_dir / "papo_rl", stem="speedup.sequential")
    assert {r["mode"] for r in seq} == {"sequential"} and len(seq) == N_PROBLEMS
    ckpt = world["metrics"]["checkpoints"]["papo_rl"]
    sp, tp = ckpt["speedup"], ckpt["throughput"]
    assert sp["achieved_speedup"] == pytest.approx(
        sp["parallel_tokens_per_s"] / sp["sequential_tokens_per_s"]
    )
    assert sp["sequential_tokens"] == sum(r["n_tokens"] for r in seq)
    assert tp["achieved_speedup"] == sp["achieved_speedup"] and tp["speedup_efficiency"] == sp["efficiency"]
    # the recipe table is computed from the same records: NPR - seed is the difference of their accuracies
    recipe = world["metrics"]["recipe"]
    assert recipe["benchmark"] == "tiny_test" and [r["checkpoint"] for r in recipe["rows"]] == [
        "seed",
        "papo_rl",
    ]
    (claim,) = [c for c in recipe["claims"] if c["a"] == "papo_rl" and c["b"] == "seed"]
    diff = m_of("papo_rl", world) - m_of("seed", world)
    assert claim["difference"] == pytest.approx(diff) and claim["interval"][0] <= diff <= claim["interval"][1]


def test_report_plots_and_plot_data_render(world: dict[str, Any]) -> None:
    report_dir = world["io"].output("report")
    text = (report_dir / "report.md").read_text()
    assert "## Accuracy" in text and "## Throughput" in text and "## Recipe" in text
    assert "| NPR ≥ seed (instruct) |" in text
    assert "| checkpoint | mode | tiny_test (avg@2) | average |" in text
    assert "Merge: semantics isolated, decoded with shared_kv (exact:" in text
    # the accuracy and detail tables (after the recipe table): one row per checkpoint each
    tables = text.split("## Accuracy")[1]
    assert tables.count("| seed | sequential |") == 2 and tables.count("| papo_rl | parallel |") == 2
    assert "## Recipe (the paper's comparison)" in text.split("## Accuracy")[0]
    for png in ("accuracy.png", "speedup.png"):
        assert (report_dir / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"]({png})" in text
    plots = world["io"].plots
    acc_rows = json.loads((plots / "accuracy.json").read_text())
    assert [r["checkpoint"] for r in acc_rows] == ["seed", "papo_rl"]
    speed_rows = json.loads((plots / "speedup.json").read_text())
    assert [r["checkpoint"] for r in speed_rows] == ["papo_rl"] and speed_rows[0]["achieved_speedup"] > 0


def test_flat_metrics_have_one_row_per_checkpoint(world: dict[str, Any]) -> None:
    """What `dvc metrics show` reads: metrics/evaluate/<checkpoint>.json, flat, the same keys per row."""
    rows = {p.stem: read_json(p) for p in sorted(world["io"].summary.glob("*.json"))}
    assert set(rows) == {"seed", "papo_rl"}
    for name, row in rows.items():
        ckpt = world["metrics"]["checkpoints"][name]
        assert row["accuracy"] == pytest.approx(ckpt["average_accuracy"], abs=1e-6)
        assert row["benchmark"] == {"tiny_test": pytest.approx(ckpt["benchmarks"]["tiny_test"]["accuracy"])}
        assert "provenance" not in row and "settings" not in row
    tp = world["metrics"]["checkpoints"]["papo_rl"]["throughput"]
    assert rows["papo_rl"]["speedup"] == pytest.approx(tp["achieved_speedup"], abs=1e-6)
    assert "speedup" not in rows["seed"]  # only parallel checkpoints are re-decoded sequentially


def test_adhoc_eval_uses_the_same_code(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from components.evaluation import adhoc

    monkeypatch.chdir(REPO)
    # The held-out problems come from the evaluate stage's declared input; point it at this world's copy.
    monkeypatch.setattr(adhoc, "stage_io", lambda stage: world["io"])
    cfg = world["cfg"].model_copy(deep=True)
    cfg.evaluate.measure_speedup = False
    out = adhoc.evaluate_checkpoint(
        cfg, world["root"] / "seed" / "model", ["tiny_test"], k=1, mode="sequential", out_dir=tmp_path
    )
    assert list(out["checkpoints"]) == ["seed"]
    bench = out["checkpoints"]["seed"]["benchmarks"]["tiny_test"]
    assert (bench["n_samples"], bench["k"]) == (1, 1)
    assert Path(out["report"]).exists() and (tmp_path / "metrics.json").exists()
    with pytest.raises(ValueError, match="mode"):
        adhoc.evaluate_checkpoint(cfg, world["root"] / "seed" / "model", ["tiny_test"], 1, "both", tmp_path)


def test_baseline_from_a_real_run_gates_itself_green(world: dict[str, Any], tmp_path: Path) -> None:
    cfg = world["cfg"]
    path = write_baseline(world["metrics"], cfg, tmp_path / "tiny-papo_rl.yaml", command="pytest").tag
    baseline = load_baseline(tmp_path / f"{path}.yaml")
    # A random model has no valid format: floors at 0 so only the statistical gates speak.
    nightly = cfg.nightly.model_copy(update={"format_valid_floor": 0.0, "parallel_rate_floor": 0.0})
    result = gate_checkpoint(
        world["metrics"]["checkpoints"]["papo_rl"], world["metrics"]["settings"], baseline, nightly
    )
    assert result.verdict == "pass", result.to_dict()


@pytest.mark.integration
def test_nightly_flow_runs_under_prefect_and_fails_on_a_regression(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The real flow (tasks, states) on a temporary Prefect API: green against its own baseline, then Failed
    when a hard floor is raised above what the checkpoint does."""
    from prefect.testing.utilities import prefect_test_harness

    import flows.nightly as nightly
    from components.evaluation import adhoc

    monkeypatch.chdir(REPO)
    base = world["cfg"].model_copy(deep=True)
    base.tracking.mode = "disabled"
    base.nightly.baseline_dir = str(tmp_path / "baselines")
    base.nightly.state_file = str(tmp_path / "state.json")
    base.nightly.report_dir = str(tmp_path / "nightly")
    base.nightly.alert_file = str(tmp_path / "nightly" / "alerts.jsonl")
    base.nightly.format_valid_floor = 0.0
    base.nightly.parallel_rate_floor = 0.0
    write_baseline(world["metrics"], base, tmp_path / "baselines" / "tiny-papo_rl.yaml")
    strict = base.model_copy(deep=True)
    strict.nightly.format_valid_floor = 1.0
    configs = iter([base, strict])
    monkeypatch.setattr(nightly, "load_config", lambda profile: next(configs))
    monkeypatch.setattr(nightly, "stage_io", lambda stage: world["io"])
    monkeypatch.setattr(adhoc, "stage_io", lambda stage: world["io"])  # evaluate_into finds the problems
    ckpt = str(world["root"] / "papo_rl" / "model")
    with prefect_test_harness(server_startup_timeout=120):
        green = nightly.nightly_eval(profile="tiny", checkpoint=ckpt, return_state=True)
        assert green.is_completed(), green.message
        assert green.result()["verdict"] == "pass"
        assert read_json(tmp_path / "state.json")["verdict"] == "pass"
        red = nightly.nightly_eval(profile="tiny", checkpoint=ckpt, return_state=True)
    assert red.is_failed() and "format_valid_rate" in red.message
    assert read_json(tmp_path / "nightly" / "gate.json")["verdict"] == "fail"
    (alert,) = (tmp_path / "nightly" / "alerts.jsonl").read_text().splitlines()  # offline: the alert file
    assert "format_valid_rate" in alert


def test_served_evaluation_starts_a_server_per_checkpoint_and_keeps_finished_ones(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU profile's path with the stand-in SGLang server: a fresh server per checkpoint (parallel ones
    decoded through the SGLang backend's fork/merge controller), and a failure on the second checkpoint
    loses nothing of the first."""
    import sys

    import yaml

    from components.engine.backends.sglang_client import SGLangError
    from components.evaluation.job import eval_job
    from components.evaluation.runner import CheckpointSpec, evaluate_checkpoints

    spec = tmp_path / "server.yaml"
    spec.write_text(
        yaml.safe_dump(
            {"python": sys.executable, "module": "tests.support.sglang_standin", "model_path": "-", "port": 1,
             "tp_size": 1, "context_length": 512}
        )
    )  # fmt: skip
    cfg = world["cfg"]
    served = cfg.evaluate.generation.model_copy(
        update={"backend": "sglang", "merge_mode": "reprefill", "server_spec": str(spec)}
    )
    cfg = cfg.model_copy(update={"evaluate": cfg.evaluate.model_copy(update={"generation": served})})
    job = eval_job(cfg)
    io, root = world["io"], world["root"]
    ckpts = [
        CheckpointSpec("seed", io.input("seed/model"), "sequential"),
        CheckpointSpec("papo_rl", io.input("papo_rl/model"), "parallel"),
    ]
    work = tmp_path / "work"
    requests = tmp_path / "requests.jsonl"
    monkeypatch.setenv("SGLANG_STANDIN_REQUEST_LOG", str(requests))
    # each server counts its own requests: seed's 6 pass, papo_rl's 7th (its speedup decode) fails
    monkeypatch.setenv("SGLANG_STANDIN_FAULT", f"http500@{N_PROBLEMS * N_SAMPLES + 1}")
    with pytest.raises(SGLangError, match="HTTP 500"):
        evaluate_checkpoints(job, ckpts, cfg.evaluate.benchmarks, root / "sample_orz" / "problems", work)
    assert (work / "checkpoints" / "seed" / "metrics.json").is_file()
    assert not (work / "checkpoints" / "papo_rl").exists()
    monkeypatch.delenv("SGLANG_STANDIN_FAULT")
    result = evaluate_checkpoints(job, ckpts, cfg.evaluate.benchmarks, root / "sample_orz" / "problems", work)
    assert len(list((work / "server-logs").glob("*.log"))) == 3  # seed once, papo_rl twice; none reused
    assert set(result.metrics["checkpoints"]) == {"seed", "papo_rl"}
    bench = result.metrics["checkpoints"]["papo_rl"]["benchmarks"]["tiny_test"]
    assert (
        bench["tokens_per_s"] > 0
        and result.metrics["checkpoints"]["papo_rl"]["speedup"]["achieved_speedup"] > 0
    )
    assert len(result.records["seed"]["tiny_test"]) == N_PROBLEMS * N_SAMPLES
    # the parallel checkpoint's requests stop at </guideline> (the fork trigger); the sequential ones don't
    import json as _json

    from components.models.loading import load_tokenizer

    trigger = load_tokenizer(io.input("papo_rl/model")).convert_tokens_to_ids("</guideline>")
    stops = [
        _json.loads(line)["sampling_params"]["stop_token_ids"] for line in requests.read_text().splitlines()
    ]
    assert any(trigger in s for s in stops) and any(trigger not in s for s in stops)
