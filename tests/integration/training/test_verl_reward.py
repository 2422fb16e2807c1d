"""The tag-keeping reward manager, loaded by verl's own ``load_reward_manager`` from a job's composed config."""

from __future__ import annotations

import asyncio
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from verl import DataProto
from verl.experimental.reward_loop.reward_manager.dapo import DAPORewardManager
from verl.trainer.ppo.reward import get_custom_reward_fn, load_reward_manager

from components.config import load_config
from components.data.synthetic import expression_of, generate_problems, render_parallel
from components.models.tiny import tiny_test_world
from components.prompts import render_prompt
from components.training.verl.job import VerlRunInputs, build_overrides, reward_settings
from components.training.verl.plugins.reward import TagKeepingRewardManager
from components.training.verl.validate import compose_verl_config

INPUTS = VerlRunInputs("/models/m", "/data/train.parquet", "/data/val.parquet", "/runs/x")


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_test_world(seed=0)[1]


def _sample(tok, cfg, problem: dict, response: str, stage: str) -> DataProto:
    """One sample as verl's reward loop hands it to ``run_single``: ids with the end-of-turn token."""
    prompt = tok.encode(
        render_prompt(tok, problem["problem"], cfg.prompts, "parallel"), add_special_tokens=False
    )
    resp = tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]
    return DataProto.from_dict(
        tensors={
            "prompts": torch.tensor([prompt]),
            "responses": torch.tensor([resp]),
            "attention_mask": torch.ones(1, len(prompt) + len(resp), dtype=torch.long),
        },
        non_tensors={
            "data_source": np.array(["synthetic"], dtype=object),
            "reward_model": np.array([{"ground_truth": str(problem["answer"])}], dtype=object),
            "extra_info": np.array(
                [{"id": problem["id"], "split": "train", **reward_settings(getattr(cfg, stage), cfg.grading, cfg.schema_name)}],
                dtype=object,
            ),
        },
    )


def _score(stage: str, tok, cfg, responses: list[str], problem: dict, manager_cls=None):
    """``run_single`` results for ``responses`` and the job config; the manager is built inside the event
    loop, as verl's reward-loop worker builds it."""
    config = compose_verl_config(build_overrides(stage, getattr(cfg, stage), INPUTS, "npr"))

    async def run() -> list[dict]:
        if manager_cls is None:  # verl's loader: registry name `npr` + reward.custom_reward_function by path
            manager = load_reward_manager(config, tok)
            assert isinstance(manager, TagKeepingRewardManager)
        else:
            manager = manager_cls(config, tok, get_custom_reward_fn(config))
        return [await manager.run_single(_sample(tok, cfg, problem, r, stage)) for r in responses]

    return asyncio.run(run()), config


def test_a_correct_trace_scores_plus_one_and_a_correct_malformed_one_the_stage3_value(
    tokenizer, in_repo: Path
):
    cfg = load_config(profile="tiny")
    problem = generate_problems(1, seed=5)[0]
    valid = render_parallel(expression_of(problem), random.Random(0))
    # the same answer, but the first step never closes: no attention mask exists for it
    malformed = valid.replace("</step>", "", 1)
    results, config = _score("papo_rl", tokenizer, cfg, [valid, malformed], problem)
    assert config.reward.reward_manager.name == "npr"
    good, broken = results
    assert good["reward_score"] == cfg.grading.stage3.correct == 1.0
    assert good["reward_extra_info"]["valid"] and good["reward_extra_info"]["acc"] == 1.0
    # Stage 3 on a correct but malformed trace: filtered (never a learning signal), neutral score 0
    assert broken["reward_extra_info"]["filtered"] is True and broken["reward_extra_info"]["acc"] == 1.0
    assert broken["reward_score"] == 0.0

    # verl's stock DAPO manager decodes with skip_special_tokens=True: the tags vanish, the malformed
    # trace reads as a plain correct answer and is rewarded as if it were fine
    stock, _ = _score("papo_rl", tokenizer, cfg, [malformed], problem, manager_cls=DAPORewardManager)
    assert stock[0]["reward_extra_info"]["filtered"] is False and stock[0]["reward_score"] == 1.0


def test_stage1_sees_the_format_of_sequential_stages(tokenizer, in_repo: Path):
    """npr_zero / sr_rl (stage1, format + accuracy): a valid correct trace +1, a malformed one its penalty."""
    cfg = load_config(profile="tiny")
    problem = generate_problems(1, seed=6)[0]
    valid = render_parallel(expression_of(problem), random.Random(1))
    malformed = valid.replace("</step>", "", 1)
    for stage in ("npr_zero", "sr_rl"):
        (good, broken), _ = _score(stage, tokenizer, cfg, [valid, malformed], problem)
        assert good["reward_score"] == cfg.grading.stage1.correct
        assert broken["reward_score"] < cfg.grading.stage1.wrong  # the format penalty, below a wrong answer
        assert broken["reward_extra_info"]["valid"] is False


def test_decoder_keeps_tags_and_drops_only_the_end_of_turn(tokenizer):
    from components.training.verl.plugins.reward import TagKeepingDecoder

    dec = TagKeepingDecoder(tokenizer)
    ids = tokenizer.encode("<step>1: x</step>", add_special_tokens=False)
    assert dec.decode(ids + [tokenizer.eos_token_id], skip_special_tokens=True) == "<step>1: x</step>"
    assert dec.pad_token_id == tokenizer.pad_token_id  # everything else is the tokenizer's


def test_the_manager_hands_the_training_step_to_a_scheduled_reward(tokenizer, in_repo: Path):
    """pr1_rl (Seen, verl's single-turn loop): the alternating reward reads the sample's global_steps,
    which verl's agent-loop worker passes with the sample's fields."""
    from components.models.tags import add_tag_tokens
    from components.models.tiny import tiny_test_world

    model, tok = tiny_test_world(seed=0)
    add_tag_tokens(model, tok, "parallel_r1")
    cfg = load_config(profile="tiny", overrides=["parallel_r1.attention=seen"])
    config = compose_verl_config(build_overrides("pr1_rl", cfg.pr1_rl, INPUTS, "npr"))
    parallel = (
        "<Parallel><Path>3 + 4 = 7 here</Path><Path>4 + 3 = 7 too</Path></Parallel>"
        "<Summary>both paths give 7</Summary>\nFinal Answer: 7"
    )
    sequential = "3 + 4 = 7.\nFinal Answer: 7"

    def sample(response: str, step: int | None) -> DataProto:
        prompt = tok.encode("Compute 3 + 4.", add_special_tokens=False)
        resp = tok.encode(response, add_special_tokens=False) + [tok.eos_token_id]
        non_tensors = {
            "data_source": np.array(["synthetic"], dtype=object),
            "reward_model": np.array([{"ground_truth": "7"}], dtype=object),
            "extra_info": np.array([reward_settings(cfg.pr1_rl, cfg.grading, "parallel_r1")], dtype=object),
        }
        if step is not None:
            non_tensors["global_steps"] = np.array([step])
        return DataProto.from_dict(
            tensors={
                "prompts": torch.tensor([prompt]),
                "responses": torch.tensor([resp]),
                "attention_mask": torch.ones(1, len(prompt) + len(resp), dtype=torch.long),
            },
            non_tensors=non_tensors,
        )

    async def run() -> tuple[list[float], BaseException | None]:
        manager = load_reward_manager(config, tok)
        scores = [
            (await manager.run_single(sample(text, step)))["reward_score"]
            for step in (8, 9)
            for text in (parallel, sequential)
        ]
        try:
            await manager.run_single(sample(parallel, None))
        except ValueError as err:
            return scores, err
        return scores, None

    scores, missing = asyncio.run(run())
    assert scores == [1.0, 1.0, 1.2, 1.0]
    assert missing is not None and "training step" in str(missing)
