"""``generate``: the one entry point every stage, trainer and evaluator calls."""

from __future__ import annotations

from typing import Any

from components.engine.config import GenerationConfig
from components.engine.generation import Generation


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
        model: a Hugging Face causal LM (torch backend); ignored by the server backends (sglang, vllm),
            which talk to the server at ``cfg.server_url`` (started by the stage for its checkpoint,
            ``components.engine.serving``).
        prompts: fully rendered prompt texts (chat template applied, ending with the assistant header).
        cfg: sampling, mode, budgets, backend and merge mode.
        tags: ``components.structure.TagIds`` of the tokenizer; required when ``cfg.mode == "parallel"``.
        response_prefixes: optional text each response is forced to start with (recorded as forced tokens).

    Returns:
        one Generation per prompt, in order; decisions (forks, refusals, budgets, positions) come from
        ``components.engine.controller`` for every backend.
    """
    if response_prefixes is not None and len(response_prefixes) != len(prompts):
        raise ValueError(f"{len(response_prefixes)} response prefixes for {len(prompts)} prompts")
    if cfg.mode == "parallel" and tags is None:
        raise ValueError("mode='parallel' needs the tag ids (tags=TagIds.from_tokenizer(...))")
    if cfg.backend == "sglang":
        from components.engine.backends.sglang_client import generate_sglang  # lazy: httpx

        return generate_sglang(tokenizer, prompts, cfg, tags, response_prefixes)
    if cfg.backend == "vllm":
        from components.engine.backends.vllm_client import generate_vllm  # lazy: httpx

        return generate_vllm(tokenizer, prompts, cfg, tags, response_prefixes)
    from components.engine.backends.torch_backend import generate_torch  # lazy: transformers

    return generate_torch(model, tokenizer, prompts, cfg, tags, response_prefixes)
