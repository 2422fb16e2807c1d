"""Stage distill on a saved random-init tiny model: records, metrics, and resume after an interruption."""

from __future__ import annotations

from pathlib import Path

from components.artifacts import read_shards, write_shards
from components.config import load_config
from components.dag import StageIO
from components.models.loading import save_model
from components.models.tiny import tiny_test_world
from components.stages import run_stage

FIELDS = {
    "problem_id", "sample_idx", "problem", "answer", "prompt", "response", "n_tokens", "answer_pred",
    "correct", "format_score", "valid", "finish_reason", "structure",
}  # fmt: skip


def _without_timing(records: list[dict]) -> list[dict]:
    return [
        r | {"structure": {k: v for k, v in r["structure"].items() if k != "wall_time_s"}} for r in records
    ]


def _setup(tmp_path: Path) -> tuple[StageIO, object]:
    model, tok = tiny_test_world(seed=1)
    save_model(model, tok, tmp_path / "npr_zero" / "model")
    problems = [
        {"id": f"p{i}", "problem": f"{i}+{i}", "answer": str(2 * i), "source": "synthetic",
         "difficulty": "easy", "split": "train"}
        for i in range(5)
    ]  # fmt: skip
    write_shards(tmp_path / "sample_orz" / "problems", problems, n_shards=2, stem="train")
    io = StageIO(
        stage="distill",
        inputs={
            "npr_zero/model": tmp_path / "npr_zero" / "model",
            "sample_orz/problems": tmp_path / "sample_orz" / "problems",
        },
        outputs={"trajectories": tmp_path / "distill" / "trajectories"},
    )
    cfg = load_config(
        profile="tiny",
        overrides=[
            "distill.k=2",
            "distill.n_problems=4",
            "distill.shard_size=3",
            "distill.generation.batch_size=4",
            "distill.generation.max_new_tokens=12",
        ],
    )
    return io, cfg


def test_distill_writes_graded_trajectories_and_resumes(tmp_path: Path) -> None:
    io, cfg = _setup(tmp_path)
    metrics = run_stage("distill", cfg, io)
    assert metrics["n_trajectories"] == 8 and metrics["chunks"] == 2 and metrics["chunks_resumed"] == 0
    assert metrics["tokens_per_s"] > 0 and sum(metrics["finish_reasons"].values()) == 8
    first = read_shards(io.output("trajectories"))
    assert len(list(io.output("trajectories").glob("part-*.jsonl"))) == 3
    assert [(r["problem_id"], r["sample_idx"]) for r in first] == [
        (f"p{i}", s) for i in range(4) for s in (0, 1)
    ]
    assert all(set(r) >= FIELDS for r in first) and all(r["n_tokens"] <= 12 for r in first)

    # Interrupted run: the second chunk never finished. A rerun redoes only it, with the same samples.
    work = io.output("trajectories").parent / "work"
    (work / "chunk-00001.jsonl").unlink()
    metrics = run_stage("distill", cfg, io)
    assert metrics["chunks_resumed"] == 1 and metrics["generated_tokens_this_run"] > 0
    assert _without_timing(read_shards(io.output("trajectories"))) == _without_timing(first)

    # A changed config must not reuse stale samples.
    cfg.distill.generation.temperature = 0.0
    metrics = run_stage("distill", cfg, io)
    assert metrics["chunks_resumed"] == 0
