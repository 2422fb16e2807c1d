"""parallel_warmup and sequential_warmup end to end on the tiny test world (a few SFT steps each)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from components.artifacts import write_shards
from components.config import load_config
from components.dag import StageIO
from components.data import synthetic
from components.models.loading import load_model, save_model
from components.models.tiny import tiny_test_world
from components.stages import parallel_warmup, sequential_warmup


def _accepted(n: int) -> list[dict]:
    rng = random.Random(0)
    out = []
    for i, rec in enumerate(synthetic.generate_problems(n, 5, {"easy": 1.0})):
        mistake = "unclosed_step" if i == 0 else None  # one malformed record must be reported, not lost
        response = synthetic.render_solution(rec, "parallel", rng, mistake)
        out.append(
            {
                "problem_id": rec["id"],
                "sample_idx": 0,
                "problem": rec["problem"],
                "answer": rec["answer"],
                "prompt": "",
                "response": response,
                "correct": True,
                "valid": mistake is None,
            }
        )
    return out


@pytest.fixture(scope="module")
def stage_env(tmp_path_factory):
    root = tmp_path_factory.mktemp("warmup")
    model, tokenizer = tiny_test_world(seed=0)
    save_model(model, tokenizer, root / "seed" / "model")
    write_shards(root / "reject_filter" / "accepted", _accepted(9), 2)
    return root


def _io(root, stage):
    return StageIO(
        stage=stage,
        inputs={
            "seed/model": root / "seed" / "model",
            "reject_filter/accepted": root / "reject_filter" / "accepted",
        },
        outputs={"model": root / stage / "model"},
    )


@pytest.mark.parametrize("stage", ["parallel_warmup", "sequential_warmup"])
def test_warmup_stage_trains_saves_and_reports(stage_env, stage):
    module = {"parallel_warmup": parallel_warmup, "sequential_warmup": sequential_warmup}[stage]
    overrides = [f"{stage}.max_steps=3", f"{stage}.batch_size=4", f"{stage}.save_every=2", f"{stage}.lr=1e-3"]
    cfg = load_config(profile="tiny", overrides=overrides)
    metrics = module.run(cfg, _io(stage_env, stage))

    assert metrics["n_records"] == 9 and metrics["steps"] == 3 and metrics["resumed_from_step"] == 0
    if stage == "parallel_warmup":
        assert metrics["n_examples"] == 8 and metrics["n_rejected"] == 1
        assert next(iter(metrics["rejected_by_reason"])).startswith("structure:")
    else:
        assert metrics["n_examples"] == 9 and metrics["n_rejected"] == 0
    assert metrics["n_examples"] + metrics["n_rejected"] == metrics["n_records"]
    work = stage_env / stage / "work"
    assert sum(1 for _ in (work / "rejections.jsonl").open()) == metrics["n_rejected"]
    assert json.loads((work / "train_metrics.json").read_text())["history"][-1]["step"] == 3

    model, tokenizer = load_model(stage_env / stage / "model", cfg.models, cfg.run)
    assert tokenizer.encode("</guideline>", add_special_tokens=False) == [metrics["tag_ids"]["</guideline>"]]
    seed_model, _ = load_model(stage_env / "seed" / "model", cfg.models, cfg.run)
    assert not torch.equal(model.model.embed_tokens.weight, seed_model.model.embed_tokens.weight)

    again = module.run(cfg, _io(stage_env, stage))  # rerun: resumes from the final checkpoint, trains nothing
    assert again["resumed_from_step"] == 3 and again["steps"] == 3


class _RecordingRun:
    def __init__(self) -> None:
        self.logged: list[tuple[int | None, dict]] = []
        self.summaries: list[dict] = []

    def resume_from(self, step: int) -> None:  # components.tracking.StageRun's resume hook
        self.resumed_from = step

    def log(self, metrics: dict, step: int | None = None) -> None:
        self.logged.append((step, metrics))

    def summary(self, values: dict) -> None:
        self.summaries.append(values)


def test_warmup_sends_its_training_curve_to_the_stage_run(stage_env, tmp_path, monkeypatch):
    # the W&B side of stage_run is tested against the real service in tests/integration/ops; here: the SFT
    # stage opens its own run and logs every optimizer step with the recipe's scalars
    from contextlib import contextmanager

    import components.training.sft_run as sft_run

    opened: list[tuple[str, object]] = []
    run = _RecordingRun()

    @contextmanager
    def fake_stage_run(cfg, stage, run_dir):
        opened.append((stage, run_dir))
        yield run

    monkeypatch.setattr(sft_run, "stage_run", fake_stage_run)  # the SFT runner's W&B run (its module's import)
    stage = "sequential_warmup"
    overrides = [f"{stage}.max_steps=4", f"{stage}.batch_size=4", f"{stage}.lr=1e-3"]
    cfg = load_config(profile="tiny", overrides=overrides)
    io = _io(stage_env, stage)
    io.outputs = {"model": tmp_path / stage / "model"}
    sequential_warmup.run(cfg, io)

    assert opened == [(stage, tmp_path / stage / "work")]
    assert [step for step, _ in run.logged] == [1, 2, 3, 4]
    first = run.logged[0][1]
    assert {"loss", "lr", "grad_norm", "loss_tokens", "step_time_s"} <= set(first) and "step" not in first
    assert run.summaries and run.summaries[-1]["steps"] == 4


@pytest.mark.slow
def test_warmup_stage_under_torchrun_fsdp_writes_the_single_process_model(stage_env, tmp_path):
    # the stage as `npr stage` runs it with nproc_per_node: 2 (what the 4B profile does on GPUs): two FSDP
    # ranks on CPU; rank 0 alone writes a model that loads like any other and equals the 1-process result
    import os
    import subprocess
    import sys
    from pathlib import Path

    from safetensors.torch import load_file

    worker = Path(__file__).with_name("warmup_fsdp_worker.py")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[3]), "OMP_NUM_THREADS": "1"}
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    runs = {
        "one": [sys.executable, str(worker)],
        "two": [torchrun, "--standalone", "--nproc_per_node=2", str(worker)],
    }
    for name, cmd in runs.items():
        proc = subprocess.run(
            [*cmd, str(stage_env), "parallel_warmup", str(tmp_path / name)],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]
    one = load_file(str(tmp_path / "one" / "model" / "model.safetensors"))
    two = load_file(str(tmp_path / "two" / "model" / "model.safetensors"))
    assert sorted(one) == sorted(two)
    assert max((one[k] - two[k]).abs().max().item() for k in one) <= 1e-5
    cfg = load_config(profile="tiny")
    model, tokenizer = load_model(tmp_path / "two" / "model", cfg.models, cfg.run)
    assert tokenizer.encode("</guideline>", add_special_tokens=False) == [
        tokenizer.convert_tokens_to_ids("</guideline>")
    ]
    assert not (tmp_path / "two" / "model.tmp").exists()
