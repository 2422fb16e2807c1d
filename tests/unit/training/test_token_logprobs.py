"""The chunked scorer gives the full log-softmax's numbers (values, gradients, entropy) without ever holding a
``(B, R, V)`` logits tensor, for the RL forward (sequential and parallel layouts) and the SFT loss."""

from __future__ import annotations

import random

import pytest
import torch

from components.config import load_config
from components.data.synthetic import expression_of, generate_problems, render_parallel
from components.models.tiny import tiny_test_world
from components.prompts import render_prompt
from components.structure import TagIds, prediction_sources
from components.training.memory_probe import measure
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs
from components.training.sft import token_nll
from components.training.sft_data import collate, prepare_examples

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def world():
    model, tok = tiny_test_world(seed=0)
    return model, tok, TagIds.from_tokenizer(tok, "npr"), load_config(profile="tiny")


def _rollouts(tok, cfg, n: int = 5) -> list[Rollout]:
    rng = random.Random(7)
    out = []
    for i, p in enumerate(generate_problems(n, seed=7)):
        text = render_parallel(expression_of(p), rng)
        out.append(
            Rollout(
                group_id=f"g{i}",
                problem_id=p["id"],
                answer=p["answer"],
                prompt_ids=tok.encode(
                    render_prompt(tok, p["problem"], cfg.prompts, "parallel"), add_special_tokens=False
                ),
                response_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id],
                text=text,
                finish_reason="stop",
                parallel_taken=True,
            )
        )
    return out


def reference_log_probs(model, batch, temperature=1.0):
    """The scorer this module replaced: full logits, gathered (bs, R, V) fp32, log_softmax."""
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits
    if temperature != 1.0:
        logits = logits / temperature
    if batch.parallel:
        pred = prediction_sources(batch.attention_mask).gather(1, batch.response_index)
    else:
        pred = (batch.response_index - 1).clamp(min=0)
    step = logits.gather(1, pred.unsqueeze(-1).expand(-1, -1, logits.shape[-1])).float()
    all_lp = torch.log_softmax(step, dim=-1)
    targets = batch.input_ids.gather(1, batch.response_index)
    lp = all_lp.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * batch.response_mask
    entropy = -(all_lp.exp() * all_lp).sum(-1) * batch.response_mask
    return lp, entropy.detach()


@pytest.mark.parametrize("parallel", [True, False])
@pytest.mark.parametrize("chunk", [1, 7, 100_000])
def test_chunked_scores_equal_the_full_log_softmax(world, parallel, chunk):
    model, tok, tags, cfg = world
    batch = build_policy_batch(_rollouts(tok, cfg), tok.pad_token_id, tags if parallel else None)
    model.zero_grad(set_to_none=True)
    ref, ref_entropy = reference_log_probs(model, batch, temperature=0.7)
    ref.sum().backward()
    ref_grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    got, entropy = response_log_probs(model, batch, temperature=0.7, with_entropy=True, chunk_tokens=chunk)
    got.sum().backward()
    # chunking changes the fp32 summation order only: a few ulps of |log p| (up to ~6 here)
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=2e-6)
    torch.testing.assert_close(entropy, ref_entropy, rtol=1e-6, atol=2e-6)
    assert float((got != 0).sum()) == float(batch.response_mask.sum())
    for name, p in model.named_parameters():
        scale = float(ref_grads[name].abs().max()) + 1e-12
        torch.testing.assert_close(p.grad, ref_grads[name], rtol=0, atol=1e-5 * scale, msg=name)


def test_no_tensor_of_the_batch_vocabulary_size_is_ever_allocated(world):
    """The largest allocation of a scored forward + backward is a chunk's logits, not (bs, R, V)."""
    model, tok, tags, cfg = world
    batch = build_policy_batch(_rollouts(tok, cfg, 6), tok.pad_token_id, tags)
    vocab = model.config.vocab_size
    chunk = 16
    assert int(batch.response_mask.sum()) > 4 * chunk
    with measure("cpu", record_shapes=True) as full:
        ref, _ = reference_log_probs(model, batch)
        ref.sum().backward()
    model.zero_grad(set_to_none=True)
    with measure("cpu", record_shapes=True) as chunked:
        got, _ = response_log_probs(model, batch, chunk_tokens=chunk)
        got.sum().backward()
    model.zero_grad(set_to_none=True)

    head = vocab * model.config.hidden_size

    def vocab_rows(reading) -> int:
        """Most rows of vocabulary-wide logits one new tensor held (the head's own gradient excluded)."""
        sizes = [n // (vocab * 4) for shape, n in reading.extra["shapes"] if shape and shape[-1] == vocab]
        sizes += [
            n // (vocab * 4) for shape, n in reading.extra["shapes"] if len(shape) > 1 and shape[-2] == vocab
        ]
        return max((r for r in sizes if r * vocab != head), default=0)

    # the old path built (bs, R, V) fp32 (so the probe does see such tensors); the chunked one at most a chunk
    assert vocab_rows(full) >= batch.response_mask.numel()
    assert 0 < vocab_rows(chunked) <= chunk
    assert chunked.peak_bytes < full.peak_bytes


def test_sft_loss_equals_the_full_logits_loss(world):
    model, tok, tags, cfg = world
    rng = random.Random(1)
    records = []
    for p in generate_problems(6, seed=3):
        records.append({"problem": p["problem"], "response": render_parallel(expression_of(p), rng)})
    data = prepare_examples(
        records, tok, cfg.prompts, mode="parallel", prompt_style="parallel", schema_name="npr", max_length=512
    )
    assert data.examples
    batch = collate(data.examples, "parallel", tok.pad_token_id, tags)
    logits = model(
        input_ids=batch.input_ids,
        attention_mask=batch.attention_mask,
        position_ids=batch.position_ids,
        use_cache=False,
    ).logits.float()
    rows = torch.arange(logits.shape[0])[:, None]
    ref = (
        (torch.logsumexp(logits, -1).gather(1, batch.parents) - logits[rows, batch.parents, batch.input_ids])
        * batch.loss_mask
    ).sum()
    got, n = token_nll(model, batch)
    assert n == int(batch.loss_mask.sum())
    torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-4)
