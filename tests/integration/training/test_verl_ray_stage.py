"""A GPU RL stage's Ray path on CPU, with real processes: the stage starts its own Ray head (127.0.0.1, free
ports, token auth), verl's driver (a stand-in with verl's interface) attaches to it, a Ray worker reads the
model and data paths and sees the W&B and S3 settings, the checkpoint is merged by verl's real model
merger into the stage's output, and the head and everything it started are gone afterwards."""

from __future__ import annotations

import contextlib
import json
import secrets
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from components.artifacts import write_shards
from components.config import load_config
from components.data.synthetic import generate_problems
from components.models.loading import save_model
from components.models.tiny import tiny_test_world
from components.training.job import RLPaths, rl_job
from components.training.verl.stage import run_verl_stage

# xdist_group("ray"): the test files that start Ray clusters run on one worker (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("ray")]
ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def stage_inputs(tmp_path: Path) -> tuple[Path, Path]:
    model, tok = tiny_test_world(seed=0)
    init = save_model(model, tok, tmp_path / "init")
    problems = tmp_path / "problems"
    rows = generate_problems(12, seed=2)
    write_shards(problems, [{**r, "split": "train"} for r in rows[:8]], 1, stem="train")
    write_shards(problems, [{**r, "split": "test"} for r in rows[8:]], 1, stem="test")
    return init, problems


def test_a_verl_stage_starts_its_own_ray_head_and_merges_its_checkpoint(
    stage_inputs, tmp_path, monkeypatch, in_repo
):
    init, problems = stage_inputs
    token = secrets.token_hex(16)
    for key, value in {
        "NPR_VERL_ENTRY_MODULE": "tests.integration.training.verl_standin",
        "PYTHONPATH": str(ROOT),
        "RAY_AUTH_TOKEN": token,  # the head runs with Ray's token authentication on
        "WANDB_API_KEY": "wandb-test-key",
        "WANDB_MODE": "offline",
        "AWS_ACCESS_KEY_ID": "s3-test-key",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "NPR_PIPELINE_RUN_ID": "run-42",
        "OMP_NUM_THREADS": "1",
    }.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    cfg = load_config(profile="qwen3-4b", overrides=["papo_rl.steps=3"])
    work, out = tmp_path / "work", tmp_path / "out" / "model"
    heads_before = _ray_heads(token)
    paths = RLPaths(starts_from=init, problems=problems, writes=out, work_dir=work)
    metrics = run_verl_stage(rl_job("papo_rl", cfg, paths))

    assert metrics["steps"] == 3 and metrics["ray"] == "own head on 127.0.0.1"
    probe = json.loads((work / "verl" / "standin_probe.json").read_text())
    assert probe["train_rows"] == 8 and probe["val_rows"] == 4 and probe["hidden_size"] == 64
    assert probe["pid"] != probe["driver_pid"]  # read by a Ray worker process, not the driver
    assert probe["env"] == {
        "WANDB_API_KEY": "wandb-test-key",
        "WANDB_MODE": "offline",
        "AWS_ACCESS_KEY_ID": "s3-test-key",
        "AWS_ENDPOINT_URL": "http://127.0.0.1:9",
        "NPR_PIPELINE_RUN_ID": "run-42",
    }
    # the merged checkpoint is the stage's output, with the weights the trainer saved (verl's merger writes
    # bfloat16, the dtype the GPU profile serves)
    merged = load_file(str(out / "model.safetensors"))
    start = load_file(str(init / "model.safetensors"))
    for key, tensor in start.items():
        assert merged[key].dtype == torch.bfloat16
        assert torch.equal(merged[key], tensor.to(torch.bfloat16)), key
    assert (out / "tokenizer_config.json").exists() and (out / "config.json").exists()
    # the head (and its GCS, raylet, dashboard, workers) is stopped: no new Ray process is left
    assert _ray_heads(token) == heads_before


def _ray_heads(token: str) -> set[int]:
    """This test's Ray heads: ``ray start --head`` processes holding its auth token (another Ray on the machine,
    a developer's or another suite's, is not the stage's)."""
    out = set()
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info["cmdline"] or []
        if cmd and "ray" in Path(cmd[0]).name and "start" in cmd and "--head" in cmd:
            with contextlib.suppress(psutil.NoSuchProcess, psutil.AccessDenied):
                if proc.environ().get("RAY_AUTH_TOKEN") == token:
                    out.add(proc.pid)
    return out
