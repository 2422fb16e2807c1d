"""The seed spread (issue 27): aggregation over hand-made runs, the committed file, the report's sentence."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from components.evaluation.config import EvaluateConfig
from components.evaluation.recipe import Recipe, recipe_markdown
from components.evaluation.report import render_report
from components.evaluation.spread import (
    SeedSpreadError,
    SpreadRun,
    aggregate,
    committed_spread,
    load_seed_spread,
    read_committed_spread,
    spread_markdown,
    spread_path,
    write_seed_spread,
)

RECIPE = Recipe.of(EvaluateConfig())  # the paper's comparison as every profile states it

SAMPLING = {"temperature": 1.0, "top_p": 1.0, "seed": 0}


def _committed(path: str | None, n_problems: int = 200, n_samples: int = 2) -> dict[str, Any]:
    """What the evaluate stage sets into the recipe summary for ``path`` and a run on tiny_test."""
    return committed_spread(path, read_committed_spread(path), "tiny_test", n_problems, n_samples)


def _bench(accuracy: float, valid: float = 0.9, parallel: float = 0.0, ideal: float = 1.0) -> dict[str, Any]:
    return {
        "n_problems": 200,
        "n_samples": 2,
        "k": 2,
        "accuracy": accuracy,
        "pass@k": accuracy,
        "format_valid_rate": valid,
        "parallel_rate": parallel,
        "ideal_speedup": ideal,
    }


def _run(
    seed_acc: float, npr_acc: float, achieved: float | None, sr_acc: float | None = 0.45
) -> dict[str, Any]:
    """One run's metrics.json: checkpoints in the runner's order (not the paper's), a smoke benchmark too."""
    ckpts: dict[str, Any] = {}
    if sr_acc is not None:
        ckpts["sr_rl"] = {"mode": "sequential", "benchmarks": {"tiny_test": _bench(sr_acc, 0.99)}}
    ckpts["papo_rl"] = {
        "mode": "parallel",
        "benchmarks": {"tiny_test": _bench(npr_acc, 0.98, 0.99, 2.1), "aime24": _bench(0.0)},
        **({"speedup": {"achieved_speedup": achieved}} if achieved is not None else {}),
    }
    ckpts["seed"] = {"mode": "sequential", "benchmarks": {"tiny_test": _bench(seed_acc, 0.3, 0.28, 1.2)}}
    return {"settings": {"sampling": dict(SAMPLING)}, "checkpoints": ckpts}


def _three() -> list[dict[str, Any]]:
    return [
        _run(0.475, 0.405, 2.08),
        _run(0.475, 0.46, 1.9, sr_acc=None),
        _run(0.475, 0.43, 2.0, sr_acc=0.52),
    ]


def test_aggregate_pins_each_value_mean_and_spread_in_recipe_order() -> None:
    runs = [SpreadRun(source=f"w/seed-{i}", offset=i, make_run_minutes=20.0 + i) for i in range(3)]
    spread = aggregate(_three(), "tiny_test", RECIPE, runs)
    assert list(spread.checkpoints) == ["seed", "papo_rl", "sr_rl"]  # the recipe table's order
    assert (spread.benchmark, spread.n_problems, spread.n_samples) == ("tiny_test", 200, 2)
    npr = spread.checkpoints["papo_rl"]
    assert npr.paper_name == "NPR"
    acc = npr.metrics["accuracy"]
    assert acc.values == [0.405, 0.46, 0.43]
    assert acc.mean == pytest.approx(0.431666666667)
    assert acc.spread == pytest.approx(0.055)
    assert npr.metrics["achieved_speedup"].mean == pytest.approx(1.9933333333)
    assert npr.metrics["achieved_speedup"].spread == pytest.approx(0.18)
    assert npr.metrics["ideal_speedup"].spread == 0.0
    # the same seed model in every run: no spread at all
    assert spread.checkpoints["seed"].metrics["accuracy"].spread == 0.0
    # a run without a checkpoint: None there, the mean over the runs that have it
    sr = spread.checkpoints["sr_rl"].metrics["accuracy"]
    assert sr.values == [0.45, None, 0.52]
    assert sr.mean == pytest.approx(0.485) and sr.spread == pytest.approx(0.07)
    # a sequential checkpoint has no speedup decode
    assert spread.checkpoints["seed"].metrics["achieved_speedup"].mean is None


def test_markdown_lists_every_run_and_metric() -> None:
    runs = [SpreadRun(source=f"w/seed-{i}", offset=i, make_run_minutes=20.0 + i) for i in range(3)]
    md = spread_markdown(aggregate(_three(), "tiny_test", RECIPE, runs))
    assert "| NPR | papo_rl | 40.5 | 46.0 | 43.0 | 43.2 | 5.5 |" in md
    assert "| NPR | papo_rl | 2.08 | 1.90 | 2.00 | 1.99 | 0.18 |" in md
    assert "| SR | sr_rl | 45.0 | – | 52.0 | 48.5 | 7.0 |" in md
    assert "| 2 | w/seed-2 | 2 | – | 22.0 |" in md
    for title in ("avg@2", "format-valid", "parallel rate", "ideal speedup", "achieved speedup"):
        assert f"### {title}" in md


def test_runs_that_measured_different_things_are_refused() -> None:
    other_size = _three()
    other_size[1]["checkpoints"]["papo_rl"]["benchmarks"]["tiny_test"]["n_samples"] = 4
    with pytest.raises(SeedSpreadError, match="different sizes"):
        aggregate(other_size, "tiny_test", RECIPE)
    smaller = _three()
    for ckpt in smaller[2]["checkpoints"].values():
        ckpt["benchmarks"]["tiny_test"]["n_problems"] = 100
    with pytest.raises(SeedSpreadError, match=r"run 2: 100 x 2"):
        aggregate(smaller, "tiny_test", RECIPE)
    resampled = _three()
    resampled[1]["settings"]["sampling"]["seed"] = 1
    with pytest.raises(SeedSpreadError, match="run 1: evaluation sampling"):
        aggregate(resampled, "tiny_test", RECIPE)
    with pytest.raises(SeedSpreadError, match="no checkpoint was evaluated on 'math500'"):
        aggregate(_three(), "math500", RECIPE)
    with pytest.raises(SeedSpreadError, match="no runs"):
        aggregate([], "tiny_test", RECIPE)


def test_file_round_trips_and_a_malformed_one_names_itself(tmp_path: Path) -> None:
    path = tmp_path / "spread.json"
    spread = aggregate(_three(), "tiny_test", RECIPE)
    write_seed_spread(spread, path)
    assert load_seed_spread(path) == spread
    data = json.loads(path.read_text())
    data["checkpoints"]["papo_rl"]["metrics"]["accuracy"]["values"].pop()
    path.write_text(json.dumps(data))
    with pytest.raises(SeedSpreadError, match=rf"{path} is malformed.*2 values for 3 runs"):
        load_seed_spread(path)
    path.write_text(json.dumps({"benchmark": "tiny_test"}))
    with pytest.raises(SeedSpreadError, match=rf"{path} is malformed.*n_problems"):
        load_seed_spread(path)
    path.write_text("{not json")
    with pytest.raises(SeedSpreadError, match=rf"seed spread file {path}: cannot be read as JSON"):
        load_seed_spread(path)


def test_committed_spread_states(tmp_path: Path) -> None:
    path = tmp_path / "spread.json"
    assert _committed(None) == {"file": None, "state": "unset"}
    assert _committed(str(path)) == {"file": str(path), "state": "absent"}
    write_seed_spread(aggregate(_three(), "tiny_test", RECIPE), path)
    shown = _committed(str(path))
    assert shown["state"] == "shown" and shown["spread"]["benchmark"] == "tiny_test"
    other = _committed(str(path), 200, 4)
    assert other["state"] == "mismatch" and "this run on tiny_test (200 x 4)" in other["detail"]
    path.write_text("[]")  # malformed: read_committed_spread (the stage, before its decode) names the file
    with pytest.raises(SeedSpreadError, match=str(path)):
        read_committed_spread(str(path))
    assert read_committed_spread(None) is None and read_committed_spread(str(tmp_path / "none")) is None


def _summary(committed: dict[str, Any] | None) -> dict[str, Any]:
    row = {
        "checkpoint": "papo_rl",
        "paper_name": "NPR",
        "mode": "parallel",
        "n_problems": 200,
        "n_samples": 2,
        "k": 2,
        "accuracy": (0.40, 0.35, 0.45),
        "pass@k": 0.6,
        "format_valid_rate": 0.99,
        "parallel_rate": (0.99, 0.98, 1.0),
        "ideal_speedup": (2.1, 2.08, 2.12),
        "achieved_speedup": 2.08,
        "speedup_efficiency": 0.98,
    }
    sr = dict(row, checkpoint="sr_rl", paper_name="SR", mode="sequential", achieved_speedup=None)
    summary = {"benchmark": "tiny_test", "confidence": 0.95, "n_resamples": 2000, "rows": [row, sr]}
    summary.update(claims=[], targets=[])
    if committed is not None:
        summary["seed_spread"] = committed
    return summary


def test_report_sets_the_committed_spread_beside_each_avg(tmp_path: Path, make_eval: Any) -> None:
    path = tmp_path / "spread.json"
    runs = [_run(0.475, 0.405, 2.08, sr_acc=None), _run(0.475, 0.46, 1.9, sr_acc=None)]
    write_seed_spread(aggregate(runs, "tiny_test", RECIPE), path)
    md = recipe_markdown(_summary(_committed(str(path)))).splitlines()
    assert md[2].startswith("| checkpoint | stage | mode | avg@2 | avg@2, 2 seeds: mean (spread) | pass@2 |")
    assert md[3].count("|") == md[2].count("|")
    assert md[4] == (
        "| NPR | papo_rl | parallel | 40.0 [35.0, 45.0] | 43.2 (5.5) | 60.0 | 99.0 | 99.0 [98.0, 100.0] | "
        "2.10 [2.08, 2.12] | 2.08 | 0.98 |"
    )
    assert md[5].startswith("| SR | sr_rl | sequential | 40.0 [35.0, 45.0] | – | 60.0 |")  # not in the file
    text = "\n".join(md)
    assert f"Seed spread (`{path}`)" in text and "over 2 runs" in text
    assert "smaller than the spread is inside training noise" in text
    # the whole report carries it in its recipe section
    ev = make_eval()
    ev["recipe"] = _summary(_committed(str(path)))
    assert "| 43.2 (5.5) |" in render_report(ev, "Eval")


def test_report_says_when_no_spread_is_committed(tmp_path: Path) -> None:
    plain = recipe_markdown(_summary(None))
    assert "spread" not in plain.lower()  # a summary without the stage's note (bench_recipe's single run)
    unset = recipe_markdown(_summary(_committed(None)))
    assert "No seed spread is committed (`evaluate.seed_spread` is null)" in unset
    assert unset.splitlines()[2] == plain.splitlines()[2]  # no column
    missing = tmp_path / "none.json"
    absent = recipe_markdown(_summary(_committed(str(missing))))
    assert f"No seed spread is committed (`{missing}` does not exist)" in absent
    path = tmp_path / "spread.json"
    write_seed_spread(aggregate(_three(), "tiny_test", RECIPE), path)
    other = recipe_markdown(_summary(_committed(str(path), 100, 2)))
    assert "does not match this run: it was measured on tiny_test (200 problems x 2 samples)" in other
    assert "mean (spread)" not in other


def test_a_run_description_per_run() -> None:
    with pytest.raises(ValueError, match="2 run descriptions for 3 runs"):
        aggregate(_three(), "tiny_test", RECIPE, [SpreadRun(source="a"), SpreadRun(source="b")])
    inputs = _three()
    before = copy.deepcopy(inputs)
    aggregate(inputs, "tiny_test", RECIPE)
    assert inputs == before  # a pure function of its inputs


def test_the_stage_refuses_a_malformed_file_before_it_decodes(
    tmp_path: Path, in_repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from components.config import load_config
    from components.dag import StageIO
    from components.stages import evaluate

    bad = tmp_path / "spread.json"
    bad.write_text('{"benchmark": "tiny_test"}')
    cfg = load_config(profile="tiny", overrides=[f"evaluate.seed_spread={bad}"])

    def decode(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("decoded before reading the seed spread")

    monkeypatch.setattr(evaluate, "evaluate_into", decode)
    io = StageIO(stage="evaluate", plots=tmp_path / "plots", outputs={"report": tmp_path / "report"})
    with pytest.raises(SeedSpreadError, match=rf"seed spread file {bad} is malformed"):
        evaluate.run(cfg, io)


# ------------------------------------------------------------------ one spread per precision (issue 43)
def test_a_spread_is_of_one_training_precision(tmp_path: Path) -> None:
    bf16 = [SpreadRun(source=f"run {i}", precision="bfloat16") for i in range(3)]
    spread = aggregate(_three(), "tiny_test", RECIPE, bf16)
    assert spread.precision == "bfloat16"
    mixed = [*bf16[:2], SpreadRun(source="run 2", precision="float32")]
    with pytest.raises(SeedSpreadError, match="run 2: float32"):
        aggregate(_three(), "tiny_test", RECIPE, mixed)
    path = tmp_path / "tiny-bfloat16.json"
    write_seed_spread(spread, path)
    read = read_committed_spread(str(path))
    # the run's own precision picks the file; a file of another precision is not shown as this run's spread
    assert committed_spread(str(path), read, "tiny_test", 200, 2, "bfloat16")["state"] == "shown"
    other = committed_spread(str(path), read, "tiny_test", 200, 2, "float32")
    assert other["state"] == "mismatch" and "trained in bfloat16, this run in float32" in other["detail"]
    assert "does not match this run" in recipe_markdown(_summary(other))
    assert spread_path("eval/seed_spread/tiny-{precision}.json", "float32") == "eval/seed_spread/tiny-float32.json"
    assert spread_path("plain.json", "float32") == "plain.json" and spread_path(None, "float32") is None


def test_the_committed_tiny_spread_says_its_precision(repo_root: Path) -> None:
    spread = load_seed_spread(repo_root / "eval/seed_spread/tiny-bfloat16.json")
    assert spread.precision == "bfloat16" and {r.precision for r in spread.runs} == {"bfloat16"}


def test_the_report_says_which_precision_trained_the_checkpoints(make_eval: Any) -> None:
    metrics = make_eval()
    metrics["settings"]["training_precision"] = {
        "autocast": "auto", "compute_dtype": "float32", "reason": "auto: the weights' own dtype, no bf16",
    }  # fmt: skip
    report = render_report(metrics, "t")
    assert "Training precision: float32 compute (run.autocast=auto; auto: the weights' own dtype" in report
