"""The async driver against scripted token backends: verl's TokenOutput, aborts, and the in-flight limit."""

from __future__ import annotations

import asyncio
import math

import pytest
from verl.workers.rollout.replica import TokenOutput

from components.engine import GenerationConfig
from components.engine.async_driver import BackendError, generate_async, sampling_params
from components.engine.controller import end_of_turn_ids
from components.models.tiny import tiny_test_world
from components.structure import TagIds

PLANS = "<guideline><plan>1: a</plan><plan>2: b</plan></guideline>"


@pytest.fixture(scope="module")
def tok():
    return tiny_test_world(seed=0)[1]


def test_verl_token_outputs_drive_a_parallel_response(tok) -> None:
    """verl's ``server_manager.generate`` returns a TokenOutput without logprobs for the prompt: the forced
    tokens get NaN, the sampled ones the server's values; the branches run concurrently."""
    eot = end_of_turn_ids(tok)[0]
    close = tok.convert_tokens_to_ids("</step>")
    in_flight = peak = 0
    seen: list[dict] = []

    async def server_manager_generate(prompt_ids, sampling_params):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        seen.append(dict(sampling_params))
        await asyncio.sleep(0.01)
        in_flight -= 1
        if close in sampling_params["stop_token_ids"]:  # a branch: two tokens and </step>
            return TokenOutput(
                token_ids=[40, 41, close], log_probs=[-1.0, -2.0, -0.5], stop_reason="completed"
            )
        return TokenOutput(token_ids=[50, eot], log_probs=[-0.25, -0.75], stop_reason="completed")

    cfg = GenerationConfig(mode="parallel", max_new_tokens=60, batch_size=8, seed=3)
    tags = TagIds.from_tokenizer(tok, "npr")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2+3?"}], tokenize=False, add_generation_prompt=True
    )
    (gen,) = asyncio.run(generate_async(tok, [prompt], cfg, tags, server_manager_generate, [PLANS]))
    assert gen.blocks[0].merged and gen.merge_mode == "reprefill" and gen.finish_reason == "stop"
    assert peak == 2  # both branches in flight at once
    sampled = [lp for lp, f in zip(gen.logprobs, gen.forced, strict=True) if not f]
    assert sampled == [-1.0, -2.0, -0.5, -1.0, -2.0, -0.5, -0.25]
    assert all(math.isnan(lp) for lp, f in zip(gen.logprobs, gen.forced, strict=True) if f)
    assert gen.stop_token_id == eot and gen.stop_logprob == -0.75
    assert len({s["sampling_seed"] for s in seen}) == len(seen)


def test_aborts_and_malformed_answers_are_backend_errors(tok) -> None:
    async def aborting(prompt_ids, sampling_params):
        return TokenOutput(token_ids=[], log_probs=[], stop_reason="aborted")

    async def too_many(prompt_ids, sampling_params):
        n = sampling_params["max_new_tokens"] + 1
        return ([7] * n, [-1.0] * n, "length")

    cfg = GenerationConfig(max_new_tokens=4)
    for fn, match in ((aborting, "aborted"), (too_many, "at most 4")):
        with pytest.raises(BackendError, match=match):
            asyncio.run(generate_async(tok, ["hello"], cfg, None, fn))


def test_the_in_flight_limit_holds_across_sequences(tok) -> None:
    eot = end_of_turn_ids(tok)[0]
    in_flight = peak = 0

    async def gen(prompt_ids, sampling_params):
        nonlocal in_flight, peak
        in_flight += 1
        peak = max(peak, in_flight)
        await asyncio.sleep(0.005)
        in_flight -= 1
        return ([9, eot], [-1.0, -1.0], "stop")

    cfg = GenerationConfig(max_new_tokens=8, batch_size=3)
    gens = asyncio.run(generate_async(tok, ["a", "b", "c", "d", "e", "f", "g"], cfg, None, gen))
    assert len(gens) == 7 and all(g.token_ids == [9] for g in gens) and peak == 3


def test_sampling_params_use_sglang_names() -> None:
    from components.engine.controller import Extension

    ext = Extension(
        stream=0, forced=(1,), max_sampled=5, stop_ids=frozenset({8}), seed=11, after=0, position=3,
        context_length=3, banned_ids=(2,), repetition_penalty=1.02,
    )  # fmt: skip
    from components.engine.async_driver import SamplingSettings

    sp = sampling_params(ext, SamplingSettings(temperature=0.7, top_p=0.9, top_k=20))
    assert sp == {
        "max_new_tokens": 5, "stop_token_ids": [2, 8], "temperature": 0.7, "top_p": 0.9, "top_k": 20,
        "repetition_penalty": 1.02, "sampling_seed": 11, "skip_special_tokens": False, "no_stop_trim": True,
    }  # fmt: skip
