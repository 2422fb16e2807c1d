"""A tiny RL stage killed with SIGKILL after a checkpoint and rerun reports exactly what an uninterrupted run
reports: the whole metrics.jsonl and metrics.json (minus wall times and the resume facts), the model bytes,
and a W&B run whose steps never go backwards. Then a rerun of the finished stage (`dvc repro -f`) reports
the recorded run instead of a zero-step "training".

Real processes (`npr stage papo_rl`, W&B offline) in two copies of a minimal repository; about a minute.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.artifacts import write_shards
from components.config import dump_yaml, load_config
from components.data.synthetic import generate_problems
from components.models.loading import save_model
from tests.integration.ops.wandb_records import _parse, by_type, run_files

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[3]
STAGE = "papo_rl"
OVERRIDES = [
    f"{STAGE}.{o}"
    for o in (
        "steps=4",
        "save_every=2",
        "eval_every=2",
        "prompts_per_step=4",
        "group_size=4",
        "max_new_tokens=48",
        "eval_n=8",
        "eval_samples=1",
        "eval_before_train=true",
    )
]
# Facts about how a run went rather than what it computed: timings and the resume itself.
TIME_KEYS = ("wall_time_s", "wall_s", "train_wall_time_s", "perf/tokens_per_s")
RESUME_KEYS = ("resumed_from_step", "work_dir_kept")


def _untimed(obj):
    if isinstance(obj, dict):
        return {
            k: _untimed(v)
            for k, v in obj.items()
            if k not in TIME_KEYS and k not in RESUME_KEYS and not k.startswith("timing_s/")
        }
    if isinstance(obj, list):
        return [_untimed(v) for v in obj]
    return obj


def _canonical(obj) -> str:
    return json.dumps(_untimed(obj), sort_keys=True)  # NaN compares equal as text


def _make_repo(root: Path, model, tok, cfg) -> Path:
    root.mkdir()
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    (root / "prompts").symlink_to(REPO / "prompts")
    (root / "params.yaml").write_text(dump_yaml(cfg))
    problems = generate_problems(48, seed=21)
    out = root / "artifacts" / "sample_orz" / "problems"
    write_shards(out, [dict(p, split="train") for p in problems[:40]], 1, stem="train")
    write_shards(out, [dict(p, split="test") for p in problems[40:]], 1, stem="test")
    save_model(model, tok, root / "artifacts" / "parallel_warmup" / "model")
    return root


def _env(wandb_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WANDB_API_KEY"}
    env.update(
        PYTHONPATH=str(REPO),
        WANDB_DIR=str(wandb_dir),
        WANDB_MODE="offline",
        NPR_PIPELINE_RUN_ID="run-resume-test",
        NPR_TORCH_THREADS="1",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
    )
    return env


def _npr_stage(root: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    npr = Path(sys.executable).with_name("npr")
    proc = subprocess.run(
        [str(npr), "stage", STAGE], cwd=root, env=env, capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _log_lines(root: Path) -> list[dict]:
    path = root / "artifacts" / STAGE / "work" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _wandb_steps(wandb_dir: Path, root: Path) -> list[list[int]]:
    """The history steps of each offline segment of the stage's W&B run, in the order they were written."""
    run_id = (root / "artifacts" / STAGE / "work" / "wandb_run_id").read_text().strip()
    segments = []
    for path in run_files(wandb_dir, run_id):
        deadline = time.monotonic() + 10
        while True:  # the service of a finished segment flushes asynchronously
            try:
                records = _parse(path)
            except Exception:  # a segment cut by SIGKILL ends mid-record
                records = []
            if by_type(records, "exit") or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        segments.append([h.step.num for h in by_type(records, "history")])
    return segments


def test_a_killed_and_rerun_stage_reports_what_an_uninterrupted_run_does(warm_world, tmp_path):
    model, tok = warm_world
    cfg = load_config(REPO / "configs" / "tiny.yaml", overrides=OVERRIDES)
    wandb_dir = tmp_path / "wandb_root"
    wandb_dir.mkdir()
    env = _env(wandb_dir)

    full = _make_repo(tmp_path / "full", model, tok, cfg)
    _npr_stage(full, env)

    cut = _make_repo(tmp_path / "cut", model, tok, cfg)
    npr = Path(sys.executable).with_name("npr")
    victim = subprocess.Popen(
        [str(npr), "stage", STAGE],
        cwd=cut,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    log_path = cut / "artifacts" / STAGE / "work" / "metrics.jsonl"
    deadline = time.monotonic() + 300
    # kill once step 3 is logged: after the step-2 checkpoint, before the next one
    while not (
        log_path.exists() and any(json.loads(x)["step"] == 3 for x in log_path.read_text().splitlines())
    ):
        assert victim.poll() is None, (
            f"the stage ended before it could be killed: {victim.stderr.read()[-2000:]}"
        )
        assert time.monotonic() < deadline
        time.sleep(0.05)
    os.killpg(victim.pid, signal.SIGKILL)  # the whole process tree, as a stage timeout does
    victim.wait()
    work = cut / "artifacts" / STAGE / "work"
    assert sorted(p.name for p in work.glob("checkpoint-*")) == ["checkpoint-00000002"]
    assert not (cut / "artifacts" / STAGE / "model").exists()

    resumed = _npr_stage(cut, env)
    assert f"{STAGE}: resuming from step 2 of 4" in resumed.stderr

    # the whole step log: every step once, the same numbers as the uninterrupted run
    full_log, cut_log = _log_lines(full), _log_lines(cut)
    assert [r["step"] for r in cut_log] == [0, 1, 2, 3, 4]
    assert [_canonical(r) for r in cut_log] == [_canonical(r) for r in full_log]
    # the stage metrics: totals over the whole run (rollouts trained, valid fraction, rejections, evals)
    full_metrics = json.loads((full / "artifacts" / STAGE / "metrics.json").read_text())
    cut_metrics = json.loads((cut / "artifacts" / STAGE / "metrics.json").read_text())
    assert cut_metrics["resumed_from_step"] == 2 and full_metrics["resumed_from_step"] == 0
    assert cut_metrics["train/rollouts_trained"] == sum(r.get("train/rollouts_trained", 0) for r in full_log)
    assert _canonical(cut_metrics) == _canonical(full_metrics)
    weights = "artifacts/papo_rl/model/model.safetensors"
    assert (cut / weights).read_bytes() == (full / weights).read_bytes()
    # W&B: the resumed segment continues after the last step the killed one logged, never backwards
    (full_steps,) = _wandb_steps(wandb_dir, full)
    segments = _wandb_steps(wandb_dir, cut)
    assert len(segments) == 2, segments
    flat = [s for seg in segments for s in seg]
    assert flat == sorted(set(flat)) == full_steps == [0, 1, 2, 3, 4], segments

    # a rerun of the finished stage (`dvc repro -f`): the recorded run, not a zero-step training
    again = _npr_stage(cut, env)
    assert f"{STAGE}: already trained to step 4" in again.stderr
    again_metrics = json.loads((cut / "artifacts" / STAGE / "metrics.json").read_text())
    assert again_metrics["train/rollouts_trained"] == cut_metrics["train/rollouts_trained"] > 0
    assert _canonical(again_metrics) == _canonical(full_metrics)
    assert [_canonical(r) for r in _log_lines(cut)] == [_canonical(r) for r in full_log]
    assert (cut / weights).read_bytes() == (full / weights).read_bytes()
    assert [s for seg in _wandb_steps(wandb_dir, cut) for s in seg] == flat, "nothing logged twice"
