"""Benchmarks that fit in one engine batch are decoded by one call and share its wall time."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from components.config import load_config
from components.data.synthetic import generate_problems
from components.evaluation import runner
from components.evaluation.config import BenchmarkSpec
from components.evaluation.job import eval_job

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
            model, tokenizer, None, problems, specs, eval_job(cfg, ["seed"]), "seed", "sequential", "parallel"
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


def test_the_speedup_decode_counts_each_modes_fastest_repeat_of_each_batch(monkeypatch):
    """A burst of other work slows one decode of a batch; with repeats the fastest decode of each mode counts,
    and the order of the modes flips every round as it does from batch to batch."""
    from types import SimpleNamespace

    from components.models.tiny import tiny_test_world

    _, tokenizer = tiny_test_world(seed=0)
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        cfg = load_config(
            profile="tiny",
            overrides=["evaluate.speedup.batch_size=2", "evaluate.speedup.repeats=3", "grading.workers=1"],
        )
        problems = generate_problems(4, 3, None)  # 2 batches
        tokens = {"parallel": 30, "sequential": 20}  # per response; the same every repeat (seeded decodes)
        # (batch, mode) -> walls of the 3 repeats: one slow outlier each, never the same round for both modes
        walls = {
            (0, "parallel"): [5.0, 1.0, 1.2],
            (0, "sequential"): [2.0, 2.0, 9.0],
            (1, "parallel"): [1.1, 1.0, 4.0],
            (1, "sequential"): [6.0, 2.2, 2.0],
        }
        calls: list[tuple[int, str]] = []

        def fake_decode(model, tok, tags, prompts, gen_cfg):
            batch = next(i for i, p in enumerate(problems) if p["problem"] in prompts[0]) // 2
            mode = gen_cfg.mode
            wall = walls[(batch, mode)][sum(1 for c in calls if c == (batch, mode))]
            calls.append((batch, mode))
            gens = [
                SimpleNamespace(
                    total_tokens=tokens[mode],
                    critical_path_tokens=tokens[mode] // 2,
                    parallel_taken=mode == "parallel",
                )
                for _ in prompts
            ]
            return gens, wall

        monkeypatch.setattr(runner, "_decode", fake_decode)
        critical = {"critical_path_tokens": tokens["parallel"] // 2}
        monkeypatch.setattr(runner, "_structure", lambda g, tags, schema: critical)
        summary, par, seq = runner.measure_speedup(None, tokenizer, None, problems, eval_job(cfg), "parallel")
    finally:
        os.chdir(cwd)
    # round r of batch i puts parallel first when i + r is even
    assert [m for b, m in calls if b == 0][:2] == ["parallel", "sequential"]
    assert [m for b, m in calls if b == 0][2:4] == ["sequential", "parallel"]
    assert [m for b, m in calls if b == 1][:2] == ["sequential", "parallel"]
    assert len(calls) == 2 * 2 * 3 and summary["repeats"] == 3
    assert summary["parallel_wall_s"] == pytest.approx(1.0 + 1.0)
    assert summary["sequential_wall_s"] == pytest.approx(2.0 + 2.0)
    assert summary["parallel_tokens"] == 4 * 30 and summary["sequential_tokens"] == 4 * 20
    assert summary["achieved_speedup"] == pytest.approx((120 / 2.0) / (80 / 4.0))  # 3.0
    assert summary["ideal_speedup"] == pytest.approx(2.0)
    assert summary["efficiency"] == pytest.approx(1.5)
    assert len(par) == len(seq) == 4


def test_the_speedup_decode_repeats_a_batch_at_least_once():
    with pytest.raises(Exception, match="repeats"):
        load_config(profile="tiny", overrides=["evaluate.speedup.repeats=0"])


@pytest.mark.parametrize("mode", ["parallel", "sequential"])
def test_a_repeated_speedup_decode_samples_the_same_tokens(mode):
    """The fastest-of-N rule compares decodes of the same tokens: the engine seeds each request, so decoding
    a batch again (as ``speedup.repeats`` does) samples exactly what the first decode sampled."""
    from components.models.tiny import tiny_test_world

    model, tokenizer = tiny_test_world(seed=0)
    cwd = os.getcwd()
    os.chdir(REPO)
    try:
        cfg = load_config(profile="tiny", overrides=["evaluate.generation.max_new_tokens=24"])
        prompts = [
            runner.render_prompt(tokenizer, p["problem"], cfg.prompts, "parallel")
            for p in generate_problems(2, 5, None)
        ]
        gen_cfg = runner.generation_config(cfg.evaluate, mode).model_copy(update={"batch_size": 2})
        tags = runner._tags_for(tokenizer, cfg.schema_name, mode)
        first, _ = runner._decode(model, tokenizer, tags, prompts, gen_cfg)
        again, _ = runner._decode(model, tokenizer, tags, prompts, gen_cfg)
    finally:
        os.chdir(cwd)
    assert [g.token_ids for g in first] == [g.token_ids for g in again]
    assert sum(g.total_tokens for g in first) > 0


def test_a_benchmark_not_marked_smoke_must_be_the_whole_benchmark() -> None:
    from components.data.benchmarks import BenchmarkError
    from components.data.fetch import SMOKE_DIR
    from components.evaluation.config import BenchmarkSpec, EvaluateConfig

    ecfg = EvaluateConfig(benchmark_dir=str(SMOKE_DIR))
    with pytest.raises(BenchmarkError, match="the whole benchmark has 30"):
        runner.load_benchmark_problems(BenchmarkSpec(name="aime24", n_samples=1, k=1), ecfg, None)
    smoke = BenchmarkSpec(name="aime24", n_samples=1, k=1, max_problems=3, smoke=True)
    assert len(runner.load_benchmark_problems(smoke, ecfg, None)) == 3
