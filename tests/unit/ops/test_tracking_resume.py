"""StageRun resumes a W&B run at the right step: what a killed process lost is logged again from the
journal, what W&B already holds is never logged twice, steps never go backwards."""

from __future__ import annotations

from pathlib import Path

from components.tracking import StageRun


class FakeRun:
    """The part of a wandb Run StageRun uses; ``logged`` is what W&B would hold once flushed."""

    def __init__(self, step: int = 0) -> None:
        self.step = step
        self.logged: list[int] = []

    def log(self, metrics: dict, step: int | None = None) -> None:
        self.logged.append(step)


def _process(run_dir: Path, steps: range, resume_from: int | None = None, server_step: int = 0):
    run = FakeRun(server_step)
    stage = StageRun(run, "papo_rl", run_dir)
    if resume_from is not None:
        stage.resume_from(resume_from)
    for step in steps:
        stage.log({"loss": float(step)}, step=step)
    return stage, run


def test_a_killed_process_loses_its_buffer_and_the_resumed_one_logs_it_again(tmp_path: Path) -> None:
    # steps 0-3 logged, checkpoint at 2, SIGKILL: W&B's service never wrote them (no close())
    _process(tmp_path, range(4))
    stage, run = _process(tmp_path, range(3, 6), resume_from=2)
    assert run.logged == [0, 1, 2, 3, 4, 5], "0-2 from the journal, 3-5 trained again"
    stage.close()
    # a rerun of the finished stage: nothing to log again
    stage, run = _process(tmp_path, range(0), resume_from=5)
    assert run.logged == []


def test_what_w_and_b_holds_after_a_clean_finish_is_not_logged_twice(tmp_path: Path) -> None:
    # an exception after step 3 (checkpoint at 2): the run finished with exit code 1, W&B holds 0-3
    stage, _ = _process(tmp_path, range(4))
    stage.close()
    _, run = _process(tmp_path, range(3, 6), resume_from=2)
    assert run.logged == [4, 5], "step 3 is replayed by training but already in W&B"


def test_online_the_server_step_counts_too(tmp_path: Path) -> None:
    _process(tmp_path, range(4))  # killed, but the server had received steps 0-2 (its counter is 3)
    _, run = _process(tmp_path, range(3, 6), resume_from=2, server_step=3)
    assert run.logged == [3, 4, 5]


def test_a_restart_without_checkpoint_logs_everything_once(tmp_path: Path) -> None:
    _process(tmp_path, range(2))  # killed before the first checkpoint
    _, run = _process(tmp_path, range(0, 3), resume_from=-1)
    assert run.logged == [0, 1, 2]
    # a journal line cut by the kill is ignored
    (tmp_path / "wandb_log.jsonl").write_text('{"step": 0, "metrics": {}}\n{"step": 1, "metr')
    _, run = _process(tmp_path, range(2, 3), resume_from=1)
    assert run.logged == [0, 2]


def test_a_stage_process_starts_its_own_wandb_service_not_its_parents(monkeypatch, tmp_path):
    # wandb exports WANDB_SERVICE once it starts a service; a stage that joined its parent's service and was
    # killed would leave its run's stream there, and its rerun (same run id) would be refused as "in use"
    import components.cli as cli

    monkeypatch.setenv("WANDB_SERVICE", "2-4242-tcp-localhost-1")
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path))  # main() applies the CLI's defaults to os.environ
    seen: dict[str, str | None] = {}
    monkeypatch.setattr(
        cli, "app", lambda: seen.setdefault("service", __import__("os").environ.get("WANDB_SERVICE"))
    )
    monkeypatch.setattr(cli, "configure_logging", lambda: None)
    cli.main()
    assert seen == {"service": None}
