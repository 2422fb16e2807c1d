"""``generate``: the one entry point every stage, trainer and evaluator calls."""

from __future__ import annotations

from typing import Any

from components.engine.config import GenerationConfig
from components.engine.generation import Generation
from components.engine.parallel import EngineTags


def generate(
    model: Any,
    tokenizer: Any,
    prompts: list[str],
    cfg: GenerationConfig,
    tags: Any | None = None,
    response_prefixes: list[str] | None = None,
) -> list[Generation]:
    """Sample one response per prompt.

    Args:
        model: a Hugging Face causal LM (torch backend); ignored by the sglang backend, which talks to the
            server named in ``cfg.server_url``.
        prompts: fully rendered prompt texts (chat template applied, ending with the assistant header).
        cfg: sampling, mode and budgets.
        tags: ``components.structure.TagIds`` of the tokenizer; required when ``cfg.mode == "parallel"``.
        response_prefixes: optional text each response is forced to start with (recorded as forced tokens).

    Returns:
        one Generation per prompt, in order.
    """
    if response_prefixes is not None and len(response_prefixes) != len(prompts):
        raise ValueError(f"{len(response_prefixes)} response prefixes for {len(prompts)} prompts")
    engine_tags = EngineTags.from_tag_ids(tags) if tags is not None else None
    if cfg.backend == "sglang":
        from components.engine.backends.sglang_client import generate_sglang

        return generate_sglang(tokenizer, prompts, cfg, response_prefixes)
    from components.engine.backends.torch_backend import generate_torch

    return generate_torch(model, tokenizer, prompts, cfg, engine_tags, response_prefixes)
