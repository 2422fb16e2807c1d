"""`npr eval --benchmarks path/to/file.jsonl`: a user's own file is decoded, graded and reported by the same
code as a registered benchmark (same records, problem for problem); a bad file is one line and exit 2."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from components.artifacts import read_json, read_shards, write_shards
from components.cli import app
from components.dag import StageIO

REPO = Path(__file__).resolve().parents[3]
N_PROBLEMS = 3
FAST = [
    "--set", "evaluate.measure_speedup=false",  # first: the parallel test below drops it
    "--set", "evaluate.generation.max_new_tokens=12",
    "--set", "grading.workers=1",
    "--set", "run.torch_threads=1",
    "--set", "tracking.mode=disabled",
]  # fmt: skip


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    from components.data.synthetic import generate_problems
    from components.models.loading import save_model
    from components.models.tiny import tiny_test_world

    root = tmp_path_factory.mktemp("userbench")
    model, tokenizer = tiny_test_world(seed=0)
    save_model(model, tokenizer, root / "seed" / "model")
    problems = [dict(p, split="test") for p in generate_problems(N_PROBLEMS, 7, None)]
    write_shards(root / "sample_orz" / "problems", problems, 1, stem="test")
    # the same problems as the user's own file, under the user's field names
    lines = [json.dumps({"question": p["problem"], "solution": p["answer"], "id": p["id"]}) for p in problems]
    (root / "mine.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    io = StageIO(
        stage="evaluate",
        inputs={"sample_orz/problems": root / "sample_orz" / "problems"},
        outputs={},
        metrics=root / "unused.json",
    )
    yield {"root": root, "problems": problems, "io": io}


def _eval(world: dict[str, Any], benchmark: str, out: Path, *extra: str) -> Any:
    args = ["eval", "--checkpoint", str(world["root"] / "seed" / "model"), "--benchmarks", benchmark]
    args += ["--k", "1", "--mode", "sequential", "--out", str(out), "--json", *FAST, *extra]
    return CliRunner().invoke(app, args)


def _comparable(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: v for k, v in r.items() if k not in ("benchmark", "problem_id")} for r in records]


@pytest.mark.slow
def test_a_user_jsonl_is_scored_like_the_registered_benchmark(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_repo: Path
) -> None:
    from components.evaluation import adhoc

    monkeypatch.setattr(adhoc, "stage_io", lambda stage: world["io"])
    mine = world["root"] / "mine.jsonl"
    user = _eval(
        world, str(mine), tmp_path / "user", "--problem-field", "question", "--answer-field", "solution"
    )
    assert user.exit_code == 0, (user.output, user.exception)
    registered = _eval(world, "tiny_test", tmp_path / "registered")
    assert registered.exit_code == 0, (registered.output, registered.exception)

    user_metrics = read_json(tmp_path / "user" / "metrics.json")["checkpoints"]["seed"]["benchmarks"]
    reg_metrics = read_json(tmp_path / "registered" / "metrics.json")["checkpoints"]["seed"]["benchmarks"]
    assert list(user_metrics) == ["mine"] and user_metrics["mine"]["n_problems"] == N_PROBLEMS
    user_records = read_shards(tmp_path / "user" / "records" / "seed", stem="mine")
    reg_records = read_shards(tmp_path / "registered" / "records" / "seed", stem="tiny_test")
    assert [r["answers"] for r in user_records] == [[p["answer"]] for p in world["problems"]]
    assert [r["problem_id"] for r in user_records] == [f"mine-{p['id']}" for p in world["problems"]]
    # same prompts, same samples, same grades: one code path
    assert _comparable(user_records) == _comparable(reg_records)
    for key in ("accuracy", "format_valid_rate", "total_tokens", "n_samples", "k"):
        assert user_metrics["mine"][key] == reg_metrics["tiny_test"][key], key
    report = (tmp_path / "user" / "report" / "report.md").read_text(encoding="utf-8")
    assert "mine (avg@1)" in report


@pytest.mark.slow
def test_a_user_file_in_parallel_mode_is_its_own_speedup_benchmark(
    world: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, in_repo: Path
) -> None:
    """The profile's speedup benchmark (tiny_test) is not evaluated here: the speedup decode uses the
    user's file instead of failing with no problems."""
    from components.evaluation import adhoc

    monkeypatch.setattr(adhoc, "stage_io", lambda stage: world["io"])
    args = ["eval", "--checkpoint", str(world["root"] / "seed" / "model"), "--benchmarks",
            str(world["root"] / "mine.jsonl"), "--problem-field", "question", "--answer-field", "solution",
            "--k", "1", "--mode", "parallel", "--out", str(tmp_path / "par"), "--json",
            *FAST[2:], "--set", "evaluate.speedup.benchmark=tiny_test", "--set", "evaluate.speedup.checkpoints=[seed]"]  # fmt: skip
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, (result.output, result.exception)
    ckpt = read_json(tmp_path / "par" / "metrics.json")["checkpoints"]["seed"]
    assert ckpt["speedup"]["n_problems"] == N_PROBLEMS


def _one_line_exit_2(result: Any, *needles: str) -> None:
    assert result.exit_code == 2, (result.exit_code, result.output, result.exception)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


@pytest.mark.parametrize(
    ("content", "needles"),
    [
        (b'{"q": "1+1", "a": "2"}\n', ["row 0 has no field 'problem'", "--problem-field"]),
        (b"not json at all\n", ["neither a JSON list nor JSON Lines"]),
        (b"", ["no rows"]),
        (b"\xff\xfe\n", ["not UTF-8"]),
        (b'{"problem": "1+1", "answer": ""}\n', ["empty problem or answer"]),
        (b"[1, 2]\n", ["expected a list of objects"]),
        (b"3\n4\n", ["row 0 is not a JSON object"]),
    ],
    ids=["missing-field", "not-json", "empty", "binary", "empty-answer", "list-of-numbers", "jsonl-numbers"],
)
def test_a_bad_benchmark_file_is_one_line_and_exit_2(
    world: dict[str, Any], tmp_path: Path, in_repo: Path, content: bytes, needles: list[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(content)
    _one_line_exit_2(_eval(world, str(bad), tmp_path / "out"), str(bad), *needles)


def test_a_missing_file_or_unknown_name_is_one_line_and_exit_2(
    world: dict[str, Any], tmp_path: Path, in_repo: Path
) -> None:
    _one_line_exit_2(
        _eval(world, str(tmp_path / "nope.jsonl"), tmp_path / "out"), "nope.jsonl", "does not exist"
    )
    _one_line_exit_2(_eval(world, "no_such_bench", tmp_path / "out"), "unknown benchmark 'no_such_bench'")
