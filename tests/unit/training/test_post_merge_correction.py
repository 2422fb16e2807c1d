"""PAPO's re-prefill correction: which tokens it reweights, the weights, and the local trainer using them."""

from __future__ import annotations

import math
import random
from collections import Counter

import numpy as np
import pytest
import torch

from components.config import load_config
from components.data.synthetic import expression_of, generate_problems, render_parallel
from components.models.tiny import tiny_test_world
from components.prompts import render_prompt
from components.structure import StructureError, TagIds, post_merge_mask
from components.training.job import rl_job
from components.training.papo import post_merge_is_weights
from components.training.rl import RLTrainer
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs
from components.training.rl_objective import compute_policy_loss


@pytest.fixture(scope="module")
def world():
    model, tok = tiny_test_world(seed=0)
    return model, tok, TagIds.from_tokenizer(tok, "npr")


def ids(tok, text: str) -> list[int]:
    return tok.encode(text, add_special_tokens=False)


def test_post_merge_mask_starts_at_the_first_multi_branch_merge(world):
    _, tok, tags = world
    prompt = ids(tok, "2+3?")
    one_step = "<guideline><plan>1: add</plan></guideline><step>1: 2+3=5</step><takeaway>5</takeaway>"
    two_steps = (
        "<guideline><plan>1: a</plan><plan>2: b</plan></guideline><step>1: x</step><step>2: y</step>"
        "<takeaway>z</takeaway> \\boxed{5}"
    )
    # no block, and a one-step block (it merges exactly): nothing to correct
    assert not post_merge_mask(prompt + ids(tok, "plain \\boxed{5}"), tags, len(prompt)).any()
    assert not post_merge_mask(prompt + ids(tok, one_step), tags, len(prompt)).any()
    response = ids(tok, one_step + " " + two_steps)
    mask = post_merge_mask(prompt + response, tags, len(prompt))
    takeaways = [i for i, t in enumerate(response) if t == tags.ids["<takeaway>"]]
    first = int(np.argmax(mask))
    assert first == takeaways[1] and mask[first:].all() and not mask[:first].any()
    with pytest.raises(StructureError):
        post_merge_mask(
            prompt + ids(tok, "<guideline><plan>1: a</plan></guideline><step>1: x"), tags, len(prompt)
        )


def test_weights_are_truncated_ratios_on_post_merge_tokens_only():
    lp = torch.tensor([[-1.0, -1.0, -1.0, -1.0, -1.0, 0.0]])
    rollout = torch.tensor([[-1.0, -1.5, -0.5, -4.0, math.nan, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 0]])
    post = torch.tensor([[False, False, True, True, True, True]])
    weights, metrics = post_merge_is_weights(lp, rollout, mask, post, threshold=2.0)
    # pre-merge: 1 whatever the mismatch; post-merge: exp(-0.5), exp(3) -> C; NaN (an unscored forced
    # token) -> 1; padding -> 1
    expected = torch.tensor([[1.0, 1.0, math.exp(-0.5), 2.0, 1.0, 1.0]])
    torch.testing.assert_close(weights, expected)
    assert metrics["rollout_corr/pre_merge_abs_logp_diff_max"] == pytest.approx(0.5)
    assert metrics["rollout_corr/post_merge_abs_logp_diff_mean"] == pytest.approx(1.75)
    assert metrics["rollout_corr/post_merge_is_truncated_frac"] == pytest.approx(0.5)
    assert metrics["rollout_corr/nonfinite_rollout_logp"] == 1.0
    assert metrics["rollout_corr/post_merge_token_frac"] == pytest.approx(3 / 5)
    with pytest.raises(ValueError, match=">= 1"):
        post_merge_is_weights(lp, rollout, mask, post, threshold=0.5)


def _rollouts(tok, cfg, merge_mode: str) -> list[Rollout]:
    rng = random.Random(4)
    out = []
    for i, p in enumerate(generate_problems(4, seed=8)):
        text = render_parallel(expression_of(p), rng) + " " + render_parallel(expression_of(p), rng)
        prompt = ids(tok, render_prompt(tok, p["problem"], cfg.prompts, "parallel"))
        response = ids(tok, text) + [tok.eos_token_id]
        out.append(
            Rollout(
                f"g{i // 2}",
                p["id"],
                p["answer"],
                prompt,
                response,
                text,
                "stop",
                True,
                reward=float(i % 2),
                # the rollout engine's log-probs: 0.7 nats lower than the trainer's everywhere
                extra={"rollout_logprobs": None, "merge_mode": merge_mode},
            )
        )
    return out


@pytest.mark.parametrize("merge_mode", ["reprefill", "shared_kv"])
def test_local_papo_update_reweights_reprefilled_post_merge_tokens(world, tmp_path, merge_mode):
    model, tok, tags = world
    # fp32 compute (run.autocast null): the gradient is compared with an fp32 one computed by hand
    cfg = load_config(
        profile="tiny", overrides=["papo_rl.rollout_correction.is_threshold=1.5", "run.autocast=null"]
    )
    rollouts = _rollouts(tok, cfg, merge_mode)
    batch = build_policy_batch(rollouts, tok.pad_token_id, tags)
    with torch.no_grad():
        exact, _ = response_log_probs(model, batch)
    for b, r in enumerate(rollouts):
        r.extra["rollout_logprobs"] = (exact[b, : len(r.response_ids)] - 0.7).tolist()
    copy = type(model)(model.config)  # the trainer steps its optimizer: keep the original weights here
    copy.load_state_dict(model.state_dict())
    problems = generate_problems(2, seed=1)
    trainer = RLTrainer(rl_job("papo_rl", cfg), copy, tok, problems, problems, tmp_path)
    counters: Counter = Counter()
    trainer._update([rollouts[:2], rollouts[2:]], counters)
    got = {n: p.grad.clone() for n, p in copy.named_parameters() if p.grad is not None}

    # by hand: the same loss with weights exp(0.7) truncated at 1.5 on post-merge tokens (reprefill only)
    model.zero_grad(set_to_none=True)
    log_prob, _ = response_log_probs(model, batch)
    weights = torch.ones_like(log_prob)
    if merge_mode == "reprefill":
        for b, r in enumerate(rollouts):
            m = torch.from_numpy(post_merge_mask(r.prompt_ids + r.response_ids, tags, len(r.prompt_ids)))
            weights[b, : m.numel()] = torch.where(m, torch.tensor(1.5), torch.tensor(1.0))
        assert counters["rollout_corr/micro_batches"] == 1
        assert counters["rollout_corr/post_merge_is_truncated_frac"] == pytest.approx(1.0)
    else:
        assert counters["rollout_corr/micro_batches"] == 0
    from components.training.rl_objective import compute_advantages

    adv = compute_advantages(
        "papo",
        torch.tensor([r.reward for r in rollouts]),
        batch.response_mask,
        [r.group_id for r in rollouts],
    )
    trainer.actor_cfg.global_batch_info.update(
        dp_size=1, batch_num_tokens=int(batch.response_mask.sum()), global_batch_size=len(rollouts)
    )
    loss, _ = compute_policy_loss(
        "papo", log_prob.detach(), log_prob, adv, batch.response_mask, trainer.actor_cfg, weights
    )
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.papo_rl.grad_clip)  # as the trainer's step does
    for name, grad in got.items():
        scale = float(grad.abs().max()) + 1e-12
        torch.testing.assert_close(grad, model.get_parameter(name).grad, rtol=0, atol=1e-5 * scale, msg=name)
