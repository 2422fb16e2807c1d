"""pr1_coldstart then pr1_rl, end to end on the tiny test world, in both Parallel-R1 variants.

A few steps each: the cold start renders trajectories of the easy problems, gates them, adds the
``parallel_r1`` tags and trains with the variant's mask; the RL stage trains on the hard problems with the
alternating reward (period 2 here, so its second step rewards parallel answers), in the variant's decoding,
logs to W&B (offline) and resumes from its checkpoint after an interruption.
"""

from __future__ import annotations

import json

import pytest

from components.artifacts import write_shards
from components.config import load_config
from components.dag import StageIO
from components.data import synthetic
from components.models.loading import load_model, save_model
from components.models.tiny import tiny_test_world
from components.stages import pr1_coldstart, pr1_rl
from components.training.rl import RLTrainer


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("pr1")
    model, tokenizer = tiny_test_world(seed=0)
    save_model(model, tokenizer, root / "seed" / "model")
    problems = synthetic.generate_problems(90, seed=7, weights={"easy": 0.6, "medium": 0.2, "hard": 0.2})
    out = root / "sample_orz" / "problems"
    write_shards(out, [{**p, "split": "test"} for p in problems[:10]], 1, stem="test")
    write_shards(out, [{**p, "split": "train"} for p in problems[10:]], 1, stem="train")
    return root


def _io(root, variant: str, stage: str) -> StageIO:
    base = root / variant
    upstream = {
        "pr1_coldstart": ("seed/model", root / "seed" / "model"),
        "pr1_rl": ("pr1_coldstart/model", base / "pr1_coldstart" / "model"),
    }[stage]
    outputs = {"model": base / stage / "model"}
    if stage == "pr1_coldstart":
        outputs["audit"] = base / stage / "audit"
    return StageIO(
        stage=stage,
        inputs={upstream[0]: upstream[1], "sample_orz/problems": root / "sample_orz" / "problems"},
        outputs=outputs,
    )


def _cfg(attention: str):
    return load_config(
        profile="tiny",
        overrides=[
            f"parallel_r1.attention={attention}",
            "pr1_coldstart.max_steps=3",
            "pr1_coldstart.batch_size=4",
            "pr1_coldstart.data.n=12",
            "pr1_coldstart.data.difficulties=[easy]",  # short traces: every row fits this tokenizer's max_length
            "pr1_rl.steps=2",
            "pr1_rl.prompts_per_step=2",
            "pr1_rl.group_size=2",
            "pr1_rl.micro_batch_size=2",
            "pr1_rl.eval_n=4",
            "pr1_rl.eval_samples=1",
            "pr1_rl.eval_every=2",
            "pr1_rl.save_every=1",
            "pr1_rl.max_new_tokens=40",
            "grading.accuracy_parallel_interv.period=2",
            "grading.accuracy_parallel_interv.parallel_steps=1",
        ],
    )


@pytest.mark.parametrize("attention", ["unseen", "seen"])
def test_cold_start_then_rl(inputs, attention: str, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = _cfg(attention)
    io = _io(inputs, attention, "pr1_coldstart")
    cold = pr1_coldstart.run(cfg, io)
    assert cold["attention"] == attention and cold["mode"] == cfg.parallel_r1.mode
    data = cold["data"]
    assert data["source"] == "sample_orz" and data["difficulties"] == ["easy"]
    assert data["rows_in"] == data["kept"] == data["trained_on"] == 12 and data["trajectory_rejected"] == 0
    assert cold["n_examples"] == 12 and cold["steps"] == 3
    assert set(cold["tag_ids"]) == {
        "<Parallel>",
        "</Parallel>",
        "<Path>",
        "</Path>",
        "<Summary>",
        "</Summary>",
    }
    assert json.loads((io.output("audit") / "reconciliation.json").read_text())["balanced"]
    _, tokenizer = load_model(io.output("model"), cfg.models, cfg.run)
    assert len(tokenizer.encode("<Parallel>", add_special_tokens=False)) == 1

    # the RL stage, interrupted after its first (checkpointed) step, then run again: it resumes
    steps_seen: list[int] = []
    real_step = RLTrainer.train_step

    def interrupted(self):  # noqa: ANN001
        if self.step == 1 and not steps_seen:
            steps_seen.append(self.step)
            raise KeyboardInterrupt("killed")
        return real_step(self)

    monkeypatch.setattr(RLTrainer, "train_step", interrupted)
    rl_io = _io(inputs, attention, "pr1_rl")
    with pytest.raises(KeyboardInterrupt):
        pr1_rl.run(cfg, rl_io)
    assert not rl_io.output("model").exists()
    metrics = pr1_rl.run(cfg, rl_io)
    assert metrics["resumed_from_step"] == 1 and metrics["steps"] == 2 and metrics["algorithm"] == "grpo"
    assert metrics["reward"] == "accuracy_parallel_interv" and metrics["attention"] == attention
    problems = metrics["problems"]
    assert problems["source"] == "sample_orz" and problems["difficulties"] == ["medium", "hard"]
    assert problems["n_train"] == problems["available"]
    work = rl_io.output("model").parent / "work"
    log = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    steps = [row for row in log if "reward/mean" in row]
    assert [row["step"] for row in steps][-1] == 2
    forked = [row["rollout/engine_fork_rate"] for row in steps]
    if attention == "seen":
        assert all(f == 0.0 for f in forked)  # one sequential stream: the engine never forks
    assert (work / "wandb_run_id").is_file() and (
        io.output("model").parent / "work" / "wandb_run_id"
    ).is_file()
    assert metrics["final/parallel_rate"] >= 0.0
    model, tokenizer = load_model(rl_io.output("model"), cfg.models, cfg.run)
    assert len(tokenizer.encode("</Path>", add_special_tokens=False)) == 1


def test_cold_start_refuses_to_render_for_a_non_synthetic_task(inputs) -> None:
    cfg = load_config(profile="tiny", overrides=["sample_orz.source=local"])
    with pytest.raises(ValueError, match="synthetic task family"):
        pr1_coldstart.run(cfg, _io(inputs, "unseen", "pr1_coldstart"))
