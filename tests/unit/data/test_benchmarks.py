"""Benchmark loaders: documented counts on the shared files, answer normalisation, ZebraLogic, tiny_test."""

from __future__ import annotations

import json

import pytest

from components.data.benchmarks import (
    BENCHMARKS,
    BenchmarkError,
    load_benchmark,
    normalise_answers,
    zebralogic_prompt,
)
from components.data.fetch import SMOKE_DIR
from components.data.problems import content_id
from components.data.sampling import write_problem_splits
from tests.conftest import SHARED_DATA

BENCH_DIR = SHARED_DATA / "benchmarks"
# the pinned sizes (BenchmarkSpec.size) are shared/data/MANIFEST.md's counts: checked below on the real files
COUNTS = {name: spec.size for name, spec in BENCHMARKS.items() if spec.size is not None}
needs_shared = pytest.mark.skipif(not BENCH_DIR.is_dir(), reason="shared benchmark files not on this machine")


@needs_shared
@pytest.mark.parametrize("name", sorted(COUNTS))
def test_offline_benchmarks_have_documented_counts(name):
    records = load_benchmark(name, BENCH_DIR, full=True)
    assert len(records) == COUNTS[name]
    assert len({r["id"] for r in records}) == len(records)
    for r in records:
        assert r["benchmark"] == name and r["problem"] and r["answers"]
        assert all(isinstance(a, str) and a == a.strip() and a for a in r["answers"])


@needs_shared
def test_answer_types_from_the_real_files():
    assert load_benchmark("amc23", BENCH_DIR, max_problems=1)[0]["answers"] == [
        "27"
    ]  # float 27.0 in the file
    assert load_benchmark("aime25", BENCH_DIR, max_problems=1)[0]["answers"] == ["70"]
    raw_minerva = json.loads((BENCH_DIR / BENCHMARKS["minerva"].relpath).read_text())
    assert any(a.endswith("\n") for row in raw_minerva for a in row["answer"])  # what gets stripped
    assert load_benchmark("hmmt25", BENCH_DIR, max_problems=2)[1]["id"] == "hmmt25-2"


def test_normalise_answers():
    assert normalise_answers(27.0) == ["27"]
    assert normalise_answers(2.5) == ["2.5"]
    assert normalise_answers(["9.6\n"]) == ["9.6"]
    assert normalise_answers(["1", ["2 "]]) == ["1", "2"]
    assert normalise_answers(" \\frac{1}{576}\n") == ["\\frac{1}{576}"]
    assert normalise_answers(None) == [] and normalise_answers("  ") == []


def test_smoke_set_loads_for_every_offline_benchmark():
    assert set(COUNTS) == {"aime24", "aime25", "hmmt25", "amc23", "olympiadbench", "minerva", "math500"}
    for name in COUNTS:
        records = load_benchmark(name, SMOKE_DIR, max_problems=3)
        assert len(records) == 3, name


@pytest.mark.parametrize("max_problems", [None, 3])
def test_a_full_evaluation_refuses_the_smoke_set(max_problems):
    # the committed data/ holds a few problems of each: scoring them as the benchmark would be a silent lie
    for name, size in COUNTS.items():
        with pytest.raises(BenchmarkError, match=rf"benchmark {name}: .* holds \d+ problems, the whole benchmark has {size}\. .*smoke: true"):
            load_benchmark(name, SMOKE_DIR, max_problems=max_problems, full=True)


def _zebra_rows():
    return [
        {
            "id": "lgp-test-2x2-1",
            "puzzle": "There are 2 houses, numbered 1 to 2.\n- Clue 1: Alice does not live in house 2.",
            "question": "Who lives in house 1?",
            "choices": ["Bob", "Alice"],
            "answer": "Alice",
        },
        {"id": "lgp-test-2x2-2", "puzzle": "P", "question": "Q?", "choices": ["x", "y", "z"], "answer": "x"},
    ]


def test_zebralogic_loader_on_crafted_file(tmp_path):
    path = tmp_path / BENCHMARKS["zebralogic"].relpath
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(_zebra_rows()))
    records = load_benchmark("zebralogic", tmp_path)
    assert [r["answers"] for r in records] == [["B"], ["A"]]
    assert records[0]["id"] == "zebralogic-lgp-test-2x2-1"
    assert records[0]["problem"] == (
        "Puzzle:\nThere are 2 houses, numbered 1 to 2.\n- Clue 1: Alice does not live in house 2.\n\n"
        "Question: Who lives in house 1?\n\nChoices:\nA. Bob\nB. Alice\n\nAnswer:"
    )
    with pytest.raises(BenchmarkError, match="not among the choices"):
        zebralogic_prompt({**_zebra_rows()[1], "answer": "w"})


def test_zebralogic_missing_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(FileNotFoundError, match="unreachable.*npr data fetch"):
        load_benchmark("zebralogic", tmp_path)


def test_jsonl_files_and_bad_rows(tmp_path):
    path = tmp_path / BENCHMARKS["aime25"].relpath
    path.parent.mkdir(parents=True)
    path.write_text('{"question": "Q1?", "answer": "1"}\n{"question": "Q2?", "answer": 2}\n')
    assert [r["answers"] for r in load_benchmark("aime25", tmp_path)] == [["1"], ["2"]]
    path.write_text('{"question": "Q1?", "answer": ""}\n')
    with pytest.raises(BenchmarkError, match="empty problem or answer"):
        load_benchmark("aime25", tmp_path)
    path.write_text('{"problem": "Q1?", "answer": "1"}\n')
    with pytest.raises(BenchmarkError, match="no field 'question'"):
        load_benchmark("aime25", tmp_path)
    with pytest.raises(KeyError, match="unknown benchmark"):
        load_benchmark("gsm8k", tmp_path)


def test_tiny_test_is_the_held_out_split(tmp_path):
    test = [
        {
            "id": content_id(f"Compute ({i} + 1) + (2 - 3).", str(i)),
            "problem": f"Compute ({i} + 1) + (2 - 3).",
            "answer": str(i),
            "source": "synthetic",
            "difficulty": "easy",
            "split": "test",
        }
        for i in range(1, 5)
    ]
    write_problem_splits(tmp_path, [], test, n_shards=1, manifest={})
    records = load_benchmark("tiny_test", "unused", max_problems=3, problems_dir=tmp_path)
    assert [r["answers"] for r in records] == [["1"], ["2"], ["3"]]
    assert records[0] == {
        "id": test[0]["id"],
        "benchmark": "tiny_test",
        "problem": test[0]["problem"],
        "answers": ["1"],
    }
    with pytest.raises(ValueError, match="pass problems_dir"):
        load_benchmark("tiny_test", "unused")
