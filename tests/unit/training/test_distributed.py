"""The single-process side of components.training.distributed: relaunch under torchrun, rank guards."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.dag import StageIO
from components.training.distributed import DistContext, is_main_process, torchrun_argv


def test_relaunch_only_for_several_processes_and_never_inside_a_job(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    argv = ["/venv/bin/npr", "stage", "parallel_warmup", "--set", "parallel_warmup.lr=1e-6"]
    assert torchrun_argv(1, argv) is None
    assert torchrun_argv(8, argv) == ["torchrun", "--standalone", "--nproc_per_node=8", "--no-python", *argv]
    monkeypatch.setenv("WORLD_SIZE", "8")  # the relaunched processes must not relaunch again
    assert torchrun_argv(8, argv) is None


def test_single_process_context_is_inert(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = DistContext.from_env()
    assert (ctx.world_size, ctx.rank, ctx.active, ctx.is_main) == (1, 0, False, True)
    assert ctx.shard([1, 2, 3]) == [1, 2, 3] and ctx.all_sum(2.5) == 2.5 and ctx.broadcast("x") == "x"
    assert DistContext(world_size=4, rank=1).shard(list(range(8))) == [1, 5]


def test_non_zero_ranks_write_no_metrics_and_leave_the_work_dir_alone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import components.stages as stages
    from components.config import load_config

    class Toy:
        @staticmethod
        def run(cfg, io):
            return {"x": 1}

    monkeypatch.setattr(stages, "stage_module", lambda name: Toy)
    monkeypatch.setattr(stages, "work_fingerprint", lambda name, cfg: "fingerprint")
    work = tmp_path / "toy" / "work"
    work.mkdir(parents=True)
    (work / "checkpoint-00000001").mkdir()  # rank 1 must not judge (and reset) rank 0's work dir
    io = StageIO(
        "toy", outputs={"model": tmp_path / "toy" / "model"}, metrics=tmp_path / "toy" / "metrics.json"
    )
    monkeypatch.setenv("RANK", "1")
    assert not is_main_process()
    assert stages.run_stage("toy", load_config(profile="tiny"), io)["x"] == 1
    assert not io.metrics.exists() and (work / "checkpoint-00000001").exists()
    monkeypatch.setenv("RANK", "0")
    stages.run_stage("toy", load_config(profile="tiny"), io)
    assert io.metrics.exists()
