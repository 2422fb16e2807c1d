"""`npr data fetch`: copying a shared/data-like directory, the smoke set, idempotence, bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import load_config
from components.data.benchmarks import load_benchmark
from components.data.fetch import SMOKE_DIR, fetch_data


def _item(problem, answer):
    return [{"from": "human", "value": problem}, {"from": "assistant", "ground_truth": {"value": answer}}]


@pytest.fixture
def source(tmp_path) -> Path:
    src = tmp_path / "src"
    (src / "orz" / "eval_data").mkdir(parents=True)
    (src / "orz" / "train.json").write_text(json.dumps([_item("What is 1 + 1?", "2")]))
    (src / "orz" / "eval_data" / "aime.json").write_text(json.dumps([{"prompt": [], "final_answer": "1"}]))
    cut = json.dumps([_item("What is 2 + 2?", "4"), _item("What is 3 + 3?", "6")], indent=4)
    (src / "orz" / "cut.json").write_text(cut[: cut.rindex("What is 3")])
    bench = src / "benchmarks" / "npr" / "AIME25"
    bench.mkdir(parents=True)
    (bench / "aime25.json").write_text(json.dumps([{"question": "Q?", "answer": "70"}]))
    (bench / "aime2025-I.jsonl").write_text('{"question": "Q?", "answer": "70"}\n')
    return src


@pytest.fixture(scope="module")
def tiny_cfg():
    return load_config(profile="tiny")


def test_copy_from_dir_keeps_layout_skips_other_schemas_and_reports_truncation(tmp_path, source, tiny_cfg):
    dest = tmp_path / "data"
    summary = fetch_data(tiny_cfg.sample_orz, dest, source)
    assert sorted(summary["copied"]) == [
        "benchmarks/npr/AIME25/aime2025-I.jsonl",
        "benchmarks/npr/AIME25/aime25.json",
        "orz/cut.json",
        "orz/train.json",
    ]
    assert [s["path"] for s in summary["skipped"]] == ["orz/eval_data/aime.json"]
    assert "eval data" in summary["skipped"][0]["reason"]
    assert summary["truncated"] == [
        {
            "path": "orz/cut.json",
            "complete_items": 1,
            "bytes_dropped": summary["truncated"][0]["bytes_dropped"],
        }
    ]
    assert (dest / "orz" / "train.json").read_bytes() == (source / "orz" / "train.json").read_bytes()
    assert load_benchmark("aime25", dest / "benchmarks")[0]["answers"] == ["70"]


def test_fetch_is_idempotent(tmp_path, source, tiny_cfg):
    dest = tmp_path / "data"
    fetch_data(tiny_cfg.sample_orz, dest, source)
    target = dest / "orz" / "train.json"
    before = target.stat().st_mtime_ns
    again = fetch_data(tiny_cfg.sample_orz, dest, source)
    assert again["copied"] == [] and len(again["unchanged"]) == 4
    assert target.stat().st_mtime_ns == before
    (source / "orz" / "train.json").write_text(json.dumps([_item("What is 5 + 5?", "10")]))
    changed = fetch_data(tiny_cfg.sample_orz, dest, source)
    assert changed["copied"] == ["orz/train.json"]


def test_corrupt_benchmark_file_is_an_error(tmp_path, source, tiny_cfg):
    (source / "benchmarks" / "npr" / "AIME25" / "aime25.json").write_text("[{broken")
    with pytest.raises(ValueError, match="does not parse"):
        fetch_data(tiny_cfg.sample_orz, tmp_path / "data", source)
    with pytest.raises(FileNotFoundError, match="neither orz/ nor benchmarks/"):
        fetch_data(tiny_cfg.sample_orz, tmp_path / "data", tmp_path / "data" / "benchmarks" / "npr")


def test_tiny_profile_without_source_writes_the_smoke_set(tmp_path, tiny_cfg):
    dest = tmp_path / "data"
    summary = fetch_data(tiny_cfg.sample_orz, dest, None)
    assert summary["mode"] == "smoke" and len(summary["copied"]) == 7
    for rel in summary["copied"]:
        assert (dest / rel).read_bytes() == (SMOKE_DIR / rel.removeprefix("benchmarks/")).read_bytes()
    assert fetch_data(tiny_cfg.sample_orz, dest, None)["copied"] == []


def test_hub_source_offline_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cfg = load_config(profile="qwen3-4b")
    with pytest.raises(ConnectionError, match="--from DIR"):
        fetch_data(cfg.sample_orz, tmp_path / "data", None)
