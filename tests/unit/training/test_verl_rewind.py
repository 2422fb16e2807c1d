"""A resumed verl job starts from the newest checkpoint whose step verl logged (stage.rewind_to_reported).

verl saves a step's checkpoint before it logs the step's metrics; a stage killed between the two must not
resume from that checkpoint, or the step is never reported.
"""

from __future__ import annotations

import json
from pathlib import Path

from components.training.verl.stage import (
    CHECKPOINTS,
    TRACKER_FILE,
    latest_checkpoint_step,
    rewind_to_reported,
)


def _run_dir(tmp_path: Path, checkpoints: list[int], tracker: int | None, logged: list[list[int]]) -> Path:
    """A run dir with ``global_step_<n>`` folders, verl's tracker, and one file-logger file per attempt."""
    run = tmp_path / "verl"
    for step in checkpoints:
        (run / CHECKPOINTS / f"global_step_{step}" / "actor").mkdir(parents=True)
    if tracker is not None:
        (run / CHECKPOINTS / TRACKER_FILE).write_text(str(tracker))
    for k, steps in enumerate(logged, start=1):
        path = run / "verl_logs" / f"attempt-{k:02d}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text("".join(json.dumps({"step": s, "data": {"critic/score/mean": 0.5}}) + "\n" for s in steps))
    return run


def _kept(run: Path) -> list[str]:
    return sorted(p.name for p in (run / CHECKPOINTS).glob("global_step_*"))


def test_a_checkpoint_whose_step_was_logged_is_resumed_from_as_it_is(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [1, 2], tracker=2, logged=[[1, 2]])
    assert rewind_to_reported(run) == 2
    assert _kept(run) == ["global_step_1", "global_step_2"] and latest_checkpoint_step(run) == 2


def test_a_kill_between_checkpoint_and_log_rewinds_to_the_last_logged_step(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [1, 2, 3], tracker=3, logged=[[1, 2]])
    assert rewind_to_reported(run) == 2
    assert _kept(run) == ["global_step_1", "global_step_2"] and latest_checkpoint_step(run) == 2


def test_an_unlogged_first_checkpoint_leaves_nothing_to_resume_from(tmp_path: Path) -> None:
    # the CI failure of 2026-12-05: killed after step 1's checkpoint, before step 1 was logged
    run = _run_dir(tmp_path, [1], tracker=1, logged=[[0]])  # step 0: verl's evaluation before training
    assert rewind_to_reported(run) is None
    assert _kept(run) == [] and not (run / CHECKPOINTS / TRACKER_FILE).exists()


def test_a_save_cut_short_beyond_the_tracker_is_dropped(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [1, 2], tracker=1, logged=[[1, 2]])  # step 2 logged by an earlier attempt
    assert rewind_to_reported(run) == 1
    assert _kept(run) == ["global_step_1"] and latest_checkpoint_step(run) == 1


def test_steps_logged_by_an_earlier_attempt_count(tmp_path: Path) -> None:
    run = _run_dir(tmp_path, [1, 2], tracker=2, logged=[[1], [2]])
    assert rewind_to_reported(run) == 2


def test_a_fresh_run_dir_has_nothing_to_rewind(tmp_path: Path) -> None:
    assert rewind_to_reported(tmp_path / "verl") is None
