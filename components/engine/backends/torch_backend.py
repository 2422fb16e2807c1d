"""The in-process backend: the torch decoder over a Hugging Face causal LM, in batches of prompts."""

from __future__ import annotations

from typing import Any

import torch

from components.engine.attention import decode_attention
from components.engine.config import GenerationConfig
from components.engine.decoder import Decoder
from components.engine.generation import Generation


def generate_torch(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    cfg: GenerationConfig,
    tags: Any | None,
    response_prefixes: list[str] | None = None,
) -> list[Generation]:
    """Tokenise the rendered prompts and decode them ``cfg.batch_size`` at a time.

    One ``torch.Generator`` on the model's device, seeded with ``cfg.seed``, drives all batches, so a call
    is reproducible; each prompt's controller gets the sequence seed ``cfg.seed``-derived from its index.
    """
    device = next(model.parameters()).device
    generator = torch.Generator(device=device).manual_seed(cfg.seed)
    decoder = Decoder(model, tokenizer, cfg, tags, generator, merge_mode=cfg.merge_mode)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731 - prompts are rendered
    out: list[Generation] = []
    with decode_attention(model):
        for lo in range(0, len(prompts), cfg.batch_size):
            ids = [encode(p) for p in prompts[lo : lo + cfg.batch_size]]
            prefixes = None
            if response_prefixes is not None:
                prefixes = [encode(p) for p in response_prefixes[lo : lo + cfg.batch_size]]
            seeds = [cfg.seed * 1_000_003 + lo + i for i in range(len(ids))]
            out.extend(decoder.run(ids, prefixes, seeds))
    return out
