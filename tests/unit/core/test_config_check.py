"""`npr config check`: both profiles pass every static check; a bad config fails naming the setting."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from components.cli import app
from components.config import load_config
from components.config_check import check_profile


def _failures(profile: str, overrides: list[str] | None = None) -> list[str]:
    cfg = load_config(profile=profile, overrides=overrides or [])
    return [f"{r.check}/{r.stage}: {r.detail}" for r in check_profile(cfg) if not r.ok]


@pytest.mark.parametrize("profile", ["tiny", "qwen3-4b"])
def test_every_profile_passes_every_check(profile):
    assert _failures(profile) == []


def test_the_checks_cover_what_a_gpu_run_needs():
    rows = check_profile(load_config(profile="qwen3-4b"))
    assert {r.check for r in rows} == {
        "validation split",
        "memory plan",
        "context length",
        "GPU count",
        "Ray",
        "verl validation",
    }
    assert {r.stage for r in rows if r.check == "verl validation"} == {"npr_zero", "papo_rl", "sr_rl", "pr1_rl"}
    gpus = {r.stage: r.detail for r in rows if r.check == "GPU count"}
    assert gpus["seed"].startswith("0 GPU(s)")  # it only materialises the hub model
    assert gpus["evaluate"].startswith("8 GPU(s)")  # the SGLang server it launches: TP 1 x DP 8
    assert gpus["pr1_coldstart"].startswith("8 GPU(s)")  # FSDP over one node, like the warmups
    assert gpus["papo_rl"].startswith("8 GPU(s)")  # its own Ray head on an 8-GPU node


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        (
            ["evaluate.generation.backend=torch", "evaluate.generation.batch_size=64"],
            "evaluate.generation.batch_size",
        ),
        (["parallel_warmup.gradient_checkpointing=false"], "parallel_warmup.gradient_checkpointing"),
        (
            [
                "orchestration.gpu_stages=[seed,npr_zero,distill,parallel_warmup,sequential_warmup,papo_rl,sr_rl,evaluate]"
            ],
            "orchestration.gpu_stages",
        ),
        (["orchestration.gpu_stages=[npr_zero]"], "orchestration.gpu_stages"),
        (["distill.generation.max_new_tokens=39500"], "context_length"),
        (["npr_zero.verl.max_prompt_length=300000"], "npr_zero.verl.max_prompt_length"),
        (["papo_rl.verl.ray_address=http://ray-head:8265"], "papo_rl.verl.shared_dir"),
        (["sr_rl.verl.rollout_tp=3"], "sr_rl.verl.rollout_tp"),
        (["sample_orz.test_n=0"], "sample_orz.test_n"),
        (["orchestration.gpu.memory_gib=24"], "papo_rl.verl"),
    ],
)
def test_a_bad_config_fails_with_the_setting_named(overrides, named):
    failures = _failures("qwen3-4b", overrides)
    assert failures, f"{overrides} passed every check"
    assert any(named in f for f in failures), failures


def test_cli_prints_the_table_and_exits_1_on_a_failure(in_repo):
    runner = CliRunner()
    ok = runner.invoke(app, ["config", "check", "--profile", "qwen3-4b"])
    assert ok.exit_code == 0, ok.output
    assert "all" in ok.output and "checks passed" in ok.output
    bad = runner.invoke(
        app,
        ["config", "check", "--profile", "qwen3-4b", "--set", "parallel_warmup.gradient_checkpointing=false"],
    )
    assert bad.exit_code == 1
    assert "parallel_warmup.gradient_checkpointing" in bad.output and "FAIL" in bad.output
