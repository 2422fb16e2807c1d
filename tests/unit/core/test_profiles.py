"""Profiles as overlays (``base:`` in a profile file) and the hardware profiles built on them: what each
changes against qwen3-4b, and every profile planned against every GPU kind infra/ names."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from components.config import ConfigError, load_config, pipeline_stages, read_profile
from components.config_check import check_memory, on_gpu
from components.ops.gpus import load_gpu_catalogue
from components.training import memory

ROOT = Path(__file__).resolve().parents[3]
PROFILES = sorted(p.stem for p in (ROOT / "configs").glob("*.yaml"))
HARDWARE_OVERLAYS = ("qwen3-4b-8xh100", "qwen3-1.7b-1gpu")
GPU_STAGES = ("npr_zero", "distill", "parallel_warmup", "sequential_warmup", "papo_rl", "sr_rl", "pr1_coldstart",
              "pr1_rl", "evaluate")  # fmt: skip


def _write(root: Path, name: str, data: dict[str, Any]) -> None:
    (root / f"{name}.yaml").write_text(yaml.safe_dump(data))


# ------------------------------------------------------------------------------------------ the mechanism
def test_an_overlay_deep_merges_over_its_base_and_replaces_lists_whole(tmp_path):
    _write(tmp_path, "root", {"profile": "root", "a": {"x": 1, "y": [1, 2], "z": {"k": 1}}, "b": 2})
    _write(tmp_path, "mid", {"base": "root", "profile": "mid", "a": {"y": [3], "z": {"j": 2}}})
    _write(tmp_path, "top", {"base": "mid", "profile": "top", "b": 5})
    assert read_profile("top", tmp_path) == {
        "profile": "top",
        "a": {"x": 1, "y": [3], "z": {"k": 1, "j": 2}},
        "b": 5,
    }


@pytest.mark.parametrize(
    ("files", "message"),
    [
        ({"a": {"base": "nope", "profile": "a"}}, r"unknown base profile 'nope'; known profiles: a"),
        ({"a": {"base": "b", "profile": "a"}, "b": {"base": "a", "profile": "b"}}, r"base cycle a -> b -> a"),
        ({"a": {"base": "a", "profile": "a"}}, r"base cycle a -> a"),
        ({"a": {"base": ["b"], "profile": "a"}, "b": {"profile": "b"}}, r"base must name a profile"),
        ({"a": {"base": "b"}, "b": {"profile": "b"}}, r"an overlay must name itself: set profile: a"),
    ],
)
def test_a_bad_base_is_refused_naming_the_file(tmp_path, files, message):
    for name, data in files.items():
        _write(tmp_path, name, data)
    with pytest.raises(ConfigError, match=message):
        read_profile("a", tmp_path)


def test_an_overlay_is_validated_like_any_profile(in_repo, tmp_path, monkeypatch):
    import components.config as config

    for name in ("qwen3-4b",):
        (tmp_path / f"{name}.yaml").write_text((in_repo / "configs" / f"{name}.yaml").read_text())
    _write(tmp_path, "bad", {"base": "qwen3-4b", "profile": "bad", "papo_rl": {"max_new_tokenz": 1}})
    monkeypatch.setattr(config, "CONFIGS_DIR", tmp_path)
    with pytest.raises(ConfigError, match=r"papo_rl\.max_new_tokenz"):
        load_config(profile="bad")


# ------------------------------------------------------------------------------------------ the profiles
def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(data, dict):
        out: dict[str, Any] = {}
        for key, value in data.items():
            out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: data}


# Scale (the model and its shape, the response budget PAPO trains on) and placement (the GPU, GPUs per
# job, how a step is split over passes): nothing of the recipe's data, steps, batches, rates or rewards.
ARCH = {
    f"models.architecture.{k}"
    for k in (
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "max_position_embeddings",
    )
}
CHANGED = {
    "qwen3-4b-8xh100": {
        "profile",
        "orchestration.gpu.name",
        "orchestration.gpu.memory_gib",
        *(
            f"orchestration.task_timeout_s.{s}"
            for s in ("npr_zero", "distill", "papo_rl", "sr_rl", "pr1_rl", "evaluate")
        ),
        "papo_rl.max_new_tokens",
    },
    "qwen3-1.7b-1gpu": {
        "profile",
        "models.base_model",
        *ARCH,
        "orchestration.gpu.name",
        "orchestration.gpu.memory_gib",
        "orchestration.gpu.per_node",
        *(f"orchestration.task_timeout_s.{s}" for s in GPU_STAGES),
        *(f"{s}.verl.n_gpus_per_node" for s in ("npr_zero", "papo_rl", "sr_rl", "pr1_rl")),
        *(f"{s}.verl.rollout_tp" for s in ("npr_zero", "papo_rl", "sr_rl")),  # pr1_rl's is 1 already
        "distill.generation.server_args.dp_size",
        "evaluate.generation.server_args.dp_size",
        *(f"{s}.nproc_per_node" for s in ("parallel_warmup", "sequential_warmup", "pr1_coldstart")),
        *(f"{s}.length_splits" for s in ("parallel_warmup", "sequential_warmup", "pr1_coldstart")),
        "papo_rl.max_new_tokens",
    },
}


@pytest.mark.parametrize("profile", HARDWARE_OVERLAYS)
def test_a_hardware_profile_changes_only_scale_and_placement_keys(in_repo, profile):
    base = _leaves(load_config(profile="qwen3-4b").model_dump(mode="json"))
    mine = _leaves(load_config(profile=profile).model_dump(mode="json"))
    differ = {k for k in base.keys() | mine.keys() if base.get(k, object()) != mine.get(k, object())}
    assert differ == CHANGED[profile]
    assert read_profile(profile)["profile"] == profile


def _infra_gpu_kinds() -> set[str]:
    """The GPU kinds of every non-head node type of the Ray cluster (its instance types, via infra/gpus.yaml)."""
    cluster = yaml.safe_load((ROOT / "infra/ray/cluster.yaml").read_text())
    catalogue = load_gpu_catalogue(ROOT / "infra/gpus.yaml")
    kinds = set()
    for name, node in cluster["available_node_types"].items():
        if name == cluster["head_node_type"]:
            continue
        instance = node["node_config"]["InstanceType"]
        kind = catalogue.for_instance_type(instance)
        assert kind is not None, f"{instance} (infra/ray/cluster.yaml) is in no kind of infra/gpus.yaml"
        kinds.add(kind)
    return kinds


def test_infra_names_gpus_the_catalogue_knows(in_repo):
    assert _infra_gpu_kinds() == {"H100"}
    catalogue = load_gpu_catalogue()
    for profile in PROFILES:
        declared = load_config(profile=profile).orchestration.gpu.name
        assert declared in catalogue.kinds, (profile, declared)


# What each profile fits: its declared GPU always (the rest of npr config check: test_config_check.py).
FITS = {
    "tiny": {"H100", "H200"},  # nothing on a GPU
    "qwen3-4b": {"H200"},
    "qwen3-4b-8xh100": {"H100", "H200"},
    "qwen3-1.7b-1gpu": {"H100", "H200"},
}


def _movable(setting: str, cfg) -> bool:
    """A named `lower KEY` fix can move: KEY's value is above 1 (no setting here has a floor above 1)."""
    key = re.search(r"lower ([\w.]+)", setting)
    assert key, setting
    node: Any = cfg
    for part in key.group(1).split("."):
        node = getattr(node, part)
    return node > 1


@pytest.mark.parametrize("profile", PROFILES)
def test_every_profile_is_planned_against_every_gpu_kind(in_repo, profile):
    assert set(FITS) == set(PROFILES)
    cfg = load_config(profile=profile)
    assert cfg.orchestration.gpu.name in FITS[profile]
    for kind in sorted({*load_gpu_catalogue().kinds, *_infra_gpu_kinds()}):
        rows = check_memory(on_gpu(cfg, kind))
        failed = [r for r in rows if not r.ok]
        if kind in FITS[profile]:
            assert failed == [], (kind, failed)
            for row in rows:
                share = float(re.search(r"(\d+)% headroom", row.detail).group(1)) / 100
                assert share >= memory.MIN_HEADROOM, row
        else:
            assert failed, (profile, kind)
            for row in failed:
                fix = row.detail.split("to fit, change ")[1]
                assert _movable(fix, cfg), row.detail


def test_qwen3_4b_on_h100_is_refused_naming_the_response_length(in_repo):
    rows = check_memory(on_gpu(load_config(profile="qwen3-4b"), "H100"))
    failed = {r.stage: r.detail for r in rows if not r.ok}
    assert set(failed) == {"papo_rl"}
    assert "change lower papo_rl.max_new_tokens" in failed["papo_rl"]
    assert "micro_batch_size_per_gpu is at 1" in failed["papo_rl"]


def test_every_gpu_stage_of_every_gpu_profile_is_planned(in_repo):
    for profile in (p for p in PROFILES if p != "tiny"):
        cfg = load_config(profile=profile)
        planned = {s for s in pipeline_stages() if memory.plan_stage(s, cfg)}
        assert planned == set(cfg.orchestration.gpu_stages), profile


def test_the_cli_refuses_a_profile_on_a_gpu_it_does_not_fit(in_repo):
    from typer.testing import CliRunner

    from components.cli import app

    result = CliRunner().invoke(app, ["config", "check", "--profile", "qwen3-4b", "--gpu", "H100"])
    assert result.exit_code == 1, result.output
    assert "lower papo_rl.max_new_tokens" in " ".join(result.output.split())
    assert "failed for profile qwen3-4b on H100" in result.output
    unknown = CliRunner().invoke(app, ["config", "check", "--profile", "qwen3-4b", "--gpu", "B300"])
    assert unknown.exit_code == 2 and "unknown GPU kind 'B300'" in unknown.output
