"""The engine's decode attention: the same numbers as transformers' sdpa, and only while decoding."""

from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from components.engine import GenerationConfig, generate
from components.engine.attention import DECODE_SDPA, decode_attention, grouped_sdpa_attention
from components.models.tiny import tiny_test_world


class _Heads(torch.nn.Module):
    num_key_value_groups = 2
    is_causal = True


@pytest.mark.parametrize("q_len", [1, 3, 7])
def test_grouped_attention_equals_transformers_sdpa_with_a_mask(q_len: int) -> None:
    gen = torch.Generator().manual_seed(0)
    b, h, h_kv, s, d = 3, 4, 2, 9, 8
    query = torch.randn(b, h, q_len, d, generator=gen)
    key = torch.randn(b, h_kv, s, d, generator=gen)
    value = torch.randn(b, h_kv, s, d, generator=gen)
    allowed = torch.rand(b, 1, q_len, s, generator=gen) > 0.4
    allowed[..., -1] = True  # every query sees at least its own slot
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    ours, _ = grouped_sdpa_attention(_Heads(), query, key, value, mask, scaling=d**-0.5)
    ref, _ = sdpa_attention_forward(_Heads(), query, key, value, mask, scaling=d**-0.5)
    assert ours.shape == ref.shape == (b, q_len, h, d)
    torch.testing.assert_close(ours, ref, atol=1e-6, rtol=1e-5)


def test_decode_attention_switches_only_inside_and_restores() -> None:
    model, _ = tiny_test_world(seed=0)
    assert model.config._attn_implementation == "sdpa"
    with decode_attention(model):
        assert model.config._attn_implementation == DECODE_SDPA
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError), decode_attention(model):
        raise RuntimeError("a failing decode still restores the model")
    assert model.config._attn_implementation == "sdpa"
    model.set_attn_implementation("eager")
    with decode_attention(model):
        assert model.config._attn_implementation == "eager"  # eager and GPU kernels are left alone


def test_generation_is_the_same_with_the_copying_attention() -> None:
    """The engine's tokens and logprobs do not depend on which of the two attentions ran."""
    model, tok = tiny_test_world(seed=0)
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": "add 2 and 3" * (k + 1)}], tokenize=False, add_generation_prompt=True
        )
        for k in range(5)
    ]
    cfg = GenerationConfig(max_new_tokens=16, temperature=1.0, batch_size=5, seed=3)
    fast = generate(model, tok, prompts, cfg)
    model.set_attn_implementation("eager")
    slow = generate(model, tok, prompts, cfg)
    for a, b in zip(fast, slow, strict=True):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs, strict=True)) < 1e-4
