"""The time estimate per stage (components.training.time_estimate): its arithmetic on hand-worked cases,
the timeouts it sets a floor for, and README's table, which is `npr config estimate`'s output."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pytest

from components.config import gpu_profiles, load_config
from components.config_check import check_time, estimate_table, on_gpu, stage_estimates
from components.ops.gpus import GpuKind, TimeModel, load_gpu_catalogue
from components.training import time_estimate
from components.training.memory import ModelShape
from components.training.time_estimate import Throughput

ROOT = Path(__file__).resolve().parents[3]
SHAPE = ModelShape(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, head_dim=16, vocab=1000)
MODEL = TimeModel(train_mfu=0.5, decode_bandwidth=0.5, decode_mfu=0.5, timeout_margin=1.5)
KIND = GpuKind(memory_gib=80, bf16_tflops=1000, hbm_tb_s=2, instance_types=[])


def test_training_time_is_model_flops_over_the_reachable_peak():
    tp = Throughput.of(KIND, MODEL)
    assert tp.train_flops == 0.5 * 1000e12 and tp.decode_bytes == 0.5 * 2e12
    per_token = 2 * SHAPE.params + 4 * SHAPE.layers * SHAPE.q_width * 512  # mean context of a 1024 row
    assert time_estimate.training_seconds(SHAPE, 1e9, 1024, 4, False, tp) == pytest.approx(
        1e9 * 3 * per_token / (4 * 0.5e15)
    )
    # gradient checkpointing recomputes the forward: 4 passes instead of 3
    assert time_estimate.training_seconds(SHAPE, 1e9, 1024, 4, True, tp) == pytest.approx(
        1e9 * 4 * per_token / (4 * 0.5e15)
    )


def test_decode_is_bounded_by_the_kv_pool_and_reads_weights_and_kv_each_step():
    tp = Throughput.of(KIND, MODEL)
    prompt, new = 100, 900
    kv = SHAPE.kv_bytes_per_token(2)
    # a pool of 10 full sequences, 40 to decode on 2 servers of 1 GPU: 20 each, 2 waves of 10
    seconds = time_estimate.decode_seconds(SHAPE, 40, prompt, new, 2, 1, 10 * (prompt + new), None, tp)
    step_bytes = 2 * SHAPE.params + 10 * (prompt + new / 2) * kv
    step_flops = 10 * time_estimate.forward_flops_per_token(SHAPE, prompt + new / 2)
    step = max(step_bytes / tp.decode_bytes, step_flops / tp.decode_flops)
    prefill = 40 * prompt * time_estimate.forward_flops_per_token(SHAPE, prompt / 2) / (2 * tp.decode_flops)
    assert seconds == pytest.approx(2 * new * step + prefill)
    # capped by the requests in flight instead (4 over 2 servers: 2 at a time, 10 waves)
    capped = time_estimate.decode_seconds(SHAPE, 40, prompt, new, 2, 1, 10 * (prompt + new), 4, tp)
    assert capped > seconds


def test_every_gpu_stage_of_every_gpu_profile_has_an_estimate_within_its_timeout(in_repo):
    catalogue = load_gpu_catalogue()
    assert gpu_profiles() == ["qwen3-1.7b-1gpu", "qwen3-4b", "qwen3-4b-8xh100"]
    for profile in gpu_profiles():
        cfg = load_config(profile=profile)
        estimates = stage_estimates(cfg, catalogue)
        assert set(estimates) == set(cfg.orchestration.gpu_stages), profile
        for stage, est in estimates.items():
            assert est.seconds > 0 and not math.isnan(est.seconds), (profile, stage, est)
            floor = est.seconds * catalogue.time_model.timeout_margin
            assert cfg.orchestration.timeout_for(stage) >= floor, (profile, stage)
        assert all(r.ok for r in check_time(cfg)), profile


def test_a_timeout_below_the_margin_is_refused_naming_the_key(in_repo):
    cfg = load_config(profile="qwen3-4b", overrides=["orchestration.task_timeout_s.papo_rl=3600"])
    rows = {r.stage: r for r in check_time(cfg)}
    assert not rows["papo_rl"].ok
    assert re.search(r"set orchestration\.task_timeout_s\.papo_rl >= \d+", rows["papo_rl"].detail)
    assert rows["npr_zero"].ok


def test_a_slower_gpu_and_a_longer_budget_take_longer(in_repo):
    catalogue = load_gpu_catalogue()
    cfg = load_config(profile="qwen3-4b")
    h200 = stage_estimates(cfg, catalogue)
    h100 = stage_estimates(on_gpu(cfg, "H100"), catalogue)
    # decoding is bandwidth-bound: the H100's 3.35 TB/s against the H200's 4.8
    assert h100["distill"].seconds > h200["distill"].seconds
    longer = load_config(profile="qwen3-4b", overrides=["sr_rl.max_new_tokens=32000"])
    assert stage_estimates(longer, catalogue)["sr_rl"].seconds > h200["sr_rl"].seconds


README_TABLE = re.compile(r"<!-- npr config estimate -->\n(.*?)<!-- end npr config estimate -->", re.S)


def test_readme_table_is_what_npr_config_estimate_prints(in_repo):
    from typer.testing import CliRunner

    from components.cli import app

    printed = CliRunner().invoke(app, ["config", "estimate"])
    assert printed.exit_code == 0, printed.output
    assert printed.output == estimate_table([load_config(profile=p) for p in gpu_profiles()])
    found = README_TABLE.search((ROOT / "README.md").read_text())
    assert found, "README.md has no table between <!-- npr config estimate --> markers"
    assert found.group(1) == printed.output
