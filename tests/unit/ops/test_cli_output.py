"""`npr stage` ends with a short table of the stage's flat metrics; `--json` prints the full JSON instead."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

METRICS = {
    "rows_in": 2000, "kept": 1990, "quarantined": 10, "duplicates": 0, "n_train": 600, "n_test": 40,
    "per_difficulty": {"train": {"easy": 540}}, "quarantine_reasons": {"too_long": 10}, "wall_time_s": 12.5,
    "provenance": {"stage": "sample_orz"},
}  # fmt: skip


@pytest.fixture()
def stubbed(in_repo: Path, monkeypatch: pytest.MonkeyPatch) -> CliRunner:
    import components.stages

    monkeypatch.setattr(components.stages, "run_stage", lambda name, cfg: dict(METRICS))
    return CliRunner()


def test_stage_prints_a_table_by_default(stubbed: CliRunner) -> None:
    from components.cli import app

    result = stubbed.invoke(app, ["stage", "sample_orz"])
    assert result.exit_code == 0, result.output
    assert "n_train" in result.output and "600" in result.output and "12.5" in result.output
    assert "artifacts/sample_orz/metrics.json" in result.output  # where the full record is
    assert "{" not in result.output and "per_difficulty" not in result.output  # not a JSON dump


def test_stage_json_prints_everything_but_provenance(stubbed: CliRunner) -> None:
    from components.cli import app

    result = stubbed.invoke(app, ["stage", "sample_orz", "--json"])
    assert result.exit_code == 0, result.output
    printed = json.loads(result.output)
    assert printed["per_difficulty"] == {"train": {"easy": 540}} and "provenance" not in printed
