"""The RL update in length-sorted micro-batches takes the same optimizer step as one batch."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from components.config import load_config
from components.data.synthetic import generate_problems
from components.training.job import rl_job
from components.training.rl import RLTrainer
from components.training.rl_batch import length_sorted_micro_batches
from tests.support.builders import random_rollout_groups


@pytest.fixture(scope="module")
def world():
    from components.models.tiny import tiny_test_world

    return tiny_test_world(seed=0)


@pytest.mark.parametrize(
    ("stage", "extra"),
    [
        ("npr_zero", ["npr_zero.mini_batches=2"]),  # DAPO, two optimizer steps with old log-probs
        ("papo_rl", ["papo_rl.engine_mode=sequential"]),  # PAPO's loss on a plain causal layout
    ],
)
def test_micro_batched_update_equals_one_batch(world, tmp_path, stage, extra):
    model, tok = world
    problems = generate_problems(4, seed=1)
    results = []
    for micro in (None, 3):
        cfg = load_config(
            profile="tiny",
            # lr 1e-3: with two optimizer steps the second gradient follows the first Adam step, and Adam turns
            # rounding in near-zero gradients into lr-sized moves (at 1e-2 that alone reached 1.5e-4 of scale)
            # fp32 compute (run.autocast null): the equality is the trainer's arithmetic, not bf16 rounding
            overrides=[
                *extra,
                f"{stage}.lr=1e-3",
                f"{stage}.micro_batch_size={micro or 'null'}",
                "run.autocast=null",
            ],
        )
        copy = type(model)(model.config)
        copy.load_state_dict(model.state_dict())
        trainer = RLTrainer(rl_job(stage, cfg), copy, tok, problems, problems, tmp_path / str(micro))
        stats = trainer._update(random_rollout_groups(len(tok)), Counter())
        results.append((stats, {n: q.grad.clone() for n, q in copy.named_parameters()}))
    (one, g_one), (micro, g_micro) = results
    assert sum(float(g.abs().sum()) for g in g_one.values()) > 0, "the loss must have a gradient"
    for key in g_one:  # the (last) optimizer step's gradient; Adam would magnify rounding in near-zero ones
        scale = float(g_one[key].abs().max())
        torch.testing.assert_close(g_micro[key], g_one[key], rtol=0, atol=1e-4 * scale + 1e-10, msg=key)
    for name in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "actor/optimizer_steps"):
        assert micro[name] == pytest.approx(one[name], rel=1e-4, abs=1e-7), name


def test_micro_batches_are_length_sorted_and_cover_every_rollout(world):
    _, tok = world
    rollouts = [r for g in random_rollout_groups(len(tok), 4, 5) for r in g]
    idx = list(range(len(rollouts)))
    parts = length_sorted_micro_batches(rollouts, idx, 6)
    assert [len(p) for p in parts] == [5, 5, 5, 5] and sorted(i for p in parts for i in p) == idx

    def length(i):
        return len(rollouts[i].prompt_ids) + len(rollouts[i].response_ids)

    assert all(max(map(length, a)) <= min(map(length, b)) for a, b in zip(parts, parts[1:], strict=False))
    assert length_sorted_micro_batches(rollouts, idx, None) == [idx]
    with pytest.raises(ValueError, match=">= 1"):
        length_sorted_micro_batches(rollouts, idx, 0)


def test_summary_reports_a_gain_only_when_measured_before_training(world, tmp_path):
    model, tok = world
    problems = generate_problems(4, seed=1)
    cfg = load_config(profile="tiny")
    trainer = RLTrainer(rl_job("papo_rl", cfg), model, tok, problems, problems, tmp_path)
    scores = {"format_valid": 0.5, "accuracy": 0.2, "correct_and_valid": 0.1, "parallel_rate": 0.5}
    trainer.evals = [{"step": 12, **scores}]
    out = trainer.summary()
    assert out["final/accuracy"] == 0.2 and not any(k.startswith(("initial/", "delta/")) for k in out)
    trainer.evals = [{"step": 0, **scores, "accuracy": 0.1}, {"step": 12, **scores}]
    out = trainer.summary()
    assert out["initial/accuracy"] == 0.1 and out["delta/accuracy"] == pytest.approx(0.1)
