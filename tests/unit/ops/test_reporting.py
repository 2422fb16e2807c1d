"""components.reporting: the flat numbers DVC compares, the curves DVC plots, the W&B summary."""

from __future__ import annotations

import json
import math
from pathlib import Path

from components.reporting import stage_summary, training_curves, wandb_summary, write_summary

RL_METRICS = {
    "steps": 30, "resumed": False, "algorithm": "dapo", "final/accuracy": 0.3, "final/format_valid": 0.9,
    "final/correct_and_valid": 0.25, "final/parallel_rate": 0.5, "initial/accuracy": 0.2, "delta/accuracy": 0.1,
    "min/accuracy": 0.18, "evals": [{"step": 0}], "train/rollouts_trained": 3840.0, "perf/tokens_per_s": float("nan"),
    "train/structurally_rejected": 12.0, "wall_time_s": 321.5, "provenance": {"prompt": {"prompt_hash": "ab"}},
}  # fmt: skip


def test_rl_summary_is_flat_shared_names_only() -> None:
    flat = stage_summary("papo_rl", RL_METRICS)
    assert flat == {
        "steps": 30,
        "accuracy": 0.3,
        "format_valid": 0.9,
        "correct_and_valid": 0.25,
        "parallel_rate": 0.5,
        "accuracy_gain": 0.1,
        "rollouts_trained": 3840.0,
        "structurally_rejected": 12.0,
        "wall_time_s": 321.5,
    }  # fmt: skip  (NaN tokens/s dropped: not JSON, not comparable)


def test_unknown_stage_falls_back_to_its_top_level_numbers() -> None:
    flat = stage_summary("new_stage", {"a": 1, "b": 0.5, "c": "text", "d": {"e": 1}, "ok": True})
    assert flat == {"a": 1, "b": 0.5, "ok": 1}


def test_evaluation_writes_one_row_per_checkpoint(tmp_path: Path) -> None:
    bench = {"accuracy": 0.5, "format_valid_rate": 0.75, "parallel_rate": 0.25}
    metrics = {
        "checkpoints": {
            "seed": {"average_accuracy": 0.5, "benchmarks": {"t": bench}, "throughput": {"tokens_per_s": 10.0}},
            "papo_rl": {"average_accuracy": 0.5, "benchmarks": {"t": bench},
                        "throughput": {"tokens_per_s": 20.0, "achieved_speedup": 1.5, "ideal_speedup": 2.0}},
        },
        "wall_time_s": 9.0,
    }  # fmt: skip
    (tmp_path / "evaluate").mkdir()
    (tmp_path / "evaluate" / "old_checkpoint.json").write_text("{}")  # no longer evaluated: removed
    write_summary("evaluate", metrics, tmp_path / "evaluate")
    rows = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "evaluate").glob("*.json")}
    assert set(rows) == {"seed", "papo_rl"}
    assert rows["papo_rl"] == {
        "accuracy": 0.5, "format_valid": 0.75, "parallel_rate": 0.25, "speedup": 1.5, "ideal_speedup": 2.0,
        "tokens_per_s": 20.0, "benchmark": {"t": 0.5}, "wall_time_s": 9.0,
    }  # fmt: skip
    summary = wandb_summary("evaluate", metrics)
    assert summary["papo_rl/speedup"] == 1.5 and summary["seed/benchmark/t"] == 0.5


def test_training_curves_from_the_trainers_logs(tmp_path: Path) -> None:
    sft = tmp_path / "sft"
    sft.mkdir()
    history = [{"step": s, "loss": 1.0 / s, "lr": 0.1, "grad_norm": 2.0, "tokens": 9} for s in (1, 2, 2, 3)]
    (sft / "train_metrics.json").write_text(json.dumps({"history": history}))
    assert training_curves(sft)["train"] == [
        {"step": s, "loss": 1.0 / s if s != 3 else round(1 / 3, 6), "lr": 0.1, "grad_norm": 2.0}
        for s in (1, 2, 3)
    ]
    rl = tmp_path / "rl"
    rl.mkdir()
    lines = [
        {"step": 0, "eval": {"step": 0, "accuracy": 0.1, "format_valid": 0.2}},
        {"step": 1, "reward/mean": -0.5, "actor/pg_loss": 0.01, "rollout/format_valid": 0.4},
        {"step": 2, "reward/mean": float("nan"), "rollout/format_valid": 0.5, "eval": {"step": 2, "accuracy": 0.3}},
    ]  # fmt: skip
    (rl / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
    curves = training_curves(rl)
    empty = dict.fromkeys(
        ("reward", "pg_loss", "format_valid", "correct_and_valid", "parallel_rate", "response_length")
    )
    assert curves["train"] == [
        {**empty, "step": 1, "reward": -0.5, "pg_loss": 0.01, "format_valid": 0.4},
        {**empty, "step": 2, "format_valid": 0.5},  # no update that step: no reward, null (not NaN)
    ]
    blank = dict.fromkeys(("accuracy", "format_valid", "correct_and_valid", "parallel_rate"))
    assert curves["eval"] == [
        {**blank, "step": 0, "accuracy": 0.1, "format_valid": 0.2},
        {**blank, "step": 2, "accuracy": 0.3},
    ]
    assert not any(isinstance(v, float) and math.isnan(v) for r in curves["train"] for v in r.values())
    assert training_curves(tmp_path / "nothing") == {"train": []}


def test_smoke_benchmarks_enter_no_flat_metric_and_no_average(tmp_path: Path) -> None:
    """The tiny profile's shape: one main benchmark and 3-problem smoke samples of the real ones."""
    main = {"accuracy": 0.4, "format_valid_rate": 0.99, "parallel_rate": 0.98}
    smoke = {"accuracy": 0.0, "format_valid_rate": 0.0, "parallel_rate": 0.0}
    ckpt = {
        "average_accuracy": 0.4,
        "benchmarks": {"tiny_test": main, "aime24": smoke, "aime25": smoke},
        "smoke_benchmarks": ["aime24", "aime25"],
        "throughput": {"tokens_per_s": 20.0, "achieved_speedup": 1.5, "ideal_speedup": 2.0},
    }
    only_smoke = {**ckpt, "benchmarks": {"aime24": smoke}, "smoke_benchmarks": ["aime24"], "average_accuracy": 0.0}
    write_summary("evaluate", {"checkpoints": {"papo_rl": ckpt, "smoke_only": only_smoke}}, tmp_path / "ev")
    row = json.loads((tmp_path / "ev" / "papo_rl.json").read_text())
    assert row == {
        "accuracy": 0.4, "format_valid": 0.99, "parallel_rate": 0.98, "speedup": 1.5, "ideal_speedup": 2.0,
        "tokens_per_s": 20.0, "benchmark": {"tiny_test": 0.4},
    }  # fmt: skip
    assert json.loads((tmp_path / "ev" / "smoke_only.json").read_text()) == {"benchmark": {}}
    summary = wandb_summary("evaluate", {"checkpoints": {"papo_rl": ckpt}})
    assert summary["papo_rl/format_valid"] == 0.99 and not any("aime" in key for key in summary)


def test_committed_evaluation_metrics_hold_no_smoke_benchmark(repo_root: Path) -> None:
    """metrics/evaluate/*.json as committed (what `dvc metrics show` prints on a fresh clone): every per-
    benchmark number is a main benchmark of the profile, and each average is the mean over those alone."""
    import yaml

    params = yaml.safe_load((repo_root / "params.yaml").read_text(encoding="utf-8"))
    benchmarks = params["evaluate"]["benchmarks"]
    main = {b["name"] for b in benchmarks if not b.get("smoke")}
    smoke = {b["name"] for b in benchmarks if b.get("smoke")}
    rows = {p.stem: json.loads(p.read_text()) for p in sorted((repo_root / "metrics" / "evaluate").glob("*.json"))}
    assert rows, "no committed metrics/evaluate/*.json"
    for name, row in rows.items():
        per_bench = row.get("benchmark", {})
        assert set(per_bench) <= main and not set(per_bench) & smoke, (name, sorted(per_bench))
        if len(main) == 1 and per_bench:  # one main benchmark: the average is its value
            assert row["accuracy"] == next(iter(per_bench.values())), name
        assert set(row) <= {"accuracy", "format_valid", "parallel_rate", "speedup", "ideal_speedup",
                            "tokens_per_s", "benchmark", "wall_time_s"}, name  # fmt: skip
