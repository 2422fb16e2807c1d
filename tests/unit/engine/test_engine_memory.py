"""Engine memory: the KV cache grows with what is generated, and logits never leave the device.

Both would have failed before: the decoder sized every layer's cache for prompt + ``max_new_tokens`` up
front (Qwen3-4B at 30k new tokens: ~4.5 GiB a sequence), computed (B, P, V) logits for the prompt, and
copied every step's full-vocabulary logits to the host.
"""

from __future__ import annotations

import torch

import components.engine.decoder as decoder
from components.engine import GenerationConfig, generate
from components.models.tiny import tiny_test_world
from components.structure import TagIds

PLANS = "<guideline><plan>1: a</plan><plan>2: b</plan></guideline>"


def _prompts(tok, n: int) -> list[str]:
    chat = [{"role": "user", "content": "what is 2+3"}]
    return [tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)] * n


def test_kv_cache_grows_with_the_generation_not_with_max_new_tokens(monkeypatch) -> None:
    model, tok = tiny_test_world(seed=0)
    caches = []
    real = decoder.growing_cache

    def spy(model, capacity_hint):
        caches.append(real(model, capacity_hint))
        return caches[-1]

    monkeypatch.setattr(decoder, "growing_cache", spy)
    prompt_len = len(tok.encode(_prompts(tok, 1)[0], add_special_tokens=False))
    # a huge max_new_tokens; the generation itself is short (the KV budget ends it after 40 tokens)
    cfg = GenerationConfig(max_new_tokens=30000, kv_budget_tokens=prompt_len + 40, batch_size=4, seed=0)
    gens = generate(model, tok, _prompts(tok, 4), cfg)
    assert all(g.total_tokens <= 40 for g in gens)
    capacity = max(layer._keys.shape[-2] for c in caches for layer in c.layers)
    assert capacity <= 2 * (prompt_len + 64) < 30000


def test_only_chosen_tokens_and_their_logprobs_leave_the_device(monkeypatch) -> None:
    model, tok = tiny_test_world(seed=0)
    vocab = model.config.vocab_size
    moved: list[int] = []
    for name in ("cpu", "tolist", "numpy"):
        original = getattr(torch.Tensor, name)

        def spy(self, *a, _original=original, **k):
            moved.append(self.numel())
            return _original(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, spy)
    shapes: list[tuple[int, ...]] = []
    forward = model.forward

    def recording_forward(*a, **k):
        out = forward(*a, **k)
        shapes.append(tuple(out.logits.shape))
        return out

    monkeypatch.setattr(model, "forward", recording_forward)
    tags = TagIds.from_tokenizer(tok, "npr")
    cfg = GenerationConfig(mode="parallel", max_new_tokens=40, max_step_tokens=6, batch_size=3, seed=0)
    gens = generate(model, tok, _prompts(tok, 3), cfg, tags, response_prefixes=[PLANS] * 3)
    assert all(g.parallel_taken for g in gens)
    assert moved and max(moved) <= 2 * 3 * 2  # (2, streams) per step: ids and logprobs, never a vocab row
    assert max(moved) < vocab
    # the prefill keeps the last position's logits only; a step's logits are (B, streams fed, V)
    assert shapes[0][1] == 1 and max(s[1] for s in shapes) <= 2
