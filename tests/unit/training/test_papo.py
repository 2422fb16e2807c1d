"""PAPO as verl plugins: the registered advantage and loss against direct implementations of the paper."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn

import components.training.papo as papo
from components.config import load_config
from components.training.rl_objective import actor_config, compute_advantages, compute_policy_loss

torch.set_num_threads(1)


def paper_advantages(rewards: list[float], groups: list[str], eps: float = 1e-6) -> list[float]:
    """NPR's batch-normalised advantage written out: group mean baseline, one std over the batch."""
    std = statistics.stdev(rewards)
    out = []
    for r, g in zip(rewards, groups, strict=True):
        members = [rr for rr, gg in zip(rewards, groups, strict=True) if gg == g]
        mean = statistics.fmean(members) if len(members) > 1 else 0.0
        out.append((r - mean) / (std + eps))
    return out


def test_registered_in_verl_registries():
    assert get_policy_loss_fn("papo") is papo.compute_policy_loss_papo
    assert get_adv_estimator_fn("papo") is papo.compute_papo_advantage


def test_advantage_matches_paper_formula():
    rewards = [1.0, -1.0, -1.0, 1.0, 1.0, 1.0, -1.0, 0.0, 1.0]
    groups = ["a", "a", "a", "b", "b", "b", "c", "c", "d"]  # "d" is a singleton (baseline 0, verl convention)
    mask = torch.ones(len(rewards), 5)
    mask[0, 3:] = 0
    adv = compute_advantages("papo", torch.tensor(rewards), mask, groups)
    expected = torch.tensor(paper_advantages(rewards, groups))
    torch.testing.assert_close(adv[:, 0], expected, rtol=0, atol=1e-6)
    assert torch.all(adv[0, 3:] == 0), "advantage must be zero outside the response"
    # pinned: group a mean -1/3; unbiased std of the 9 rewards sqrt(68/72) = 0.971825; (4/3)/0.971825 = 1.371987
    assert adv[0, 0].item() == pytest.approx(1.3719873, abs=1e-5)


def test_std_is_computed_once_not_recomputed_in_loop():
    # NPR's released loop divides later items by the std of a partly normalised vector; with one std,
    # two responses with the same centred reward in different groups get the same advantage.
    rewards = torch.tensor([3.0, 1.0, 5.0, 3.0])
    adv = compute_advantages("papo", rewards, torch.ones(4, 2), ["x", "x", "y", "y"])[:, 0]
    assert adv[0].item() == pytest.approx(-adv[1].item(), rel=1e-6)
    assert adv[2].item() == pytest.approx(-adv[3].item(), rel=1e-6)
    assert adv[0].item() == pytest.approx(1.0 / rewards.std().item(), rel=1e-5)
    assert adv[2].item() == pytest.approx(1.0 / rewards.std().item(), rel=1e-5)


def test_equal_rewards_never_divide_by_epsilon():
    # all rewards -1 (a batch where every trace was wrong), one group cut to a single survivor by the
    # structural filter: its zero baseline leaves -1, which over a zero std would become -1e6
    rewards = torch.tensor([-1.0, -1.0, -1.0, -1.0])
    adv = compute_advantages("papo", rewards, torch.ones(4, 3), ["a", "a", "a", "b"])[:, 0]
    torch.testing.assert_close(adv[:3], torch.zeros(3))
    assert adv[3].item() == pytest.approx(-1.0, rel=1e-5)  # scale 1, as a lone response has in verl


def test_advantage_rejects_mismatched_index():
    with pytest.raises(ValueError, match="index"):
        papo.compute_papo_advantage(torch.ones(3, 2), torch.ones(3, 2), np.array(["a", "b"], dtype=object))


def _toy_policy(seed: int = 0, bs: int = 6, length: int = 7, vocab: int = 11):
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(bs, length, vocab, generator=gen, requires_grad=True)
    tokens = torch.randint(0, vocab, (bs, length), generator=gen)
    mask = torch.ones(bs, length)
    mask[1, 5:] = 0
    mask[4, 2:] = 0
    return logits, tokens, mask


def _log_probs(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    return torch.log_softmax(logits, dim=-1).gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def test_gradient_equals_reinforce_with_batch_normalised_advantage():
    stage = load_config(profile="tiny").papo_rl
    logits, tokens, mask = _toy_policy()
    rewards = torch.tensor([1.0, -1.0, 1.0, 1.0, -1.0, -1.0])
    groups = ["p", "p", "p", "q", "q", "q"]
    adv = compute_advantages("papo", rewards, mask, groups)

    log_prob = _log_probs(logits, tokens)
    loss, metrics = compute_policy_loss("papo", log_prob.detach(), log_prob, adv, mask, actor_config(stage))
    (grad_papo,) = torch.autograd.grad(loss, logits)

    a = torch.tensor(paper_advantages(rewards.tolist(), groups)).unsqueeze(-1)
    reinforce = -(a * _log_probs(logits, tokens) * mask).sum() / mask.sum()
    (grad_ref,) = torch.autograd.grad(reinforce, logits)
    torch.testing.assert_close(grad_papo, grad_ref, rtol=0, atol=1e-6)
    assert loss.item() == pytest.approx(-(a * mask).sum().item() / mask.sum().item(), abs=1e-6)
    assert metrics["actor/pg_clipfrac"] == 0.0


def test_tag_tokens_get_gradient_where_a_clipped_loss_masks_them():
    # A rare tag token whose probability rose far above the rollout policy's: the vanilla clipped loss
    # (positive advantage, ratio > 1 + clip_high) gives it zero gradient; PAPO never clips.
    stage = load_config(profile="tiny").papo_rl
    tag_id = 3
    logits = torch.zeros(1, 4, 6)
    logits[0, 1, tag_id] = 4.0
    logits.requires_grad_(True)
    tokens = torch.tensor([[0, tag_id, 1, 2]])
    mask = torch.ones(1, 4)
    adv = torch.full((1, 4), 0.5)
    log_prob = _log_probs(logits, tokens)
    stale_old = log_prob.detach() - 2.0  # the rollout policy gave these tokens much less mass

    cfg = actor_config(stage)
    vanilla_loss, _ = get_policy_loss_fn("vanilla")(stale_old, log_prob, adv, mask, "token-mean", cfg, None)
    (g_vanilla,) = torch.autograd.grad(vanilla_loss, logits)
    assert torch.all(g_vanilla[0, 1] == 0), "precondition: the clip masks the tag token in the vanilla loss"

    papo_loss, _ = compute_policy_loss("papo", stale_old, _log_probs(logits, tokens), adv, mask, cfg)
    (g_papo,) = torch.autograd.grad(papo_loss, logits)
    assert g_papo[0, 1, tag_id].abs().item() > 1e-4
    assert torch.count_nonzero(g_papo[0, 1]) == 6
