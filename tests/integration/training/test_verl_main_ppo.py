"""Every RL stage trains through verl's own ``main_ppo``, for real, on this CPU machine.

``npr stage <stage>`` with ``<stage>.backend: verl`` on the tiny profile: the stage writes the job's parquet
inputs, starts a Ray head (token auth, logical device slots), and runs ``python -m verl.trainer.main_ppo``
with the launcher's overrides: Hydra config, TaskRunner, TransferQueue, the replay buffer, agent-loop
workers (``npr_parallel`` for the native parallel stages, verl's ``single_turn_agent`` for the DAPO ones),
the reward loop with our tag-keeping manager, verl's FSDP engine (the NPR actor for parallel stages) on
gloo, the torch rollout server receiving the trainer's weights after every step, checkpoints, and verl's
model merger into the stage's output. Nothing is stood in for.

Two steps each, tiny batches (about three to four minutes a job on 2 cores, most of it verl starting its
Ray workers). ``papo_rl`` (the NPR actor and the parallel agent loop) is run twice: on one rank,
uninterrupted, and on **two ranks** (FSDP over two CPU processes on gloo), killed (SIGKILL) after its step-1
checkpoint and rerun: the rerun resumes from its 2-shard checkpoint and reports what the one-rank run
reported, step by step, its updates within fp32 reduction noise of the one-rank updates, through a step whose
structurally filtered batch does not divide by the world size. Resuming is the stage's code, shared by every
RL stage (verl's ``resume_mode: auto`` on the stage's checkpoint folder), so one stage's kill shows it;
``npr_zero`` (verl's stock actor and single-turn loop) on two ranks is killed after step 1 and resumed as
well (its resumed run is checked step by step, without a reference run of its own), ``pr1_rl`` (the NPR actor
under Parallel-R1's schema) trains on one rank straight through. ``sr_rl`` trains through verl with its rollouts from a stock
vLLM server, beside ``papo_rl`` (test_verl_vllm_rollout.py, which uses this module's helpers).
Jobs run two at a time, each with its own Ray head (a job leaves one of the two cores mostly idle while
its workers start), which also shows that two stages' heads on one machine do not collide.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import torch
from safetensors.torch import load_file

from components.artifacts import write_shards
from components.config import dump_yaml, load_config
from components.data.synthetic import generate_problems
from components.models.loading import load_model, save_model
from components.models.tags import add_tag_tokens
from components.training.verl.report import verl_steps

# xdist_group("ray"): the test files that start Ray clusters run on one worker (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("ray")]

REPO = Path(__file__).resolve().parents[3]
SEED_MODEL = REPO / "models" / "tiny-instruct"
INIT_FROM = {"npr_zero": "seed", "papo_rl": "parallel_warmup", "sr_rl": "sequential_warmup", "pr1_rl": "pr1_coldstart"}
JOB = (
    "backend=verl",
    "steps=2",
    "save_every=1",
    "eval_every=2",
    "prompts_per_step=4",
    "group_size=4",
    "eval_n=8",
    "eval_samples=1",
)
# verl's DAPO refills race with the replay buffer's polling, so which surplus groups a step keeps depends
# on timing; off here so that a job's length is a function of the weights alone (the refill path runs
# against verl's real buffer in test_verl_replay.py)
NO_DYNAMIC_SAMPLING = ("npr_zero.dynamic_sampling=false",)
# data-parallel ranks of the 2-rank jobs (npr_zero here; papo_rl's killed-and-resumed run in its own repo)
RANKS = 2
TWO_RANKS = (f"npr_zero.verl.n_gpus_per_node={RANKS}",)
TIMEOUT_S = 900


def _overrides() -> list[str]:
    out = [f"{stage}.{o}" for stage in INIT_FROM for o in JOB]
    return [*out, *NO_DYNAMIC_SAMPLING, *TWO_RANKS]


def _make_repo(root: Path, extra: tuple[str, ...] = ()) -> Path:
    """A scratch checkout with the stages' inputs; ``extra``: more overrides of the tiny profile."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    for shared in ("prompts", "models", "infra"):  # infra: the vLLM server's spec (rollout_name vllm_server)
        (root / shared).symlink_to(REPO / shared)
    cfg = load_config(profile="tiny", overrides=[*_overrides(), *extra])
    (root / "params.yaml").write_text(dump_yaml(cfg))
    problems = generate_problems(160, seed=21)
    out = root / "artifacts" / "sample_orz" / "problems"
    write_shards(out, [dict(p, split="train") for p in problems[:140]], 1, stem="train")
    write_shards(out, [dict(p, split="val") for p in problems[140:]], 1, stem="val")
    for init in set(INIT_FROM.values()) - {"pr1_coldstart"}:
        shutil.copytree(SEED_MODEL, root / "artifacts" / init / "model")
    # Parallel-R1's RL starts from a model holding its tags as single tokens (its cold start adds them)
    model, tok = load_model(SEED_MODEL, cfg.models, cfg.run)
    add_tag_tokens(model, tok, "parallel_r1")
    save_model(model, tok, root / "artifacts" / "pr1_coldstart" / "model")
    return root


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    return _make_repo(tmp_path_factory.mktemp("verl") / "repo")


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "RAY_ADDRESS")}
    env.update(
        PYTHONPATH=str(REPO),
        WANDB_DIR=str(root / "wandb"),
        WANDB_MODE="offline",
        NPR_PIPELINE_RUN_ID="verl-test",
        NPR_TORCH_THREADS="1",
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        NPR_PROGRESS="plain",
    )
    return env


def _stage_log(root: Path, stage: str) -> Path:
    return root / f"npr-stage-{stage}.log"


def _npr_stage(root: Path, stage: str, **popen: object) -> subprocess.Popen:
    """``npr stage STAGE`` in ``root``, its output in a file (two jobs side by side never block on a pipe)."""
    npr = Path(sys.executable).with_name("npr")
    log = _stage_log(root, stage).open("w")
    return subprocess.Popen(
        [str(npr), "stage", stage], cwd=root, env=_env(root), stdout=log, stderr=subprocess.STDOUT, **popen
    )


def _tail(root: Path, stage: str) -> str:
    return _stage_log(root, stage).read_text(errors="replace")[-6000:]


def _finish(root: Path, stage: str, proc: subprocess.Popen) -> dict:
    try:
        proc.wait(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise AssertionError(f"{stage} did not finish within {TIMEOUT_S} s:\n{_tail(root, stage)}") from None
    assert proc.returncode == 0, _tail(root, stage)
    return json.loads((root / "artifacts" / stage / "metrics.json").read_text())


def _run_stage(root: Path, stage: str) -> dict:
    return _finish(root, stage, _npr_stage(root, stage))


def _records(root: Path, stage: str) -> list[dict]:
    path = root / "artifacts" / stage / "work" / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _ray_processes(root: Path | None = None) -> set[int]:
    """Ray heads, raylets and verl drivers on this machine (pids); with ``root``, only those of the stages
    run in that repo (they inherit its ``WANDB_DIR``, which ``_env`` makes unique to the repo)."""
    out = set()
    for p in psutil.process_iter(["cmdline"]):
        cmd = p.info["cmdline"] or []
        joined = " ".join(cmd)
        if (
            ("ray" in Path(cmd[0]).name and "start" in cmd and "--head" in cmd if cmd else False)
            or joined.endswith(("gcs_server", "raylet"))
            or any(Path(c).name in ("gcs_server", "raylet") for c in cmd[:1])
            or ("-m" in cmd and "verl.trainer.main_ppo" in cmd)
        ):
            if root is not None:
                try:
                    if p.environ().get("WANDB_DIR") != str(root / "wandb"):
                        continue
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
            out.add(p.pid)
    return out


def _left_behind(before: set[int], wait_s: float = 60.0, root: Path | None = None) -> set[int]:
    """The Ray and verl processes started since ``before`` (of ``root``'s stages, when given) that are still
    alive after ``wait_s``."""
    deadline = time.monotonic() + wait_s
    while True:
        new = {pid for pid in _ray_processes(root) - before if psutil.pid_exists(pid)}
        if not new or time.monotonic() > deadline:
            return new
        time.sleep(0.5)


def _had_signal(records: list[dict]) -> bool:
    """Whether any step gave the actor a non-zero advantage (GRPO's are all zero when every rollout of every
    group scores the same; then the update has no gradient and the weights cannot move)."""
    keys = ("verl/critic/advantages/max", "verl/critic/advantages/min")
    return any(rec.get(k, 0.0) != 0.0 for rec in records for k in keys)


def _assert_trained_through_verl(
    root: Path, stage: str, metrics: dict, before: set[int], rollout: str = "torch", attempts: int = 1
) -> bool:
    """The stage ran verl's job to its end (rolling out through ``rollout``, in ``attempts`` runs of verl's
    driver) and reported it; returns whether its actor had a signal (then the merged model moved; without one
    it equals the starting model)."""
    work = root / "artifacts" / stage / "work" / "verl"
    # Hydra's output folder is the run's, not outputs/ in the checkout
    for attempt in range(1, attempts + 1):
        assert (work / "hydra" / f"attempt-{attempt:02d}" / ".hydra" / "overrides.yaml").exists()
    assert not (root / "outputs").exists()
    overrides = (work / "verl_overrides.yaml").read_text()
    assert "python -m verl.trainer.main_ppo" in overrides and f"actor_rollout_ref.rollout.name={rollout}" in overrides
    assert metrics["backend"] == "verl" and metrics["checkpoint_step"] == 2 and metrics["steps"] == 2
    # the metrics come from verl's own run: its per-step log, and the plugins' records of every rollout
    # each step logged once over the attempts (a resumed driver starts after the checkpointed step)
    verl_log = [
        line
        for attempt in range(1, attempts + 1)
        for line in (work / "verl_logs" / f"attempt-{attempt:02d}.jsonl").read_text().splitlines()
    ]
    assert [json.loads(line)["step"] for line in verl_log] == [1, 2]
    trained = [r for r in _records(root, stage) if "reward/mean" in r]
    assert [r["step"] for r in trained] == [1, 2]
    for rec in trained:
        assert rec["train/rollouts_generated"] >= 4 * 4  # every rollout of the step was recorded
        assert 0.0 <= rec["rollout/format_valid"] <= 1.0 and math.isfinite(rec["reward/mean"])
        assert math.isfinite(rec["verl/actor/pg_loss"])  # the actor really updated
    evaluation = metrics["evals"][-1]
    assert evaluation["step"] == 2 and {"accuracy", "format_valid", "correct_and_valid", "parallel_rate"} <= set(
        evaluation
    )
    assert metrics["final/accuracy"] == evaluation["accuracy"]
    # one checkpoint shard per rank (FSDP2 shards every parameter over the ranks)
    ranks = int(overrides.split("trainer.n_gpus_per_node=")[1].split()[0])
    shards = sorted(p.name for p in (work / "checkpoints" / "global_step_2" / "actor").glob("model_world_size_*.pt"))
    assert shards == [f"model_world_size_{ranks}_rank_{r}.pt" for r in range(ranks)], shards
    # verl's merger wrote the stage's output (bf16, the trained weights, not the starting ones)
    out = load_file(str(root / "artifacts" / stage / "model" / "model.safetensors"))
    start = load_file(str(root / "artifacts" / INIT_FROM[stage] / "model" / "model.safetensors"))
    assert all(t.dtype == torch.bfloat16 for t in out.values())
    moved = [k for k, t in start.items() if not torch.equal(out[k], t.to(torch.bfloat16))]
    signal = _had_signal(trained)
    if signal:
        assert moved, "the merged model equals the starting one: nothing was trained"
    else:
        assert not moved and all(rec["actor/grad_norm"] == 0.0 for rec in trained), "moved without a gradient"
    # the stage's Ray head and everything it started are gone
    # (this repo's: another Ray on the machine, a developer's or another suite's, is not the stage's)
    assert not _left_behind(before, root=root)
    return signal


TIME_KEYS = ("timing_s/", "perf/", "verl/timing", "verl/perf", "verl/timing_per_token_ms", "verl/actor/perf")


def _untimed(record: dict) -> dict:
    return {k: v for k, v in record.items() if not k.startswith(TIME_KEYS)}


def _wait_for_reported_checkpoint(root: Path, stage: str, proc: subprocess.Popen, step: int) -> None:
    """Until verl has checkpointed ``step`` and logged its metrics (it saves first: a kill between the two
    rewinds to the checkpoint before, stage.rewind_to_reported, tested in test_verl_rewind.py)."""
    work = root / "artifacts" / stage / "work" / "verl"
    tracker = work / "checkpoints" / "latest_checkpointed_iteration.txt"
    deadline = time.monotonic() + TIMEOUT_S
    while time.monotonic() < deadline:
        if tracker.exists() and tracker.read_text().strip() == str(step) and step in verl_steps(work):
            return
        assert proc.poll() is None, _tail(root, stage)
        time.sleep(0.5)
    raise AssertionError(f"no reported step-{step} checkpoint within {TIMEOUT_S} s")


def _checkpoint_weights(root: Path, stage: str, step: int) -> dict[str, torch.Tensor]:
    """The fp32 weights of verl's step-``step`` checkpoint, each parameter's rank shards put back together by
    their DTensor placements (FSDP2: dim-0 shards, in rank order)."""
    actor = root / "artifacts" / stage / "work" / "verl" / "checkpoints" / f"global_step_{step}" / "actor"
    files = sorted(actor.glob("model_world_size_*_rank_*.pt"), key=lambda f: int(f.stem.rsplit("_", 1)[1]))
    shards = [torch.load(f, weights_only=False, map_location="cpu") for f in files]
    full = {}
    for key, first in shards[0].items():
        if hasattr(first, "placements"):
            assert all(p.is_shard(0) for p in first.placements), (key, first.placements)
            full[key] = torch.cat([s[key].to_local() for s in shards])
        else:
            full[key] = first
    return full


def _kept_per_step(records: list[dict]) -> list[int]:
    """How many rollouts each step trained on (generated less those the structural filter dropped)."""
    return [
        int(r["train/rollouts_generated"] - r.get("rollout/structurally_rejected", 0.0))
        for r in records
        if "reward/mean" in r
    ]


# What a step reports that depends on how its batch was split over ranks and micro-batches, not on what was
# trained: verl's per-rank sequence-length statistics (not compared), its ppo_kl (a mean over ranks of
# micro-batch means) and the NPR actor's per-token means over pre- or post-merge tokens (means of micro-batch
# means: no global denominator reaches a micro-batch; plugins/engine.py). Measured 1 rank against 2 on the
# same batches: at most 0.9% apart (post-merge |dlogp| mean), ppo_kl 0.46%.
RANK_SPLIT = ("verl/actor/ppo_kl", "_abs_logp_diff_mean", "post_merge_is_weight_mean", "post_merge_is_truncated_frac")
RANK_SPLIT_REL = 2e-2


def _across_ranks(record: dict) -> tuple[dict, dict]:
    """``record`` without its timings and its rank-split statistics, and those statistics."""
    kept = {k: v for k, v in _untimed(record).items() if not k.startswith("verl/global_seqlen/")}
    split = {k: kept.pop(k) for k in list(kept) if k.endswith(RANK_SPLIT)}
    return kept, split


def test_a_killed_two_rank_verl_stage_resumes_and_reports_the_one_rank_run(repo: Path, tmp_path: Path) -> None:
    stage = "papo_rl"
    before = _ray_processes()
    other = _make_repo(tmp_path / "repo", extra=(f"{stage}.verl.n_gpus_per_node={RANKS}",))
    reference = _npr_stage(repo, stage)  # the uninterrupted 1-rank run, beside the 2-rank one that is killed
    proc = _npr_stage(other, stage, start_new_session=True)
    _wait_for_reported_checkpoint(other, stage, proc, 1)
    os.killpg(proc.pid, signal.SIGKILL)  # the stage, with no chance to stop anything it started
    proc.wait(timeout=60)
    # they follow it (the reference job's processes run on)
    assert not _left_behind(before, root=other), "a killed stage left Ray or verl's driver running"

    rerun = _npr_stage(other, stage)
    uninterrupted = _finish(repo, stage, reference)
    # npr_zero (DAPO, verl's stock actor and single-turn loop, 2 ranks) takes the lane the reference leaves,
    # killed after its step-1 checkpoint too (while papo_rl's rerun goes on) and rerun; Parallel-R1's RL takes
    # the lane papo_rl's rerun leaves
    zero = _npr_stage(repo, "npr_zero", start_new_session=True)
    _wait_for_reported_checkpoint(repo, "npr_zero", zero, 1)
    os.killpg(zero.pid, signal.SIGKILL)
    zero.wait(timeout=60)
    assert not _left_behind(before, root=repo), "a killed npr_zero left Ray or verl's driver running"
    zero = _npr_stage(repo, "npr_zero")
    resumed = _finish(other, stage, rerun)
    pr1 = _npr_stage(other, "pr1_rl")
    zero_metrics = _finish(repo, "npr_zero", zero)
    pr1_metrics = _finish(other, "pr1_rl", pr1)
    # resumed from its 2-shard step-1 checkpoint: each step trained and reported once, over two drivers
    assert zero_metrics["attempts"] == 2 and zero_metrics["resumed_from_step"] == 1
    assert _assert_trained_through_verl(repo, "npr_zero", zero_metrics, before, attempts=2)
    assert _assert_trained_through_verl(repo, stage, uninterrupted, before)
    # pr1_rl starts here from tiny-instruct with Parallel-R1's tags added and no cold start: trained under the
    # NPR instruction only, it next to never answers right under Parallel-R1's (0 of 32 rollouts on
    # 2026-12-05), so its accuracy reward is -1 for every rollout and GRPO may have nothing to learn from,
    # which the check accepts (unchanged weights, zero gradient). It is native parallel: the NPR actor and the
    # npr_parallel agent loop, schema parallel_r1
    _assert_trained_through_verl(other, "pr1_rl", pr1_metrics, before)
    overrides = (other / "artifacts" / "pr1_rl" / "work" / "verl" / "verl_overrides.yaml").read_text()
    assert "default_agent_loop=npr_parallel" in overrides and "NPR_SCHEMA: parallel_r1" in overrides
    assert resumed["attempts"] == 2 and resumed["resumed_from_step"] == 1
    # every step of the run is reported once, as the uninterrupted 1-rank run reported it: the same rollouts,
    # rewards and held-out results; the actor's numbers to fp32 rounding (verl orders a step's samples by random
    # uids, and two ranks reduce in another order)
    two, one = _records(other, stage), _records(repo, stage)
    assert len(two) == len(one)
    for a, b in zip(two, one, strict=True):
        (a_kept, a_split), (b_kept, b_split) = _across_ranks(a), _across_ranks(b)
        _assert_same(a_kept, b_kept, f"records step {a.get('step')}")
        assert set(a_split) == set(b_split)
        for key in a_split:
            assert math.isclose(a_split[key], b_split[key], rel_tol=RANK_SPLIT_REL, abs_tol=1e-6), key
    for key in ("steps", "final/accuracy", "final/format_valid", "evals", "train/rollouts_generated", "reward/mean"):
        _assert_same(resumed[key], uninterrupted[key], key)
    # a step's filtered batch did not divide by the world size, and both ranks trained on it (verl balances
    # unequal shards; the update still equals the 1-rank one below)
    assert any(n % RANKS for n in _kept_per_step(two)), f"no step exercised an uneven batch: {_kept_per_step(two)}"
    # each update on 2 ranks (the 2nd after the resume, from the 2-shard checkpoint) equals the 1-rank update of
    # the same batch to fp32 reduction noise: measured 8.9e-8 at most per weight, 1.7e-8 relative per tensor
    for step in (1, 2):
        w2, w1 = _checkpoint_weights(other, stage, step), _checkpoint_weights(repo, stage, step)
        assert w2.keys() == w1.keys()
        worst = max(float((w2[k] - w1[k]).abs().max()) for k in w1)
        assert worst <= 1e-6, f"step {step}: 2-rank and 1-rank updates differ by up to {worst}"
    # verl's merger put the 2 shards back together: its output is the trainer's weights rounded to bf16 (the
    # merger's dtype), bit for bit
    merged = load_file(str(other / "artifacts" / stage / "model" / "model.safetensors"))
    trained = _checkpoint_weights(other, stage, 2)
    assert merged and all(torch.equal(merged[k], trained[k].to(torch.bfloat16)) for k in merged), "merge is not the shards"
    a = load_file(str(repo / "artifacts" / stage / "model" / "model.safetensors"))
    # bf16 outputs of fp32 weights equal to rounding: at most one bf16 step apart
    assert all(torch.allclose(a[k].float(), merged[k].float(), rtol=2**-7, atol=1e-6) for k in a)


ROUNDING_METRICS = ("rollout_probs_diff", "rollout_corr", "ppo_kl", "probs_pearson")


def _assert_same(a, b, where: str) -> None:
    """Equal, floats to fp32 rounding of a step (relative 1e-4)."""
    if isinstance(a, dict) and isinstance(b, dict):
        assert set(a) == set(b), (where, set(a) ^ set(b))
        for k in a:
            _assert_same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            _assert_same(x, y, f"{where}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        # the rollout/trainer mismatch diagnostics measure rounding itself (values of 1e-5): absolute bound
        tol = 1e-4 if any(k in where for k in ROUNDING_METRICS) else 1e-6
        assert math.isclose(a, b, rel_tol=1e-4, abs_tol=tol), (where, a, b)
    else:
        assert a == b, (where, a, b)
