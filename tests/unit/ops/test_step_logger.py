"""components.tracking.step_logger: the on_step callback SFT stages log their training curve with."""

from __future__ import annotations

import pytest

from components.tracking import step_logger


class _Run:
    def __init__(self) -> None:
        self.logged: list[tuple[int | None, dict]] = []

    def log(self, metrics: dict, step: int | None = None) -> None:
        self.logged.append((step, metrics))


def test_logs_step_one_and_every_nth_step_with_scalars_only() -> None:
    run = _Run()
    on_step = step_logger(run, every=3)  # type: ignore[arg-type]
    for step in range(1, 8):
        on_step(step, {"step": step, "loss": 1.0 / step, "tokens": 10, "note": "text"})
    assert [s for s, _ in run.logged] == [1, 3, 6]
    assert run.logged[1][1] == {"loss": pytest.approx(1 / 3), "tokens": 10}


def test_rejects_a_non_positive_cadence() -> None:
    with pytest.raises(ValueError, match="every"):
        step_logger(_Run(), every=0)  # type: ignore[arg-type]
