"""Checkpoints: exact state round trip; an interrupted SFT run resumes and ends where an unbroken run ends."""

from __future__ import annotations

import random

import pytest
import torch

from components.training.checkpoint import (
    TrainingState,
    latest_checkpoint,
    list_checkpoints,
    load_checkpoint,
    save_checkpoint,
)
from components.training.sft import EpochSource, SFTSettings, build_optimizer, build_scheduler, train_sft
from tests.support.builders import sequential_sft_examples


@pytest.fixture(scope="module")
def world():
    from components.models.tiny import tiny_test_world

    return tiny_test_world(seed=0)


def _fresh(world):
    model = type(world[0])(world[0].config)
    model.load_state_dict(world[0].state_dict())
    return model


SETTINGS = SFTSettings(
    mode="sequential",
    total_steps=6,
    batch_size=2,
    grad_accum=2,
    lr=2e-3,
    min_lr=1e-4,
    warmup_steps=2,
    scheduler="cosine",
    weight_decay=0.1,
    save_every=2,
    seed=3,
)


class Crash(RuntimeError):
    pass


def test_state_round_trip(world, tmp_path):
    model = _fresh(world)
    opt = build_optimizer(model, SETTINGS)
    sched = build_scheduler(opt, SETTINGS)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()
    sched.step()
    random.seed(7)
    torch.manual_seed(7)
    path = save_checkpoint(tmp_path, TrainingState(5, {"note": "x"}), model, opt, sched)
    expected_py, expected_torch = random.random(), torch.rand(3)

    model2 = _fresh(world)
    opt2 = build_optimizer(model2, SETTINGS)
    sched2 = build_scheduler(opt2, SETTINGS)
    state = load_checkpoint(path, model2, opt2, sched2)
    assert state.step == 5 and state.extra == {"note": "x"}
    for a, b in zip(model.parameters(), model2.parameters(), strict=True):
        assert torch.equal(a, b)
    s1, s2 = opt.state_dict(), opt2.state_dict()
    for k in s1["state"]:
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(s1["state"][k][name], s2["state"][k][name])
    assert sched2.last_epoch == sched.last_epoch and opt2.param_groups[0]["lr"] == opt.param_groups[0]["lr"]
    assert random.random() == expected_py and torch.equal(torch.rand(3), expected_torch)


def test_interrupted_run_resumes_from_saved_step_and_matches_unbroken_run(world, tmp_path):
    _, tokenizer = world
    source = EpochSource(sequential_sft_examples(tokenizer, 12), SETTINGS.examples_per_step, seed=SETTINGS.seed)
    pad = tokenizer.pad_token_id

    unbroken = _fresh(world)
    train_sft(unbroken, source, SETTINGS, tmp_path / "a", pad_id=pad, show_progress=False)

    def crash_at_3(step, record):
        if step == 3:
            raise Crash

    crashed = _fresh(world)
    with pytest.raises(Crash):
        train_sft(
            crashed, source, SETTINGS, tmp_path / "b", pad_id=pad, on_step=crash_at_3, show_progress=False
        )
    assert latest_checkpoint(tmp_path / "b").name == "checkpoint-00000002"

    resumed = _fresh(world)  # a new process starts from the initial weights and must load the checkpoint
    result = train_sft(resumed, source, SETTINGS, tmp_path / "b", pad_id=pad, show_progress=False)
    assert result.start_step == 2 and result.final_step == 6
    for (name, a), b in zip(unbroken.named_parameters(), resumed.parameters(), strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-6, msg=name)
    assert [c.name for c in list_checkpoints(tmp_path / "b")] == [
        "checkpoint-00000004",
        "checkpoint-00000006",
    ]
    assert [h["step"] for h in result.history] == [1, 6]


def test_incomplete_checkpoint_is_ignored(world, tmp_path):
    model = _fresh(world)
    opt = build_optimizer(model, SETTINGS)
    save_checkpoint(tmp_path, TrainingState(2), model, opt, build_scheduler(opt, SETTINGS))
    broken = tmp_path / "checkpoint-00000004"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"")
    assert latest_checkpoint(tmp_path).name == "checkpoint-00000002"
