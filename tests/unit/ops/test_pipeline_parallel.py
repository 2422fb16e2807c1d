"""The pipeline flow's scheduling under a real (temporary) Prefect server, with the stages stubbed: each
stage starts after its upstream stages, independent branches overlap only when allowed, and stages that
run beside another get a share of the torch threads."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import flows.pipeline as pipeline
from components.config import load_config
from components.dag import independent_stages, load_stages, stage_order
from components.env import THREADS_ENV, torch_threads

REPO = Path(__file__).resolve().parents[3]
# The NPR and SR branches after reject_filter; the Parallel-R1 branch after seed, beside everything from
# npr_zero on.
BRANCHES = {
    "npr_zero",
    "distill",
    "reject_filter",
    "parallel_warmup",
    "papo_rl",
    "sequential_warmup",
    "sr_rl",
    "pr1_coldstart",
    "pr1_rl",
}


def test_independent_stages_are_the_npr_sr_and_parallel_r1_branches(monkeypatch):
    monkeypatch.chdir(REPO)
    assert independent_stages(load_stages()) == BRANCHES


def test_thread_share_comes_from_the_environment(monkeypatch):
    monkeypatch.delenv(THREADS_ENV, raising=False)
    assert torch_threads(2) == 2
    monkeypatch.setenv(THREADS_ENV, "1")
    assert torch_threads(2) == 1
    for bad in ("0", "two"):
        monkeypatch.setenv(THREADS_ENV, bad)
        with pytest.raises(ValueError, match=THREADS_ENV):
            torch_threads(2)


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


def run_stubbed(monkeypatch, tmp_path: Path, parallel: int) -> dict[str, dict[str, Any]]:
    monkeypatch.chdir(REPO)
    cfg = load_config(
        profile="tiny", overrides=[f"orchestration.max_parallel_stages={parallel}", "orchestration.retries=0"]
    )
    runs: dict[str, dict[str, Any]] = {}
    lock = threading.Lock()

    def fake_stage(stage, profile, gpu, run_id, threads, report=None):
        if report is not None:
            report["outcome"] = "up to date" if stage == "sample_orz" else "ran"
        start = time.perf_counter()
        time.sleep(0.6 if stage in BRANCHES else 0.05)
        with lock:
            runs[stage] = {"start": start, "end": time.perf_counter(), "threads": threads}
        return {"stage": stage}

    monkeypatch.setattr(pipeline, "ensure_profile", lambda profile, overrides: cfg)
    monkeypatch.setattr(pipeline, "_run_stage", fake_stage)
    monkeypatch.setattr(pipeline, "_publish", lambda *args: None)
    monkeypatch.setattr(
        pipeline, "record_timing", lambda run_id, profile, walls, total: tmp_path / "timing.json"
    )
    result = pipeline.npr_pipeline(profile="tiny")
    assert result == {s: {"stage": s} for s in stage_order()}
    return runs


def overlap(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_parallel_flow_overlaps_independent_branches_only(harness, monkeypatch, tmp_path):
    runs = run_stubbed(monkeypatch, tmp_path, parallel=2)
    specs = load_stages(REPO / "dvc.yaml")
    for name, spec in specs.items():
        for up in spec.upstream:
            assert runs[up]["end"] <= runs[name]["start"], f"{name} started before {up} ended"
    assert overlap(runs["parallel_warmup"], runs["sequential_warmup"])
    assert overlap(runs["pr1_coldstart"], runs["npr_zero"])
    assert {s for s, r in runs.items() if r["threads"] is not None} == BRANCHES
    assert {r["threads"] for s, r in runs.items() if s in BRANCHES} == {1}  # 2 torch threads, 2 stages
    starts = sorted((r["start"], 1) for r in runs.values()) + sorted((r["end"], -1) for r in runs.values())
    running, most = 0, 0
    for _, step in sorted(starts):
        running += step
        most = max(most, running)
    assert most <= 2


def test_one_stage_at_a_time_keeps_the_topological_order(harness, monkeypatch, tmp_path):
    runs = run_stubbed(monkeypatch, tmp_path, parallel=1)
    order = stage_order(REPO / "dvc.yaml")
    assert sorted(runs, key=lambda s: runs[s]["start"]) == order
    assert all(runs[a]["end"] <= runs[b]["start"] for a, b in zip(order, order[1:], strict=False))
    assert all(r["threads"] is None for r in runs.values())
    assert os.environ.get(THREADS_ENV) is None


def test_a_stage_past_its_deadline_is_killed_with_its_children():
    import sys

    import psutil

    from flows.stage import stream_with_deadline

    # a parent that starts a long-running child, as `dvc repro` starts the stage's process
    script = (
        "import subprocess, sys, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print(child.pid, flush=True); time.sleep(60)"
    )
    start = time.perf_counter()
    code, tail, timed_out = stream_with_deadline([sys.executable, "-c", script], dict(os.environ), 2.0)
    assert timed_out and code != 0 and time.perf_counter() - start < 30
    child = int(tail[0])
    time.sleep(0.5)
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    code, tail, timed_out = stream_with_deadline(
        [sys.executable, "-c", "print('done')"], dict(os.environ), 30.0
    )
    assert (code, tail, timed_out) == (0, ["done"], False)
