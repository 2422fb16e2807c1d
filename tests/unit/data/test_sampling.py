"""Seeded train/test sampling, the problems directory and load_problems."""

from __future__ import annotations

import json

import pytest

from components.data.problems import content_id, load_problems, load_tuning_split
from components.data.sampling import (
    difficulty_counts,
    rows_sha256,
    sample_splits,
    split_problems,
    write_problem_splits,
)


def _rows(n):
    return [
        {
            "id": content_id(f"Problem {i}?", str(i)),
            "problem": f"Problem {i}?",
            "answer": str(i),
            "source": "t",
            "difficulty": "easy" if i % 3 else "hard",
        }
        for i in range(n)
    ]


def test_same_seed_same_ids_whatever_the_input_order_and_different_seed_differs():
    rows = _rows(200)
    train_a, test_a = sample_splits(rows, n=50, test_n=20, seed=3)
    train_b, test_b = sample_splits(list(reversed(rows)), n=50, test_n=20, seed=3)
    assert [r["id"] for r in train_a] == [r["id"] for r in train_b]
    assert [r["id"] for r in test_a] == [r["id"] for r in test_b]
    train_c, test_c = sample_splits(rows, n=50, test_n=20, seed=4)
    assert {r["id"] for r in train_c} != {r["id"] for r in train_a}
    assert {r["id"] for r in test_c} != {r["id"] for r in test_a}


def test_test_split_is_held_out_and_stable_when_n_changes():
    rows = _rows(100)
    train, test = sample_splits(rows, n=60, test_n=15, seed=0)
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert {r["split"] for r in train} == {"train"} and {r["split"] for r in test} == {"test"}
    _, test_small = sample_splits(rows, n=10, test_n=15, seed=0)
    assert test_small == test


def test_asking_for_more_than_available_is_a_clear_error():
    with pytest.raises(ValueError, match="lower sample_orz.n"):
        sample_splits(_rows(10), n=8, test_n=3, seed=0)
    dup = _rows(3) + _rows(1)
    with pytest.raises(ValueError, match="unique ids"):
        sample_splits(dup, n=2, test_n=0, seed=0)


def test_write_and_load_round_trip_with_manifest(tmp_path):
    train, test = sample_splits(_rows(30), n=20, test_n=5, seed=1)
    manifest = write_problem_splits(tmp_path, train, test, n_shards=3, manifest={"seed": 1})
    assert manifest["counts"] == {"train": 20, "test": 5}
    assert manifest["shards"]["train"] == ["train-00000.jsonl", "train-00001.jsonl", "train-00002.jsonl"]
    assert manifest["per_difficulty"]["train"] == difficulty_counts(train)
    assert load_problems(tmp_path, "train") == train
    assert load_problems(tmp_path, "test") == test
    # a partial copy (one shard lost) is caught by the manifest count
    (tmp_path / "train-00002.jsonl").unlink()
    with pytest.raises(ValueError, match="manifest says 20 train"):
        load_problems(tmp_path, "train")
    with pytest.raises(ValueError, match="unknown split"):
        load_problems(tmp_path, "validation")
    with pytest.raises(FileNotFoundError):
        load_problems(tmp_path / "nope", "train")


def test_rows_sha256_pinned_and_order_sensitive():
    rows = [{"id": "a", "problem": "p", "answer": "1"}]
    import hashlib

    expected = hashlib.sha256((json.dumps(["a", "p", "1"]) + "\n").encode()).hexdigest()
    assert rows_sha256(rows) == expected
    two = _rows(2)
    assert rows_sha256(two) != rows_sha256(list(reversed(two)))


def test_validation_split_is_carved_before_train_and_test_does_not_move():
    rows = _rows(200)
    splits = split_problems(rows, n=100, test_n=20, seed=3, val_n=30)
    assert [len(splits[s]) for s in ("train", "val", "test")] == [100, 30, 20]
    ids = {s: {r["id"] for r in splits[s]} for s in splits}
    assert not ids["train"] & ids["val"] and not ids["val"] & ids["test"] and not ids["train"] & ids["test"]
    assert {r["split"] for r in splits["val"]} == {"val"}
    _, test = sample_splits(rows, n=100, test_n=20, seed=3)
    assert test == splits["test"]
    with pytest.raises(ValueError, match="val_n=30"):
        split_problems(rows, n=160, test_n=20, seed=3, val_n=30)


def test_partitioned_source_draws_each_split_from_its_own_partition():
    rows = _rows(300)

    def part(rid):
        return {0: "test", 1: "val"}.get(int(rid, 16) % 5, "train")

    splits = split_problems(rows, n=100, test_n=20, seed=0, val_n=20, partition_of=part)
    for name in ("train", "val", "test"):
        assert {part(r["id"]) for r in splits[name]} == {name}
    available = sum(part(r["id"]) == "test" for r in rows)
    with pytest.raises(ValueError, match="test partition"):
        split_problems(rows, n=10, test_n=available + 1, seed=0, partition_of=part)


def test_val_split_round_trip_and_tuning_split(tmp_path):
    splits = split_problems(_rows(60), n=30, test_n=10, seed=1, val_n=10)
    manifest = write_problem_splits(
        tmp_path, splits["train"], splits["test"], n_shards=2, manifest={}, val=splits["val"]
    )
    assert manifest["counts"] == {"train": 30, "test": 10, "val": 10}
    assert load_problems(tmp_path, "val") == splits["val"]
    assert load_tuning_split(tmp_path) == ("val", splits["val"])
    # without a validation split, in-stage measurements fall back to the test split
    old = tmp_path / "old"
    write_problem_splits(old, splits["train"], splits["test"], n_shards=1, manifest={})
    assert load_problems(old, "val") == []
    assert load_tuning_split(old) == ("test", splits["test"])
