"""`npr config check`: both profiles pass every static check; a bad config fails naming the setting."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli import app
from components.config import load_config
from components.config_check import check_profile, ray_shared_mounts

# every profile file, overlays included (configs/*.yaml)
PROFILES = sorted(p.stem for p in (Path(__file__).resolve().parents[3] / "configs").glob("*.yaml"))


def _failures(profile: str, overrides: list[str] | None = None) -> list[str]:
    cfg = load_config(profile=profile, overrides=overrides or [])
    return [f"{r.check}/{r.stage}: {r.detail}" for r in check_profile(cfg) if not r.ok]


@pytest.mark.parametrize("profile", PROFILES)
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
        "checkpoint disk",
        "SGLang API key",
        "time estimate",
    }
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
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
        # a folder each node has on its own disk: the workers would not see the submitting node's files
        (
            ["papo_rl.verl.ray_address=http://ray-head:8265", "papo_rl.verl.shared_dir=/scratch/npr"],
            "infra/ray/cluster.yaml mounts",
        ),
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


# What the real verl run on CPU exposed (tests/integration/training/test_verl_main_ppo.py); each rule is
# shown failing on a profile that breaks it.
@pytest.mark.parametrize(
    ("overrides", "check", "stage", "says"),
    [
        # verl patches only flash-attention for Ulysses: with sdpa each rank attends within its slice
        (["npr_zero.verl.ulysses_sp=8"], "verl validation", "npr_zero", "needs models.attn_implementation"),
        # verl keeps every checkpoint by default; a 4B actor with AdamW is ~48 GB each
        (["papo_rl.verl.keep_checkpoints=50"], "checkpoint disk", "papo_rl", "lower papo_rl.verl.keep_checkpoints"),
        (
            ["npr_zero.verl.keep_checkpoints=3", "orchestration.gpu.disk_gib=120"],
            "checkpoint disk",
            "npr_zero",
            "of 120 GiB",
        ),
        # the server would read another variable than the one its clients send
        (
            ['distill.generation.server_args={"api_key_env": "OTHER_KEY"}'],
            "SGLang API key",
            "distill",
            "every request would get HTTP 401",
        ),
        # the torch rollout is the CPU platform's
        (["sr_rl.verl.rollout_name=torch"], "verl validation", "sr_rl", "the torch rollout is the CPU platform's"),
    ],
)
def test_a_profile_that_breaks_a_real_run_rule_fails_the_check(overrides, check, stage, says):
    rows = check_profile(load_config(profile="qwen3-4b", overrides=overrides))
    bad = [r for r in rows if not r.ok]
    assert [(r.check, r.stage) for r in bad] == [(check, stage)], bad
    assert says in bad[0].detail


def test_the_v1_trainer_imports_are_part_of_verls_validation(monkeypatch):
    """verl 0.9.1's default trainer imports TransferQueue only in its TaskRunner, minutes into a GPU job: the
    check imports it before anything is launched."""
    import builtins

    real_import = builtins.__import__

    def no_transfer_queue(name, *args, **kwargs):
        if name == "transfer_queue" or name.startswith("transfer_queue."):
            raise ModuleNotFoundError("No module named 'transfer_queue'")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_transfer_queue)
    rows = check_profile(load_config(profile="qwen3-4b"))
    bad = {r.stage: r.detail for r in rows if not r.ok and r.check == "verl validation"}
    assert set(bad) == {"npr_zero", "papo_rl", "sr_rl", "pr1_rl"}
    assert all("TransferQueue" in d for d in bad.values())


def test_the_cluster_wires_one_sglang_key_to_the_server_and_the_gpu_jobs(tmp_path):
    """On the cluster the SGLang Deployment and the gpu-pool jobs must read the key from one secret entry;
    a manifest that reads it from a secret the jobs do not take their environment from is refused."""
    import shutil

    from components.config_check import GPU_POOL_TEMPLATE, SGLANG_SERVER_MANIFEST, check_sglang_api_key

    cfg = load_config(profile="qwen3-4b")
    for rel in (SGLANG_SERVER_MANIFEST, GPU_POOL_TEMPLATE):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(rel, tmp_path / rel)
    assert all(r.ok for r in check_sglang_api_key(cfg, tmp_path))
    manifest = tmp_path / SGLANG_SERVER_MANIFEST
    # the wiring before this check existed: the server read a secret of its own
    manifest.write_text(
        manifest.read_text().replace(
            "{secretKeyRef: {name: npr-credentials, key: NPR_SGLANG_API_KEY}}",
            "{secretKeyRef: {name: npr-sglang, key: api_key}}",
        )
    )
    rows = {r.stage: r for r in check_sglang_api_key(cfg, tmp_path)}
    assert not rows["distill"].ok and "would not hold NPR_SGLANG_API_KEY" in rows["distill"].detail


def test_the_tiny_profile_runs_every_rl_stage_through_verl_on_cpu():
    """`npr stage <rl stage> --set <stage>.backend=verl` on a laptop: verl accepts each job on the CPU
    platform with the torch rollout, and nothing asks for a GPU."""
    stages = ("npr_zero", "papo_rl", "sr_rl", "pr1_rl")
    rows = check_profile(load_config(profile="tiny", overrides=[f"{s}.backend=verl" for s in stages]))
    assert all(r.ok for r in rows), [r for r in rows if not r.ok]
    verl = {r.stage: r.detail for r in rows if r.check == "verl validation"}
    assert set(verl) == set(stages)
    assert all(r.detail.startswith("0 GPU(s) on the cpu pool") for r in rows if r.check == "GPU count")


def test_the_parallel_r1_evaluation_budget_is_checked_against_its_own_prompt_bound():
    """The evaluation decodes the Parallel-R1 checkpoints with parallel_r1.max_new_tokens and their longer
    instruction: their prompts are bounded like pr1_rl's, not NPR-Zero's, and the check says which."""
    rows = [r for r in check_profile(load_config(profile="tiny")) if r.check == "context length"]
    assert all(r.ok for r in rows), rows
    evaluate = [r.detail for r in rows if r.stage == "evaluate"]  # NPR's budget and Parallel-R1's
    assert len(evaluate) == 2 and "(parallel_r1.max_new_tokens)" in evaluate[1], evaluate

    # 84 + 440 = 524 > 512: only the evaluation of the Parallel-R1 checkpoints overruns (pr1_rl keeps 428)
    rows = check_profile(load_config(profile="tiny", overrides=["parallel_r1.max_new_tokens=440"]))
    bad = [r for r in rows if not r.ok]
    assert [(r.check, r.stage) for r in bad] == [("context length", "evaluate")], bad
    assert "pr1_rl.verl.max_prompt_length" in bad[0].detail and "parallel_r1.max_new_tokens 440" in bad[0].detail


def test_a_stage_submitted_to_the_cluster_passes_with_its_files_on_the_clusters_shared_filesystem():
    cfg = load_config(
        profile="qwen3-4b",
        overrides=["papo_rl.verl.ray_address=http://ray-head:8265", "papo_rl.verl.shared_dir=/mnt/npr-shared/runs"],
    )
    ray = {r.stage: r for r in check_profile(cfg) if r.check == "Ray"}
    assert ray["papo_rl"].ok and "attach http://ray-head:8265" in ray["papo_rl"].detail


def test_a_shared_mount_is_a_folder_mounted_on_every_node_and_bound_into_its_container():
    mount = "sudo mkdir -p /mnt/s && (mountpoint -q /mnt/s || sudo mount -t nfs4 fs:/ /mnt/s)"
    bound = {"docker": {"run_options": ["--shm-size=64g", "-v /mnt/s:/shared"]}}
    assert ray_shared_mounts({**bound, "initialization_commands": [mount]}) == ["/shared"]
    # bound but only created (each node's own empty folder), or mounted but not bound into the container
    assert ray_shared_mounts({**bound, "initialization_commands": ["sudo mkdir -p /mnt/s"]}) == []
    assert ray_shared_mounts({**bound, "initialization_commands": ["mountpoint -q /mnt/s"]}) == []
    assert ray_shared_mounts({"docker": {"run_options": []}, "initialization_commands": [mount]}) == []
