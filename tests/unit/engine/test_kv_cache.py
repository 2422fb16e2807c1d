"""The engine's in-place KV cache gives the numbers of transformers' DynamicCache, through growth and row drops."""

from __future__ import annotations

import torch
from transformers import DynamicCache

from components.engine.kv_cache import GrowingLayer, growing_cache
from components.models.tiny import tiny_test_world


def _decode(model, cache, prompt: torch.Tensor, steps: torch.Tensor, drop_after: int) -> list[torch.Tensor]:
    """Prefill, then feed one token per step; after ``drop_after`` steps keep rows 0 and 2 only."""
    out = [model(input_ids=prompt, past_key_values=cache, use_cache=True).logits]
    rows = torch.arange(prompt.shape[0])
    for t in range(steps.shape[1]):
        if t == drop_after:
            rows = torch.tensor([0, 2])
            cache.batch_select_indices(rows)
        out.append(model(input_ids=steps[rows, t : t + 1], past_key_values=cache, use_cache=True).logits)
    return out


def test_growing_cache_matches_dynamic_cache_through_growth_and_row_selection() -> None:
    model, _ = tiny_test_world(seed=0)
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(5, 300, (3, 7), generator=gen)
    steps = torch.randint(5, 300, (3, 12), generator=gen)
    with torch.no_grad():
        ref = _decode(model, DynamicCache(config=model.config), prompt, steps, drop_after=5)
        cache = growing_cache(model, capacity_hint=9)  # smaller than 7 + 12: the buffers must grow
        ours = _decode(model, cache, prompt, steps, drop_after=5)
    for a, b in zip(ours, ref, strict=True):
        torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
    layer = cache.layers[0]
    assert isinstance(layer, GrowingLayer) and layer.get_seq_length() == 19
    assert layer.keys.shape[0] == 2 and layer._keys.shape[-2] >= 19
