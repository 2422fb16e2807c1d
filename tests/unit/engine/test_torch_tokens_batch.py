"""The torch token server's batched path answers as its one-request path does (the torch rollout serves verl
through it): same tokens, stop reasons and log-probs per request, whatever else is in the batch."""

from __future__ import annotations

import random

import pytest
import torch

from components.engine.backends.torch_tokens import TorchTokenGenerator
from components.models.tiny import tiny_test_world


@pytest.fixture(scope="module")
def generator() -> TorchTokenGenerator:
    model, tok = tiny_test_world(seed=0)
    # float64: batched and single matmuls then agree far below any sampling threshold
    return TorchTokenGenerator(model.double().eval(), [tok.eos_token_id], deterministic=True)


def _requests(n: int, seed: int) -> list[tuple[list[int], dict]]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        prompt = [rng.randint(20, 200) for _ in range(rng.randint(3, 24))]
        params = {
            "max_new_tokens": rng.randint(1, 40),
            "temperature": rng.choice([0.0, 0.7, 1.0]),
            "top_p": rng.choice([1.0, 0.9]),
            "top_k": rng.choice([-1, 20]),
            "sampling_seed": i,
            "stop_token_ids": rng.sample(range(20, 200), 40),  # often hit: both ways of finishing
            "repetition_penalty": rng.choice([1.0, 1.3]),
        }
        out.append((prompt, params))
    return out


def test_a_batch_answers_each_request_as_it_alone_would(generator: TorchTokenGenerator) -> None:
    requests = _requests(16, seed=0)
    alone = [generator.generate(p, dict(sp)) for p, sp in requests]
    batched = generator.generate_many([(p, dict(sp)) for p, sp in requests])
    for a, b in zip(alone, batched, strict=True):
        assert (a.token_ids, a.stop_reason, a.matched) == (b.token_ids, b.stop_reason, b.matched)
        assert torch.allclose(torch.tensor(a.log_probs), torch.tensor(b.log_probs), atol=1e-9)
    assert {a.stop_reason for a in alone} == {"stop", "length"}  # both ways of finishing were exercised


def test_seed_requests_seeds_only_requests_that_carry_a_seed() -> None:
    """The torch rollout honours a request's sampling_seed outside deterministic mode; a request without one
    draws from the server-wide generator."""
    model, tok = tiny_test_world(seed=1)
    gen = TorchTokenGenerator(model.eval(), [tok.eos_token_id], seed_requests=True)
    prompt, params = [30, 40, 50], {"max_new_tokens": 24, "temperature": 1.0, "sampling_seed": 7}
    first = gen.generate_many([(prompt, dict(params))] * 3)
    again = gen.generate_many([(prompt, dict(params))])
    assert first[0].token_ids == first[1].token_ids == again[0].token_ids  # same seed, same draw
    unseeded = gen.generate_many([(prompt, {"max_new_tokens": 24, "temperature": 1.0})] * 4)
    assert len({tuple(a.token_ids) for a in unseeded}) > 1  # the server's generator moves on
