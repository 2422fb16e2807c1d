"""Token choice and the ledger: pinned numbers computed by hand."""

from __future__ import annotations

import math

import pytest
import torch

from components.engine.ledger import TokenLedger
from components.engine.sampling import apply_repetition_penalty, choose_tokens, filter_logits, raw_logprobs


def test_raw_logprobs_is_log_softmax_of_the_untempered_logits() -> None:
    logits = torch.tensor([[0.0, math.log(3.0)]])
    assert raw_logprobs(logits, torch.tensor([1])).item() == pytest.approx(math.log(0.75))


def test_top_k_keeps_the_k_largest() -> None:
    scores = filter_logits(torch.tensor([[1.0, 3.0, 2.0, 0.0]]), temperature=1.0, top_k=2, top_p=1.0)
    assert torch.isinf(scores[0]).tolist() == [True, False, False, True]


def test_top_p_keeps_the_smallest_nucleus_reaching_p() -> None:
    # probabilities 0.5, 0.3, 0.2: p=0.7 keeps 0.5 and 0.3 (0.5 alone is short of 0.7)
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.2]]))
    assert torch.isinf(filter_logits(logits, 1.0, -1, 0.7)[0]).tolist() == [False, False, True]
    assert torch.isinf(filter_logits(logits, 1.0, -1, 0.5)[0]).tolist() == [False, True, True]


def test_temperature_divides_logits() -> None:
    assert filter_logits(torch.tensor([[2.0, -4.0]]), 2.0, -1, 1.0).tolist() == [[1.0, -2.0]]


def test_repetition_penalty_divides_positive_and_multiplies_negative_logits() -> None:
    logits = torch.tensor([[2.0, -2.0, 1.0], [2.0, -2.0, 1.0]])
    out = apply_repetition_penalty(logits, [[0, 1], [0]], [2.0, 1.0])
    assert out.tolist() == [[1.0, -4.0, 1.0], [2.0, -2.0, 1.0]]


def test_greedy_and_banned_tokens() -> None:
    gen = torch.Generator().manual_seed(0)
    logits = torch.tensor([[5.0, 1.0, 0.0]])
    assert choose_tokens(logits, 0.0, -1, 1.0, gen).item() == 0
    banned = torch.tensor([[True, False, False]])
    assert choose_tokens(logits, 0.0, -1, 1.0, gen, banned).item() == 1


def test_seeded_sampling_is_reproducible_and_follows_the_distribution() -> None:
    logits = torch.log(torch.tensor([[0.7, 0.2, 0.1]])).expand(20000, 3)
    a = choose_tokens(logits, 1.0, -1, 1.0, torch.Generator().manual_seed(3))
    b = choose_tokens(logits, 1.0, -1, 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(a, b)
    freq = torch.bincount(a, minlength=3).float() / a.numel()
    assert freq.tolist() == pytest.approx([0.7, 0.2, 0.1], abs=0.02)


def test_ledger_never_charges_past_the_budget() -> None:
    ledger = TokenLedger(max_new_tokens=5)
    assert all(ledger.charge() for _ in range(5))
    assert not ledger.charge()
    assert ledger.used == 5 and ledger.remaining == 0 and ledger.exhausted_reason == "length"


def test_ledger_kv_budget_binds_when_tighter() -> None:
    ledger = TokenLedger(max_new_tokens=100, prompt_tokens=10, kv_budget_tokens=14)
    assert ledger.remaining == 4
    assert not ledger.charge(5) and ledger.used == 0
    assert ledger.charge(4) and ledger.exhausted_reason == "kv_budget"


def test_fork_cost_and_refusal_at_the_edge() -> None:
    # two branches seeded with 3 tokens each: (3 + 1 content + 1 </step>) * 2 + 1 <takeaway> = 11
    ledger = TokenLedger(max_new_tokens=20, used=9)
    assert ledger.fork_cost([3, 3], min_step_tokens=1) == 11
    assert ledger.refuse_fork([3, 3], 1) is None
    ledger.used = 10
    reason = ledger.refuse_fork([3, 3], 1)
    assert reason is not None and "token budget" in reason
