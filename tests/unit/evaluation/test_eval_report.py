"""Report tables and plot rows from a canned evaluation (the end-to-end render is in the integration test)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.evaluation.plots import accuracy_rows, render_pngs, speedup_rows, write_plot_data
from components.evaluation.report import (
    accuracy_table,
    flat_metrics,
    in_prefect_run,
    publish_prefect,
    render_report,
)


def _two_checkpoints(make_eval: Any) -> dict[str, Any]:
    ev = make_eval(0.5)
    par = ev["checkpoints"]["papo_rl"]
    par["benchmarks"]["aime24"] = dict(par["benchmarks"]["tiny_test"], accuracy=0.1, n_samples=8)
    par["average_accuracy"] = 0.3
    par["throughput"] = {
        "tokens_per_s": 3000.0,
        "sequential_tokens_per_s": 1000.0,
        "achieved_speedup": 3.0,
        "ideal_speedup": 3.4,
        "speedup_ideal": 3.5,
        "speedup_efficiency": 3.0 / 3.5,
        "mean_tokens": 60.0,
    }
    par["speedup"] = {
        "n_problems": 16,
        "batch_size": 4,
        "parallel_tokens_per_s": 3000.0,
        "sequential_tokens_per_s": 1000.0,
        "achieved_speedup": 3.0,
        "ideal_speedup": 3.5,
        "efficiency": 3.0 / 3.5,
    }
    seq = {
        "mode": "sequential",
        "prompt_style": "sequential",
        "checkpoint_hash": "sha256:0",
        "path": "p",
        "benchmarks": {"tiny_test": dict(par["benchmarks"]["tiny_test"], accuracy=0.25)},
        "average_accuracy": 0.25,
        "throughput": {"tokens_per_s": 1100.0, "ideal_speedup": 1.0, "mean_tokens": 70.0},
    }
    ev["checkpoints"] = {"sr_rl": seq, "papo_rl": par}
    return ev


def test_accuracy_table_is_table_2_shaped(make_eval: Any) -> None:
    table = accuracy_table(_two_checkpoints(make_eval)).splitlines()
    assert table[0] == "| checkpoint | mode | tiny_test (avg@4) | aime24 (avg@8) | average |"
    assert table[2] == "| sr_rl | sequential | 25.0 | – | 25.0 |"
    assert table[3] == "| papo_rl | parallel | 50.0 | 10.0 | 30.0 |"


def test_report_has_throughput_and_detail(make_eval: Any) -> None:
    md = render_report(_two_checkpoints(make_eval), "Eval", ["accuracy.png"])
    assert (
        "| papo_rl | parallel | 3000.0 | 60.0 | 3.40 | 16 x 4 | 3000.0 | 1000.0 | 3.00 | 3.50 | 0.86 |" in md
    )
    assert "| sr_rl | sequential | 1100.0 | 70.0 | 1.00 | – | – | – | – | – | – |" in md
    assert "| papo_rl | aime24 | 200 × 8 | 70.0 (k=4) |" in md
    assert md.rstrip().endswith("![accuracy](accuracy.png)")


def test_plot_rows_and_pngs(make_eval: Any, tmp_path: Path) -> None:
    ev = _two_checkpoints(make_eval)
    assert accuracy_rows(ev)[1] == {
        "checkpoint": "papo_rl",
        "mode": "parallel",
        "accuracy": 0.3,
        "accuracy/tiny_test": 0.5,
        "accuracy/aime24": 0.1,
    }
    assert [r["checkpoint"] for r in speedup_rows(ev)] == ["papo_rl"]
    paths = write_plot_data(ev, tmp_path / "plots")
    assert paths["speedup"].read_text().count("achieved_speedup") == 1
    pngs = render_pngs(ev, tmp_path / "png")
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs.values())


def test_prefect_publishing_is_skipped_outside_a_flow_run() -> None:
    assert in_prefect_run() is False
    assert publish_prefect("# x", "key", "d") is False


def test_smoke_samples_get_their_own_table_and_no_average(make_eval: Any) -> None:
    ev = _two_checkpoints(make_eval)
    for ckpt in ev["checkpoints"].values():
        ckpt["smoke_benchmarks"] = ["aime24"]
    main = accuracy_table(ev).splitlines()
    assert main[0] == "| checkpoint | mode | tiny_test (avg@4) | average |"
    smoke = accuracy_table(ev, smoke=True).splitlines()
    assert smoke[0] == "| checkpoint | mode | aime24 (avg@8) |"
    assert smoke[3] == "| papo_rl | parallel | 10.0 |"
    md = render_report(ev, "Eval")
    assert "## Smoke samples (not in any average)" in md
    flat = flat_metrics(ev)  # W&B's summary: smoke numbers kept apart, under smoke/
    assert flat["papo_rl/smoke/aime24/accuracy"] == 0.1 and "papo_rl/aime24/accuracy" not in flat
    assert flat["papo_rl/tiny_test/accuracy"] == 0.5


def test_the_scale_note_heads_the_report_and_a_missing_one_is_a_config_error(
    make_eval: Any, tmp_path: Path
) -> None:
    """``evaluate.scale_note``: the profile's note on what its run can show, at the top of the report; the
    tiny profile's names the structural targets and says its accuracy differences need the seed spread."""
    import pytest

    from components.config import load_config
    from components.evaluation.report import read_scale_note
    from components.settings import ConfigError

    root = Path(__file__).resolve().parents[3]
    note_path = load_config(profile="tiny").evaluate.scale_note
    note = read_scale_note(str(root / note_path))
    assert "parallel rate" in note and "ideal speedup" in note and "seed spread" in note
    ev = _two_checkpoints(make_eval)
    ev["settings"]["scale_note"] = note
    md = render_report(ev, "Eval")
    assert md.index("## What this run can show") < md.index("## Accuracy")
    assert "every stage runs end to end" in md
    ev["settings"]["scale_note"] = None
    assert "What this run can show" not in render_report(ev, "Eval")

    assert read_scale_note(None) is None
    with pytest.raises(ConfigError, match="evaluate.scale_note: .*missing.md is not a non-empty file"):
        read_scale_note(str(tmp_path / "missing.md"))
    (tmp_path / "empty.md").write_text("\n")
    with pytest.raises(ConfigError, match="not a non-empty file"):
        read_scale_note(str(tmp_path / "empty.md"))


def test_checkpoints_with_their_own_engine_settings_are_named(make_eval: Any) -> None:
    """Parallel-R1's checkpoints decode with their own paths and token budget: the report says so."""
    ev = _two_checkpoints(make_eval)
    assert "Own engine settings" not in render_report(ev, "Eval")
    ev["checkpoints"]["papo_rl"]["engine_settings"] = {"paths": 2, "max_step_tokens": None, "max_new_tokens": 448}
    assert "Own engine settings: papo_rl: max_new_tokens=448, paths=2." in render_report(ev, "Eval")
