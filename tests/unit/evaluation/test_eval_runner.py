"""Benchmarks that fit in one engine batch are decoded by one call and share its wall time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.config import load_config
from components.data.synthetic import generate_problems
from components.evaluation import runner
from components.evaluation.config import BenchmarkSpec

REPO = Path(__file__).resolve().parents[3]


def spec(name: str, n_samples: int) -> BenchmarkSpec:
    return BenchmarkSpec(name=name, n_samples=n_samples, k=1)


def test_decode_groups_fill_one_batch_at_a_time():
    specs = [spec("big", 4), spec("a", 1), spec("b", 2), spec("c", 1), spec("d", 1)]
    sizes = {"big": 100, "a": 3, "b": 3, "c": 3, "d": 2}
    groups = runner.decode_groups(specs, sizes, batch_size=16)
    # big: 400 samples, alone; a+b+c = 3+6+3 = 12, d's 2 still fit (14 <= 16)
    assert [[s.name for s in g] for g in groups] == [["big"], ["a", "b", "c", "d"]]
    groups = runner.decode_groups(specs, sizes, batch_size=10)
    assert [[s.name for s in g] for g in groups] == [["big"], ["a", "b"], ["c", "d"]]


def test_grouped_benchmarks_decode_once_and_split_the_wall_by_tokens(monkeypatch):
    from components.models.tiny import tiny_test_world

    model, tokenizer = tiny_test_world(seed=0)
    cwd = os.getcwd()
    os.chdir(REPO)  # prompt files are read relative to the repository root
    try:
        cfg = load_config(
            profile="tiny",
            overrides=[
                "evaluate.generation.max_new_tokens=12",
                "evaluate.generation.batch_size=8",
                "grading.workers=1",
            ],
        )
        pool = [dict(p, answers=[p["answer"]]) for p in generate_problems(8, 3, None)]
        problems = {"a": pool[:2], "b": pool[2:5], "c": pool[5:8]}
        specs = [spec("a", 2), spec("b", 1), spec("c", 2)]  # a+b: 7 samples in one batch of 8; c: 6
        calls = []
        real = runner._decode

        def counting(*args):
            gens, wall = real(*args)
            calls.append((len(gens), wall))
            return gens, wall

        monkeypatch.setattr(runner, "_decode", counting)
        out = runner.evaluate_benchmarks(
            model, tokenizer, None, problems, specs, cfg, "seed", "sequential", "parallel"
        )
    finally:
        os.chdir(cwd)
    assert [n for n, _ in calls] == [7, 6]
    assert {name: len(records) for name, (records, _) in out.items()} == {"a": 4, "b": 3, "c": 6}
    assert {r["benchmark"] for r in out["b"][0]} == {"b"}
    assert [r["problem_id"] for r in out["b"][0]] == [str(p["id"]) for p in problems["b"]]
    assert out["a"][1] + out["b"][1] == pytest.approx(calls[0][1])
    assert out["c"][1] == calls[1][1]

    def rate(name):
        records, wall = out[name]
        return sum(r["n_tokens"] for r in records) / wall

    assert rate("a") == pytest.approx(rate("b"))  # one call, one throughput
