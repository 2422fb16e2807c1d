"""Stage `sample_orz` end to end on small inputs: synthetic and local ORZ sources, determinism, floor failure."""

from __future__ import annotations

import json

import pytest

from components.artifacts import read_json
from components.config import load_config
from components.dag import StageIO
from components.data.problems import load_problems
from components.data.quality import DataQualityError
from components.stages import sample_orz

pytestmark = pytest.mark.slow  # imports Great Expectations (~5 s) and validates twice per run


def _io(root):
    return StageIO(stage="sample_orz", outputs={"problems": root / "problems", "audit": root / "audit"})


def _cfg(**sample):
    cfg = load_config(profile="tiny")
    # the local-source tests hold a few dozen rows: no validation split unless a test asks for one
    cfg.sample_orz = cfg.sample_orz.model_copy(update={"val_n": 0, **sample})
    return cfg


def test_synthetic_source_outputs_metrics_and_determinism(tmp_path):
    # each split is drawn from its own partition of the problem space (5% test, 5% val), so the pool must
    # hold enough of each
    cfg = _cfg(synthetic_pool=2000, n=150, test_n=40, val_n=30, n_shards=2, seed=5)
    metrics = sample_orz.run(cfg, _io(tmp_path / "a"))
    assert metrics["rows_in"] == 2000 and metrics["kept"] == 2000
    assert metrics["quarantined"] == metrics["duplicates"] == 0
    assert (metrics["n_train"], metrics["n_val"], metrics["n_test"]) == (150, 30, 40)
    assert sum(metrics["per_difficulty"]["train"].values()) == 150
    problems = tmp_path / "a" / "problems"
    assert sorted(p.name for p in problems.iterdir()) == [
        "manifest.json",
        "test-00000.jsonl",
        "train-00000.jsonl",
        "train-00001.jsonl",
        "val-00000.jsonl",
    ]
    train, test = load_problems(problems, "train"), load_problems(problems, "test")
    val = load_problems(problems, "val")
    assert not {r["id"] for r in train} & {r["id"] for r in test}
    assert not {r["id"] for r in val} & ({r["id"] for r in train} | {r["id"] for r in test})
    assert {"id", "problem", "answer", "source", "difficulty", "split"} <= set(train[0])
    manifest = read_json(problems / "manifest.json")
    assert manifest["seed"] == 5 and manifest["source"]["source"] == "synthetic"
    assert len(manifest["input_sha256"]) == 64 and manifest["config"]["n"] == 150
    audit = tmp_path / "a" / "audit"
    rec = read_json(audit / "reconciliation.json")
    assert rec["rows_in"] == rec["kept"] + rec["quarantined"] + rec["duplicates"]
    assert (audit / "gx_docs" / "index.html").exists()

    sample_orz.run(cfg, _io(tmp_path / "b"))
    assert [r["id"] for r in load_problems(tmp_path / "b" / "problems", "train")] == [r["id"] for r in train]


def _item(problem, answer):
    return [{"from": "human", "value": problem}, {"from": "assistant", "ground_truth": {"value": answer}}]


def test_local_orz_source_with_bad_rows_and_a_truncated_file(tmp_path):
    orz_dir = tmp_path / "orz"
    orz_dir.mkdir()
    good = [_item(f"How many apples are in basket {i}?", str(i)) for i in range(40)]
    bad = [_item("", "1"), _item("How many pears are there?", None), good[0]]
    (orz_dir / "a.json").write_text(json.dumps(good + bad))
    cut = json.dumps([_item("What is 12 squared?", "144"), _item("What is 13 squared?", "169")], indent=4)
    (orz_dir / "b.json").write_text(cut[: cut.rindex("13 squared")])
    cfg = _cfg(source="local", local_path=str(orz_dir), n=30, test_n=5, val_n=0, min_kept_fraction=0.9)
    with pytest.raises(Exception, match="recover_truncated"):
        sample_orz.run(cfg, _io(tmp_path / "out"))
    cfg.sample_orz = cfg.sample_orz.model_copy(update={"recover_truncated": True})
    metrics = sample_orz.run(cfg, _io(tmp_path / "out"))
    assert (metrics["rows_in"], metrics["kept"], metrics["quarantined"], metrics["duplicates"]) == (
        44,
        41,
        2,
        1,
    )
    assert metrics["quarantine_reasons"] == {"answer_missing": 1, "problem_empty": 1, "problem_too_short": 1}
    manifest = read_json(tmp_path / "out" / "problems" / "manifest.json")
    files = {f["path"].rsplit("/", 1)[-1]: f for f in manifest["source"]["files"]}
    assert files["b.json"]["truncated"] and files["b.json"]["items"] == 1
    assert load_problems(tmp_path / "out" / "problems", "train")[0]["source"] == "orz"


def test_floor_failure_writes_audit_aside_and_leaves_outputs_alone(tmp_path):
    orz_dir = tmp_path / "orz"
    orz_dir.mkdir()
    rows = [_item(f"Question number {i}?", str(i)) for i in range(5)] + [_item("Hi", "1")] * 3
    (orz_dir / "a.json").write_text(json.dumps(rows))
    out = tmp_path / "artifacts" / "sample_orz"
    (out / "problems").mkdir(parents=True)
    (out / "problems" / "previous.txt").write_text("kept")
    cfg = _cfg(source="local", local_path=str(orz_dir), n=2, test_n=0, val_n=0, min_kept_fraction=0.9)
    with pytest.raises(DataQualityError, match="only 5/8 rows"):
        sample_orz.run(cfg, _io(out))
    assert (out / "problems" / "previous.txt").read_text() == "kept"
    assert not (out / "audit").exists()
    failed = read_json(out / "work" / "audit-failed" / "reconciliation.json")
    assert (failed["kept"], failed["quarantined"], failed["duplicates"]) == (5, 3, 0)


def test_wrong_typed_fields_are_quarantined_with_their_raw_value(tmp_path):
    orz_dir = tmp_path / "orz"
    orz_dir.mkdir()
    good = [_item(f"How many apples are in basket {i}?", str(i)) for i in range(40)]
    bad = [
        _item(123456, "7"),
        _item("What is zero over zero?", float("nan")),
        _item("Is this a boolean answer?", True),
        _item("Which list is the answer?", [1, 2]),
        _item("Which dict is the answer?", {"a": 1}),
    ]
    (orz_dir / "a.json").write_text(json.dumps(good + bad))  # json writes NaN as the JS literal
    cfg = _cfg(source="local", local_path=str(orz_dir), n=30, test_n=5, min_kept_fraction=0.5)
    out = tmp_path / "out"
    metrics = sample_orz.run(cfg, _io(out))
    assert metrics["quarantine_reasons"] == {
        "answer_not_finite": 1,
        "answer_wrong_type": 3,
        "problem_not_text": 1,
    }
    quarantine = [json.loads(line) for line in (out / "audit" / "quarantine.jsonl").read_text().splitlines()]
    raw = {r["origin"]: (r["reasons"], r["raw_fields"]) for r in quarantine}
    assert raw["a.json#40"] == (["problem_not_text"], {"problem": {"type": "int", "value": 123456}})
    assert raw["a.json#41"] == (["answer_not_finite"], {"answer": {"type": "float", "value": "NaN"}})
    assert raw["a.json#42"] == (["answer_wrong_type"], {"answer": {"type": "bool", "value": True}})
    assert raw["a.json#43"][1] == {"answer": {"type": "list", "value": [1, 2]}}
    train = load_problems(out / "problems", "train") + load_problems(out / "problems", "test")
    assert all(isinstance(r["answer"], str) and r["answer"] != "nan" for r in train)


def test_too_few_rows_for_n_keeps_the_audit_where_the_error_says(tmp_path):
    orz_dir = tmp_path / "orz"
    orz_dir.mkdir()
    (orz_dir / "a.json").write_text(json.dumps([_item(f"Question number {i}?", str(i)) for i in range(10)]))
    out = tmp_path / "artifacts" / "sample_orz"
    cfg = _cfg(source="local", local_path=str(orz_dir), n=20, test_n=5, min_kept_fraction=0.5)
    with pytest.raises(DataQualityError, match="only 10 passed") as err:
        sample_orz.run(cfg, _io(out))
    failed = out / "work" / "audit-failed"
    assert str(failed) in str(err.value)
    assert read_json(failed / "reconciliation.json")["kept"] == 10
    assert (failed / "gx_docs" / "index.html").exists() and not (out / "problems").exists()
