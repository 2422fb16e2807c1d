"""Rollout tensors and the one-call policy forward (sequential and parallel 4D masks) on a real tiny Qwen3."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from components.config import load_config
from components.models.tiny import tiny_test_world
from components.structure import PENALTIES, TagIds, parallel_attention_inputs, prediction_sources
from components.training.rl_batch import (
    UNFORKED_STEPS,
    build_policy_batch,
    response_log_probs,
    structural_rejection,
    structural_violation,
)
from components.training.rl_objective import actor_config, compute_advantages, compute_policy_loss
from tests.support.builders import rendered_rollouts as make_rollouts

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world():
    model, tok = tiny_test_world(seed=0)
    return model, tok, TagIds.from_tokenizer(tok, "npr"), load_config(profile="tiny")


def test_batched_parallel_forward_equals_per_sample_forward(world):
    model, tok, tags, cfg = world
    rollouts = make_rollouts(tok, cfg, 5)
    assert len({len(r.prompt_ids) + len(r.response_ids) for r in rollouts}) > 1, "need ragged lengths"
    batch = build_policy_batch(rollouts, tok.pad_token_id, tags)
    assert batch.parallel and batch.attention_mask.shape[1] == 1
    with torch.no_grad():
        batched, _ = response_log_probs(model, batch)
        for b, r in enumerate(rollouts):
            ids = torch.tensor([r.prompt_ids + r.response_ids])
            mask, pos = parallel_attention_inputs(ids[0], tags, start=len(r.prompt_ids))
            logits = model(input_ids=ids, attention_mask=mask[None, None], position_ids=pos[None]).logits[0]
            n, p = len(r.response_ids), len(r.prompt_ids)
            # each token scored from the last earlier position it can see (the canonical prediction rule)
            sources = prediction_sources(mask)[p:]
            alone = torch.log_softmax(logits[sources].float(), -1).gather(-1, ids[0, p:, None]).squeeze(-1)
            torch.testing.assert_close(batched[b, :n], alone, atol=1e-5, rtol=0)
            assert torch.all(batched[b, n:] == 0)


def test_sequential_batch_matches_unpadded_causal_forward(world):
    model, tok, _, cfg = world
    rollouts = make_rollouts(tok, cfg, 3)
    batch = build_policy_batch(rollouts, tok.pad_token_id, None)
    assert batch.attention_mask.dim() == 2
    with torch.no_grad():
        batched, entropy = response_log_probs(model, batch, with_entropy=True)
        r = rollouts[1]
        ids = torch.tensor([r.prompt_ids + r.response_ids])
        logits = model(input_ids=ids).logits[0]
        lp = torch.log_softmax(logits[:-1].float(), -1).gather(-1, ids[0, 1:, None]).squeeze(-1)
    torch.testing.assert_close(
        batched[1, : len(r.response_ids)], lp[len(r.prompt_ids) - 1 :], atol=1e-5, rtol=0
    )
    assert entropy is not None and torch.all(entropy[1, : len(r.response_ids)] > 0)


def test_papo_gradient_reaches_tag_tokens_in_a_real_forward(world):
    model, tok, tags, cfg = world
    rollouts = make_rollouts(tok, cfg, 4)
    for r, reward in zip(rollouts, [1.0, -1.0, -1.0, 1.0], strict=True):
        r.reward = reward
    batch = build_policy_batch(rollouts, tok.pad_token_id, tags)
    adv = compute_advantages(
        "papo",
        torch.tensor([r.reward for r in rollouts]),
        batch.response_mask,
        [r.group_id for r in rollouts],
    )
    log_prob, _ = response_log_probs(model, batch)
    log_prob.retain_grad()
    loss, _ = compute_policy_loss(
        "papo", log_prob.detach(), log_prob, adv, batch.response_mask, actor_config(cfg.papo_rl)
    )
    loss.backward()
    targets = batch.input_ids.gather(1, batch.response_index)
    tag_positions = torch.isin(targets, torch.tensor(list(tags.ids.values()))) & (batch.response_mask > 0)
    assert int(tag_positions.sum()) > 20
    assert torch.all(log_prob.grad[tag_positions] != 0)
    model.zero_grad(set_to_none=True)


def test_structural_rejection_names_the_reason(world):
    _, tok, tags, cfg = world
    good = make_rollouts(tok, cfg, 1)[0]
    assert structural_rejection(good, tags) is None
    bad = make_rollouts(tok, cfg, 1, mistake="unclosed_step")[0]
    reason = structural_rejection(bad, tags)
    # a category from the fixed set metric names carry, never free text with a token offset
    assert reason in {*PENALTIES, "malformed"}, reason


def test_steps_the_engine_did_not_fork_are_rejected_and_would_be_scored_off_policy(world):
    model, tok, tags, cfg = world
    r = make_rollouts(tok, cfg, 1)[0]
    step_open = tags.ids["<step>"]
    # the response index of each block's first <step> (a <step> right after </guideline>), found by hand
    firsts = tuple(
        i
        for i, t in enumerate(r.response_ids)
        if t == step_open and r.response_ids[i - 1] == tags.ids["</guideline>"]
    )
    assert firsts, "the rendering has a block"
    assert structural_rejection(r, tags) is None  # a sequential engine's record: no fork record to check
    assert structural_rejection(replace(r, forked_at=firsts), tags) is None  # every block forked
    for forked in ((), firsts[1:], tuple(i + 1 for i in firsts)):
        err = structural_violation(replace(r, forked_at=forked), tags)
        assert err is not None and err.code == UNFORKED_STEPS
        assert err.position == len(r.prompt_ids) + firsts[0]
    # why: the engine that refused the fork sampled the steps reading each other at sequential positions,
    # the parallel layout scores them blind to their siblings: the second step's tokens differ by far more
    # than the 1e-4 the engine and trainer agree to
    with torch.no_grad():
        parallel, _ = response_log_probs(model, build_policy_batch([r], tok.pad_token_id, tags))
        sequential, _ = response_log_probs(model, build_policy_batch([r], tok.pad_token_id, None))
    second_step = r.response_ids.index(step_open, firsts[0] + 1)
    gap = (parallel[0, second_step:] - sequential[0, second_step:]).abs()
    assert float(gap.max()) > 1e-2


def test_build_rejects_empty_inputs(world):
    _, tok, _, cfg = world
    with pytest.raises(ValueError):
        build_policy_batch([], tok.pad_token_id)
    r = make_rollouts(tok, cfg, 1)[0]
    r.response_ids = []
    with pytest.raises(ValueError):
        build_policy_batch([r], tok.pad_token_id)
