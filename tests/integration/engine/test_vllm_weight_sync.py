"""A stock vLLM server takes the trainer's weights after an update exactly, and each step of the sync matters.

One trained tiny checkpoint with tied embeddings (the test world's builders and the parity gate's servable
shapes, tests/integration/engine/test_vllm_server.py), served by ``ServedPolicy`` (what verl's
``vllm_server`` rollout runs): an untied copy, and per update a reload in place plus a prefix-cache reset.
The prompts are longer than a cache block (vLLM's CPU blocks hold 128 tokens), so every request after the
first reads KV from the prefix cache. An "update" is a few optimizer steps of the trainer's model; after it,
the server's sampled-token log-probs must equal the trainer's (teacher forcing of the updated model, float32):
mean <= 1e-4, max <= 1e-3, the parity gate's bounds, on requests that hit the cache. Dropping a step breaks it:

- without the prefix-cache reset the cached blocks hold KV of the old weights: the same requests are off;
- without the output layer in the weights (what a tied model's state gives an untied server) the served policy
  keeps its old output layer: off. (Serving the tied checkpoint itself fails the same way: vLLM's tied
  ``lm_head`` takes no weights from a reload; so the full-sync check above fails if the copy is not untied.)
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from components.config import load_config
from components.engine.backends.vllm_client import API_KEY_ENV, VLLMClient
from components.engine.served_policy import (
    EMBEDDINGS,
    OUTPUT_LAYER,
    WEIGHTS_FILE,
    ServedPolicy,
    reload_weights,
    reset_prefix_cache,
    served_state,
)
from components.models.loading import save_model
from components.models.tiny import build_tiny_model, tiny_test_world
from tests.integration.engine.test_vllm_server import (
    KEY,
    MAX_BOUND,
    MEAN_BOUND,
    REPO,
    SERVABLE_ARCH,
    served_cfg,
)
from tests.integration.training.conftest import warm_up

pytestmark = pytest.mark.slow

PROMPT_TOKENS = 300  # over two of vLLM's 128-token CPU cache blocks
NEW_TOKENS = 24
N_PROMPTS = 4


def _prompts(tok: Any) -> list[list[int]]:
    """Long token-id prompts (random ids of the vocabulary: the parity holds for any context)."""
    generator = torch.Generator().manual_seed(0)
    vocab = len(tok)
    return [torch.randint(8, vocab, (PROMPT_TOKENS,), generator=generator).tolist() for _ in range(N_PROMPTS)]


def _teacher_forced(model: Any, prompt: list[int], ids: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0].double()
    lps = torch.log_softmax(logits, -1)
    return [lps[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)]


async def _served_vs_trainer(client: VLLMClient, model: Any, prompts: list[list[int]]) -> dict[str, float]:
    """One sampled continuation per prompt (seeded), its served log-probs against the trainer's; with how many
    prompt tokens the prefix cache served and the decode's tokens/s."""
    cached = client.cached_tokens
    params = {"max_new_tokens": NEW_TOKENS, "temperature": 1.0, "top_p": 1.0, "top_k": -1}
    start = time.monotonic()
    answers = await asyncio.gather(
        *(client(p, {**params, "sampling_seed": i}) for i, p in enumerate(prompts))
    )
    wall = time.monotonic() - start
    diffs = []
    for prompt, (ids, lps, _, _) in zip(prompts, answers, strict=True):
        ref = _teacher_forced(model, prompt, ids)
        diffs += [abs(a - b) for a, b in zip(lps, ref, strict=True)]
    tokens = sum(len(a[0]) for a in answers)
    return {
        "mean": sum(diffs) / len(diffs),
        "max": max(diffs),
        "cached_tokens": client.cached_tokens - cached,
        "tokens_per_s": tokens / wall,
    }


def _passes(parity: dict[str, float]) -> bool:
    return parity["mean"] <= MEAN_BOUND and parity["max"] <= MAX_BOUND


def _train(model: Any, tok: Any, steps: int, seed: int) -> dict[str, torch.Tensor]:
    """An update of the trainer's model; returns its state (HF names; the tied output layer as the trainer
    holds it)."""
    warm_up(model, tok, load_config(profile="tiny"), steps=steps, batch=8, lr=5e-3, seed=seed, parallel_share=0.0)
    model.eval()
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_the_server_takes_each_update_exactly_and_each_sync_step_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    torch.set_num_threads(1)
    monkeypatch.chdir(REPO)  # the server spec and its lock are named relative to the checkout
    monkeypatch.setenv(API_KEY_ENV, KEY)
    _, tok = tiny_test_world(seed=0)
    model = build_tiny_model(SERVABLE_ARCH, tok, seed=0)
    _train(model, tok, steps=20, seed=0)
    assert model.config.tie_word_embeddings
    checkpoint = save_model(model, tok, tmp_path / "model")
    prompts = _prompts(tok)
    policy = ServedPolicy(checkpoint, tmp_path / "served", served_cfg())
    policy.start()
    try:
        asyncio.run(_exercise(policy, model, tok, prompts))
    finally:
        policy.stop()


async def _exercise(policy: ServedPolicy, model: Any, tok: Any, prompts: list[list[int]]) -> None:
    async with VLLMClient(policy.url) as client:
        first = await _served_vs_trainer(client, model, prompts)
        print(f"server ready in {policy.start_s:.1f} s; before any update: {first}")
        assert _passes(first), first

        # a full sync: the requests read blocks cached after the reload, and match the updated trainer
        state = _train(model, tok, steps=3, seed=1)
        load_s = await policy.load(client, state)
        synced = await _served_vs_trainer(client, model, prompts)  # fills the cache with the new weights' KV
        reread = await _served_vs_trainer(client, model, prompts)  # reads it
        print(f"after update 1 (reload + reset, {load_s:.2f} s): {synced}; again from the cache: {reread}")
        assert reread["cached_tokens"] >= N_PROMPTS * 128, "the prompts did not hit the prefix cache"
        assert _passes(synced) and _passes(reread), (synced, reread)

        # the cache reset dropped: the same requests reuse blocks computed with the previous weights
        state = _train(model, tok, steps=3, seed=2)
        folder = policy.work_dir / "no-reset"
        folder.mkdir()
        save_file(served_state(state, tied=True), str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        await reload_weights(client, folder)
        stale = await _served_vs_trainer(client, model, prompts)
        print(f"after update 2 without the cache reset: {stale}")
        assert stale["cached_tokens"] >= N_PROMPTS * 128 and not _passes(stale), stale
        await reset_prefix_cache(client)
        fresh = await _served_vs_trainer(client, model, prompts)
        print(f"the same weights after the reset: {fresh}")
        assert _passes(fresh), fresh

        # the output layer dropped: the server keeps the output layer it had
        state = _train(model, tok, steps=3, seed=3)
        folder = policy.work_dir / "no-output-layer"
        folder.mkdir()
        weights = served_state(state, tied=True)
        del weights[OUTPUT_LAYER]
        assert EMBEDDINGS in weights
        save_file(weights, str(folder / WEIGHTS_FILE), metadata={"format": "pt"})
        await reload_weights(client, folder)
        await reset_prefix_cache(client)
        headless = await _served_vs_trainer(client, model, prompts)
        print(f"after update 3 without the output layer: {headless}")
        assert not _passes(headless), headless
