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


def _standin_spec(tmp_path: Path, context_length: int) -> Path:
    import sys

    import yaml

    spec = tmp_path / "server.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "python": sys.executable,
                "module": "tests.support.sglang_standin",
                "model_path": "set-by-the-stage",
                "port": 30000,
                "tp_size": 1,
                "context_length": context_length,
                "random_seed": 0,
            }
        )
    )
    return spec


def test_distill_serves_its_checkpoint_with_sglang_and_keeps_finished_chunks(
    tmp_path: Path, monkeypatch
) -> None:
    """The GPU profile's path: the stage starts an SGLang server (the stand-in) for NPR-Zero, samples through
    it, stops it; a server failure mid-run is a clear error and the chunk finished before it is kept."""
    import pytest

    from components.engine.backends.sglang_client import SGLangError
    from components.engine.serving import SGLangServerError

    io, cfg = _setup(tmp_path)
    sglang = {"backend": "sglang", "merge_mode": "reprefill", "server_start_timeout_s": 120.0}
    cfg.distill.generation = cfg.distill.generation.model_copy(
        update={**sglang, "server_spec": str(_standin_spec(tmp_path, 64))}
    )
    with pytest.raises(SGLangServerError, match="exceed the SGLang server's context length"):
        run_stage("distill", cfg, io)  # checked before any server starts or any sample is drawn
    work = io.output("trajectories").parent / "work"
    assert not list(work.glob("server-logs/*.log"))

    cfg.distill.generation.server_spec = str(_standin_spec(tmp_path, 512))
    monkeypatch.setenv("SGLANG_STANDIN_FAULT", "http500@5")  # the first request of the second chunk
    with pytest.raises(SGLangError, match="HTTP 500"):
        run_stage("distill", cfg, io)
    assert (work / "chunk-00000.jsonl").exists() and not (work / "chunk-00001.jsonl").exists()
    monkeypatch.delenv("SGLANG_STANDIN_FAULT")
    metrics = run_stage("distill", cfg, io)
    assert metrics["chunks_resumed"] == 1 and metrics["backend"] == "sglang" and metrics["tokens_per_s"] > 0
    records = read_shards(io.output("trajectories"))
    assert len(records) == 8 and all(r["structure"]["merge_mode"] == "reprefill" for r in records)
    assert len(list(work.glob("server-logs/*.log"))) == 2  # a fresh server per run, each stopped


def _answering_engine(solved: set[int]):
    """A stand-in for the engine: problem ``i+i`` gets a well-formed NPR answer, correct when ``i`` is in
    ``solved`` (wrong otherwise); every sample stops by itself."""
    import re
    from types import SimpleNamespace

    def generate(model, tokenizer, prompts, cfg, tags=None):
        out = []
        for prompt in prompts:
            i = int(re.findall(r"(\d+)\+\1", prompt)[-1][0])
            value = 2 * i if i in solved else 2 * i + 1
            text = (
                f"<guideline><plan>1: add</plan></guideline><step>1: {i}+{i}={value}</step>"
                f"<takeaway>the sum is {value}</takeaway> \\boxed{{{value}}}"
            )
            out.append(
                SimpleNamespace(
                    text=text,
                    total_tokens=20,
                    finish_reason="stop",
                    wall_time_s=0.0,
                    structure=lambda: {"parallel_taken": False},
                )
            )
        return out

    return generate


def test_distill_stops_at_its_accepted_target_and_reports_a_shortfall(tmp_path: Path, monkeypatch) -> None:
    """``target_accepted``: problems are sampled in order until that many have a trajectory the reject_filter
    rule accepts; the output is the shortest prefix of problems that reaches it. A bound reached first is
    reported as the shortfall, with everything sampled kept."""
    import components.stages.distill as distill_stage

    io, cfg = _setup(tmp_path)
    # the engine as the stage calls it (imported at the stage module's top)
    monkeypatch.setattr(distill_stage, "generate", _answering_engine({1, 3}))
    cfg.reject_filter.min_response_tokens = 1
    cfg.distill.n_problems = None  # all 5 problems, 2 a chunk
    cfg.distill.target_accepted = 2
    metrics = run_stage("distill", cfg, io)
    # p1 and p3 are solved: 2 chunks (p0-p3) are sampled, the third never, and the kept prefix ends at p3
    assert metrics["chunks"] == 2 and metrics["n_problems"] == 4 and metrics["max_problems"] == 5
    assert metrics["accepted_problems"] == 2 and metrics["shortfall"] == 0
    records = read_shards(io.output("trajectories"))
    assert sorted({r["problem_id"] for r in records}) == ["p0", "p1", "p2", "p3"] and len(records) == 8

    # The reject_filter stage accepts exactly the target from this output
    from components.data.acceptance import filter_trajectories

    accepted, _, _ = filter_trajectories(records, cfg.reject_filter)
    assert {r["problem_id"] for r in accepted} == {"p1", "p3"}

    cfg.distill.target_accepted = 3  # only 2 of the 5 problems can be solved
    metrics = run_stage("distill", cfg, io)
    assert metrics["n_problems"] == 5 and metrics["accepted_problems"] == 2 and metrics["shortfall"] == 1
    assert len(read_shards(io.output("trajectories"))) == 10
