"""DAPO from verl's pieces: vanilla clipped loss, dynamic sampling, overlong buffer."""

from __future__ import annotations

import pytest
import torch
from verl.trainer.ppo.core_algos import compute_policy_loss_vanilla
from verl.workers.config import ActorConfig
from verl.workers.config.actor import PolicyLossConfig

from components.config import load_config
from components.training.dapo import DynamicSampler, mixed_group_mask, overlong_penalty
from components.training.rl_objective import actor_config, compute_advantages, compute_policy_loss

torch.set_num_threads(1)


def test_dapo_loss_equals_verl_vanilla_and_a_hand_computed_clip():
    stage = load_config(profile="tiny").npr_zero
    assert (stage.clip_ratio_low, stage.clip_ratio_high, stage.loss_agg_mode) == (0.2, 0.28, "token-mean")
    old = torch.log(torch.tensor([[0.5, 0.5, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5]]))
    new = torch.log(torch.tensor([[0.75, 0.6, 0.3, 0.5], [0.75, 0.3, 0.5, 0.9]]))
    adv = torch.tensor([[1.0, 1.0, 1.0, 1.0], [-1.0, -1.0, -1.0, -1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])

    ours, _ = compute_policy_loss("dapo", old, new, adv, mask, actor_config(stage))
    verl_cfg = ActorConfig(
        strategy="fsdp",
        rollout_n=8,
        ppo_micro_batch_size_per_gpu=1,
        clip_ratio_low=0.2,
        clip_ratio_high=0.28,
        clip_ratio_c=10.0,
        loss_agg_mode="token-mean",
        policy_loss=PolicyLossConfig(loss_mode="vanilla"),
    )
    ref, _ = compute_policy_loss_vanilla(old, new, adv, mask, "token-mean", verl_cfg, None)
    torch.testing.assert_close(ours, ref)
    # by hand: ratios 1.5, 1.2, 0.6 | 1.5, 0.6, 1.0, 1.8; A>0 -> -min(r, 1.28)·A; A<0 -> max(r, 0.8)·|A|
    hand = (-(1.28 + 1.2 + 0.6) + (1.5 + 0.8 + 1.0 + 1.8)) / 7
    assert ours.item() == pytest.approx(hand, abs=1e-6)


def test_dapo_advantage_is_verl_grpo():
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0])
    adv = compute_advantages("dapo", rewards, torch.ones(4, 3), ["a", "a", "b", "b"])
    # group a: mean 0, unbiased std sqrt(2) -> ±0.7071; group b: all equal -> 0
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.70710, -0.70710, 0.0, 0.0]), atol=1e-4, rtol=0)


def test_dapo_advantage_without_std_is_the_group_centred_reward():
    # Dr. GRPO (verl norm_adv_by_std_in_grpo=False): one valid-but-wrong (-1) among invalid (-1.5) rollouts
    # keeps its small reward gap instead of being inflated to a correctness-sized advantage
    rewards = torch.tensor([-1.0, -1.5, -1.5, -1.5, 1.0, -1.0])
    groups = ["a"] * 4 + ["b"] * 2
    plain = compute_advantages("dapo", rewards, torch.ones(6, 2), groups, norm_adv_by_std=False)[:, 0]
    torch.testing.assert_close(plain, torch.tensor([0.375, -0.125, -0.125, -0.125, 1.0, -1.0]))
    scaled = compute_advantages("dapo", rewards, torch.ones(6, 2), groups)[:, 0]
    assert scaled[0].item() == pytest.approx(1.5, abs=1e-3)  # 0.375 / std(0.25 unbiased) = 1.5
    with pytest.raises(ValueError, match="GRPO/DAPO option"):
        compute_advantages("papo", rewards, torch.ones(6, 2), groups, norm_adv_by_std=False)


def test_overlong_penalty_is_verls_ramp():
    lengths = torch.tensor([10, 90, 95, 100])
    pen = overlong_penalty(lengths, max_response_length=100, buffer_len=10, penalty_factor=1.0)
    torch.testing.assert_close(pen, torch.tensor([0.0, 0.0, -0.5, -1.0]))
    assert torch.all(overlong_penalty(lengths, 100, 0, 1.0) == 0)
    with pytest.raises(ValueError):
        overlong_penalty(lengths, 5, 10, 1.0)


def test_mixed_group_mask_keeps_only_groups_with_distinct_rewards():
    scores = [1, 1, 1, -1, 1, -1, -1, -1, 0.5]
    index = ["a", "a", "a", "b", "b", "c", "c", "c", "d"]
    assert mixed_group_mask(scores, index).tolist() == [False] * 3 + [True] * 2 + [False] * 3 + [True]


def _groups(batch: int, pattern: list[list[float]]) -> list[tuple[str, list[float]]]:
    return [(f"b{batch}g{i}", scores) for i, scores in enumerate(pattern)]


def test_dynamic_sampling_refills_and_keeps_only_mixed_groups():
    batches = [
        [[1, 1], [1, -1], [-1, -1], [-1, -1]],  # 1 mixed
        [[-1, 1], [1, 1], [1, -1], [-1, 1]],  # 3 mixed
    ]
    sampler = DynamicSampler(
        generate=lambda k: _groups(k, batches[k]),
        scores_of=lambda g: g[1],
        target_groups=3,
        max_gen_batches=5,
    )
    kept, stats = sampler.collect()
    assert [g[0] for g in kept] == ["b0g1", "b1g0", "b1g2"]
    assert all(len(set(g[1])) > 1 for g in kept)
    assert (stats.num_gen_batches, stats.groups_generated, stats.groups_filtered) == (2, 8, 4)
    assert stats.groups_kept == 3 and stats.groups_surplus == 1 and stats.reached_target
    assert dict(stats.filtered_by_score) == {1.0: 2, -1.0: 2}


def test_dynamic_sampling_stops_at_the_cap_and_proceeds_with_what_there_is():
    calls = []

    def generate(k: int):
        calls.append(k)
        return _groups(k, [[1, 1], [1, -1], [-1, -1]])

    kept, stats = DynamicSampler(generate, lambda g: g[1], target_groups=10, max_gen_batches=3).collect()
    assert calls == [0, 1, 2]
    assert len(kept) == 3 and not stats.reached_target
    m = stats.as_metrics()
    assert m["dynamic_sampling/num_gen_batches"] == 3 and m["dynamic_sampling/groups_filtered"] == 6


def test_dynamic_sampling_disabled_uses_the_first_batch_unfiltered():
    kept, stats = DynamicSampler(
        lambda k: _groups(k, [[1, 1], [1, -1]]), lambda g: g[1], target_groups=2, enabled=False
    ).collect()
    assert len(kept) == 2 and stats.num_gen_batches == 1 and stats.groups_filtered == 0
