"""The local RL recipe end to end on a real (briefly warmed) tiny Qwen3: resume, PAPO filtering, stage wiring."""

from __future__ import annotations

import json

import pytest
import torch

from components.artifacts import write_shards
from components.config import load_config
from components.dag import StageIO
from components.data.synthetic import generate_problems
from components.models.loading import save_model
from components.training.job import RLPaths, rl_job
from components.training.rl import RLTrainer, train_rl

pytestmark = pytest.mark.slow

SMALL = ["steps=2", "prompts_per_step=4", "group_size=4", "max_new_tokens=128", "eval_n=8", "eval_every=2"]


def small_cfg(stage: str, *extra: str):
    # The warm test world is almost never format-valid: the paper's graded penalty (offset 0) keeps the
    # rewards within a group distinct, so groups survive dynamic sampling and the run really trains.
    overrides = [f"{stage}.{o}" for o in [*SMALL, *extra]] + ["grading.stage1.invalid_offset=0.0"]
    return load_config(profile="tiny", overrides=overrides)


def problems():
    ps = generate_problems(48, seed=21, weights={"easy": 1.0})  # the shortest traces
    return ps[:40], ps[40:]


def test_resume_after_an_interrupted_run_matches_an_uninterrupted_one(warm_world, warm_world_state, tmp_path):
    from components.models.tiny import tiny_test_world

    cfg = small_cfg("npr_zero", "save_every=1", "max_gen_batches=2", "mini_batches=2")
    train, test = problems()
    model, tok = warm_world
    init = {k: v.clone() for k, v in model.state_dict().items()}
    full = RLTrainer(rl_job("npr_zero", cfg), model, tok, train, test, tmp_path / "full").run()
    assert full.metrics["steps"] == 2 and full.metrics["resumed_from_step"] == 0
    assert full.metrics["train/rollouts_trained"] > 0, "the run must actually update the model"
    assert any(not torch.equal(init[k], v) for k, v in model.state_dict().items())

    def fresh():
        m, _ = tiny_test_world(seed=0)
        m.load_state_dict(warm_world_state[0])
        return m

    first = fresh()
    part = RLTrainer(rl_job("npr_zero", cfg), first, tok, train, test, tmp_path / "cut").run(max_steps=1)
    assert part.metrics["steps"] == 1
    second = fresh()  # a new process would start from the initial weights again
    resumed = RLTrainer(rl_job("npr_zero", cfg), second, tok, train, test, tmp_path / "cut").run()
    assert resumed.metrics["resumed_from_step"] == 1 and resumed.metrics["steps"] == 2
    assert [h["step"] for h in resumed.history] == [2]
    for key in ("train/rollouts_trained", "train/num_gen_batches", "train/trained_valid_fraction"):
        assert resumed.metrics[key] == full.metrics[key], f"{key}: totals cover the steps before the resume"
    for key, value in model.state_dict().items():
        torch.testing.assert_close(second.state_dict()[key], value, rtol=0, atol=1e-6, msg=key)
    untimed = [{k: v for k, v in e.items() if k != "wall_s"} for e in (resumed.evals[0], full.evals[0])]
    assert untimed[0] == untimed[1], "the pre-training eval is restored from the checkpoint"


def test_papo_stage_trains_only_structurally_valid_rollouts(warm_world, tmp_path):
    model, tok = warm_world
    cfg = small_cfg(
        "papo_rl",
        "steps=1",
        "eval_every=1",
        "max_new_tokens=96",
        "prompts_per_step=8",
        "eval_samples=3",
        "eval_before_train=true",
    )
    cfg.tracking.mode = "disabled"
    train, test = problems()
    problems_dir = tmp_path / "problems"
    write_shards(problems_dir, [dict(p, split="train") for p in train], 1, stem="train")
    write_shards(problems_dir, [dict(p, split="test") for p in test], 1, stem="test")
    save_model(model, tok, tmp_path / "parallel_warmup" / "model")
    io = StageIO(
        stage="papo_rl",
        inputs={
            "parallel_warmup/model": tmp_path / "parallel_warmup" / "model",
            "sample_orz/problems": problems_dir,
        },
        outputs={"model": tmp_path / "papo_rl" / "model"},
    )
    metrics = train_rl(rl_job("papo_rl", cfg, RLPaths.of(io, cfg.papo_rl.init_from)))
    assert (tmp_path / "papo_rl" / "model" / "model.safetensors").exists()
    log = (tmp_path / "papo_rl" / "work" / "metrics.jsonl").read_text().splitlines()
    assert len(log) == 2  # the pre-training eval and one step
    step = json.loads(log[-1])
    generated, trained = step["train/rollouts_generated"], step["train/rollouts_trained"]
    rejected = step["rollout/structurally_rejected"]
    assert generated == 32 and trained + rejected == generated
    assert rejected > 0 and trained > 0, "the warmed model writes some malformed and some valid traces"
    assert step["dynamic_sampling/num_gen_batches"] == 1, "PAPO has no dynamic sampling"
    for key in ("final/correct_and_valid", "initial/format_valid", "delta/format_valid", "perf/tokens_per_s"):
        assert key in metrics
    first_eval = metrics["evals"][0]
    assert first_eval["problems"] == len(test) and first_eval["n"] == 3 * len(test), "3 samples per problem"


def test_papo_trainer_rejects_a_parallel_engine_without_the_filter(warm_world, tmp_path):
    model, tok = warm_world
    cfg = small_cfg("papo_rl")  # the config itself rejects the combination (tests/unit/core/test_config.py)
    cfg.papo_rl.structural_filter = False
    train, test = problems()
    with pytest.raises(ValueError, match="structural_filter"):
        RLTrainer(rl_job("papo_rl", cfg), model, tok, train, test, tmp_path)
