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


# Each hub copy's split in the layout its dataset card declares (field names and types), with as many rows
# as the benchmark has: what `datasets.load_dataset` returns for it.
HUB_LAYOUTS = {
    ("HuggingFaceH4/aime_2024", None, "train"): (30, lambda i: {"problem": f"P{i}?", "answer": str(i)}),
    ("MathArena/aime_2025", None, "train"): (
        30, lambda i: {"problem_idx": i + 1, "problem": f"P{i}?", "answer": str(i)}
    ),
    ("MathArena/hmmt_feb_2025", None, "train"): (
        30, lambda i: {"problem_idx": i + 1, "problem": f"P{i}?", "answer": f"\\frac{{1}}{{{i + 2}}}"}
    ),
    ("FlippyDora/amc23", None, "train"): (
        40, lambda i: {"id": i, "problem": f"P{i}?", "answer": float(i), "url": "u", "question": f"P{i}?"}
    ),
    ("lkevinzc/math-eval", None, "olympiad_bench"): (675, lambda i: {"problem": f"P{i}?", "answer": [str(i)]}),
    ("lkevinzc/math-eval", None, "minerva"): (272, lambda i: {"problem": f"P{i}?", "answer": [f"{i}\n"]}),
    ("HuggingFaceH4/MATH-500", None, "test"): (
        500, lambda i: {"problem": f"P{i}?", "solution": "s", "answer": str(i), "unique_id": f"u{i}"}
    ),
    ("WildEval/ZebraLogic", "mc_mode", "test"): (
        3, lambda i: {"id": f"z{i}", "puzzle": "p", "question": "q?", "choices": ["a", "b"], "answer": "b"}
    ),
}


def test_every_paper_benchmark_is_fetched_from_the_hub_whole(tmp_path, tiny_cfg, monkeypatch):
    """`npr data fetch` with sample_orz.source=hf gets every benchmark a qwen3-4b evaluation scores, in the
    layout its reader expects (a hub copy with other field names is renamed), and each loads in full."""
    import datasets

    from components.data import fetch
    from components.data.benchmarks import BENCHMARKS

    def load_dataset(repo_id, config=None, split=None):
        n, row = HUB_LAYOUTS[(repo_id, config, split)]
        return [row(i) for i in range(n)]

    def download_orz(name, out):
        out.mkdir(parents=True, exist_ok=True)
        (out / "orz.json").write_text(json.dumps([_item("What is 1 + 1?", "2")]))
        return out

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    monkeypatch.setattr(fetch, "hub_offline", lambda: False)
    monkeypatch.setattr(fetch, "download_hf_dataset", download_orz)
    dest = tmp_path / "data"
    summary = fetch.fetch_data(tiny_cfg.sample_orz.model_copy(update={"source": "hf"}), dest)
    assert summary["skipped"] == []
    for name, spec in BENCHMARKS.items():
        records = load_benchmark(name, dest / "benchmarks", full=spec.size is not None)
        assert len(records) == (spec.size or 3), name
    assert load_benchmark("aime25", dest / "benchmarks")[4]["problem"] == "P4?"  # renamed problem -> question
    assert load_benchmark("minerva", dest / "benchmarks")[5]["answers"] == ["5"]
