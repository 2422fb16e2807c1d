"""components.progress: live bars at a terminal, a bounded number of plain lines in a log, nothing nested."""

from __future__ import annotations

import io

import pytest

from components import progress
from components.progress import print_table, progress_mode, track


@pytest.fixture()
def stream(monkeypatch: pytest.MonkeyPatch) -> io.StringIO:
    out = io.StringIO()
    monkeypatch.setattr(progress, "_stream", lambda: out)
    monkeypatch.delenv(progress.MODE_ENV, raising=False)
    return out


def test_a_log_gets_a_dozen_plain_lines_whatever_the_step_count(stream: io.StringIO) -> None:
    assert progress_mode(stream) == "plain"  # a StringIO is not a terminal
    with track("train", total=1000) as task:
        for _ in range(1000):
            task.advance(1, loss=0.123456)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "train: started (1000 steps)"
    assert len(lines) == 11 and lines[-1].startswith("train: done, 1000 steps in ")
    assert (
        lines[5].startswith("train: 500/1000 steps (50%)")
        and "left" in lines[5]
        and "loss 0.1235" in lines[5]
    )
    assert "\r" not in stream.getvalue() and "\x1b[" not in stream.getvalue()  # no redraws, no colour codes


def test_detail_tasks_are_silent_in_a_log(stream: io.StringIO) -> None:
    with track("decode", total=50, level="detail") as task:
        for _ in range(50):
            task.advance(1)
    assert stream.getvalue() == ""


def test_a_terminal_gets_a_transient_live_bar(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.MODE_ENV, "tty")  # what rich detects on an interactive stderr
    with track("train", total=3) as task:
        assert task._bar is not None and task._bar.live.transient
        for _ in range(3):
            task.advance(1, loss=0.5)
    text = stream.getvalue()
    assert "\x1b[" in text and "train" in text  # drawn in place with terminal control codes
    assert "started" not in text and "done," not in text  # no log lines at a terminal


def test_off_prints_nothing(stream: io.StringIO, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(progress.MODE_ENV, "off")
    with track("train", total=3) as task:
        task.advance(3)
    assert stream.getvalue() == ""


def test_summary_table_is_a_table_not_json() -> None:
    out = io.StringIO()
    print_table("sample_orz", {"kept": 8000, "kept_fraction": 0.99876, "note": None}, file=out)
    text = out.getvalue()
    assert "sample_orz" in text and "kept_fraction" in text and "0.9988" in text and "–" in text
    assert "{" not in text
    out = io.StringIO()
    print_table(
        "accuracy",
        [{"checkpoint": "seed", "tiny_test": 0.25}, {"checkpoint": "papo_rl", "tiny_test": 0.5}],
        file=out,
    )
    assert "papo_rl" in out.getvalue() and "0.5" in out.getvalue()
