"""Decode-time attention for the torch engine on CPU: sdpa with grouped-query heads, no K/V copies.

transformers' ``sdpa`` attention expands the key/value heads to the query heads (``repeat_kv``) whenever an
attention mask is given, except on CUDA/XPU without a mask. The engine always passes a mask (the owner mask
of ``kv_layout``), so every decode step copied the whole cache of every layer once more, twice the size of
the cache itself: at batch 256, 160 cached tokens, that copy and the wider attention were 45% of a tiny-model
decode step on 2 CPU cores. ``torch.nn.functional.scaled_dot_product_attention(..., enable_gqa=True)`` reads
the grouped heads in place (same numbers to float rounding; tests/unit/engine/test_attention.py).

Only for decoding: in training the GQA path's backward is slower on CPU than the copy, and on CUDA a mask
plus ``enable_gqa`` falls back to the math kernel, so the engine switches to it for a ``generate`` call on
a CPU sdpa model and restores the model's own implementation afterwards (``decode_attention``).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from transformers import AttentionInterface

DECODE_SDPA = "npr_decode_sdpa"


def grouped_sdpa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, None]:
    """AttentionInterface function: ``query (B, H, Q, D)``, ``key/value (B, H_kv, S, D)``, ``mask (B, 1, Q, S)``.

    Returns ``(B, Q, H, D)`` (the layout the attention modules expect) and no weights.
    """
    out = torch.nn.functional.scaled_dot_product_attention(
        query,
        key,
        value,
        attn_mask=attention_mask,
        dropout_p=dropout,
        scale=scaling,
        enable_gqa=key.shape[1] != query.shape[1],
    )
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(DECODE_SDPA, grouped_sdpa_attention)


@contextmanager
def decode_attention(model: Any) -> Iterator[None]:
    """Use ``grouped_sdpa_attention`` inside the block when the model is a CPU model on ``sdpa``.

    Any other implementation (eager, flash, a GPU model) is left alone.
    """
    config = getattr(model, "config", None)
    original = getattr(config, "_attn_implementation", None)
    on_cpu = next(model.parameters()).device.type == "cpu"
    if original != "sdpa" or not on_cpu or not hasattr(model, "set_attn_implementation"):
        yield
        return
    model.set_attn_implementation(DECODE_SDPA)
    try:
        yield
    finally:
        model.set_attn_implementation(original)
