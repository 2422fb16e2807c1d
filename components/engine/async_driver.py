"""The async driver: run fork/merge controllers against any ``async generate(prompt_ids, sampling_params)``.

The same function serves SGLang over HTTP (``backends/sglang_client.py``) and verl's agent loop, whose
``server_manager.generate(request_id, prompt_ids=..., sampling_params=...)`` returns a ``TokenOutput``
(``token_ids``, ``log_probs``, ``stop_reason``). A request is ``prompt_ids`` = the stream's flat context
(``SequenceController.context_ids``) + the forced tokens, with SGLang's sampling parameter names; the
branches of a block are sent concurrently (each its own request sharing the prefix, so a radix cache
shares their KV and each branch's positions restart after the prefix, as the trainer's do) and the merge
is one more request whose prompt is prefix + all branches (re-prefilled: ``merge_mode="reprefill"``).

Forced tokens (``<step>`` + label, ``<takeaway>``, a closing ``</step>``) are part of the prompt, so a
plain ``generate`` returns no log-probability for them: they are NaN in the ``Generation`` (trainers
recompute log-probs anyway). A callable with ``scores_prompt_tail = True`` is asked for them with the
extra argument ``tail`` (how many trailing prompt tokens to score) and returns them as a fourth tuple
element or as ``extra_fields["prompt_tail_logprobs"]``; the SGLang client does (``logprob_start_len``).

End-of-turn cannot be banned through SGLang's API without changing the log-probs it returns
(``logit_bias`` is applied before them), so inside a branch it is sent as a stop id instead; a branch that
stops there ends the response, unmerged (``controller``). Sampling seeds are per request
(``Extension.seed``, as ``sampling_seed``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from components.engine.config import GenerationConfig
from components.engine.controller import (
    ControllerError,
    DecodePolicy,
    Extension,
    ExtensionResult,
    SequenceController,
)

GenerateFn = Callable[..., Awaitable[Any]]


class BackendError(RuntimeError):
    """A token backend failed a request (server error, abort, connection loss, malformed answer)."""


@dataclass(frozen=True)
class SamplingSettings:
    """The sampling parameters every request of a call shares (the rest come from each ``Extension``)."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1

    @classmethod
    def from_config(cls, cfg: GenerationConfig) -> SamplingSettings:
        return cls(temperature=cfg.temperature, top_p=cfg.top_p, top_k=cfg.top_k)


def sampling_params(ext: Extension, sampling: SamplingSettings) -> dict[str, Any]:
    """SGLang ``sampling_params`` for one extension (sglang/srt/sampling/sampling_params.py names).

    Banned ids become stop ids (see the module docstring); ``no_stop_trim`` keeps the matched stop in the
    text; ``skip_special_tokens=False`` keeps the tags (they are special tokens).
    """
    return {
        "max_new_tokens": ext.max_sampled,
        "stop_token_ids": sorted(set(ext.stop_ids) | set(ext.banned_ids)),
        "temperature": sampling.temperature,
        "top_p": sampling.top_p,
        "top_k": sampling.top_k,
        "repetition_penalty": ext.repetition_penalty,
        "sampling_seed": ext.seed,
        "skip_special_tokens": False,
        "no_stop_trim": True,
    }


def read_token_output(raw: Any) -> tuple[list[int], list[float] | None, str | None, list[float] | None]:
    """``(token_ids, logprobs, stop_reason, prompt_tail_logprobs)`` from a tuple of 3 or 4, or from an
    object with ``token_ids``, ``log_probs``, ``stop_reason`` (and ``extra_fields``), like verl's
    ``TokenOutput``."""
    if isinstance(raw, tuple | list):
        if len(raw) not in (3, 4):
            raise BackendError(
                f"generate returned a tuple of {len(raw)}, expected (ids, logprobs, stop[, tail])"
            )
        ids, lps, stop = raw[0], raw[1], raw[2]
        tail = raw[3] if len(raw) == 4 else None
    else:
        try:
            ids, lps, stop = raw.token_ids, raw.log_probs, raw.stop_reason
        except AttributeError as err:
            raise BackendError(f"generate returned {type(raw).__name__}, not a token output: {err}") from err
        tail = (getattr(raw, "extra_fields", None) or {}).get("prompt_tail_logprobs")
    return [int(t) for t in ids], None if lps is None else [float(x) for x in lps], stop, tail


def _finish_of(stop_reason: str | None, sampled: list[int], ext: Extension) -> str:
    if stop_reason in ("abort", "aborted"):
        return "abort"
    if stop_reason in ("length",):
        return "length"
    if stop_reason in ("stop", "completed"):
        return "stop"
    # unknown: read it from the tokens
    return "stop" if sampled and sampled[-1] in ext.stop_ids else "length"


async def run_extension(
    ctl: SequenceController, ext: Extension, generate: GenerateFn, sampling: SamplingSettings
) -> ExtensionResult:
    """Send one extension to ``generate`` and turn the answer into an ``ExtensionResult``."""
    scores = bool(getattr(generate, "scores_prompt_tail", False))
    forced = list(ext.forced)
    nan = [math.nan] * len(forced)
    if ext.max_sampled == 0 and not scores:
        return ExtensionResult(forced, nan, "length")  # nothing to sample and nobody can score the tokens
    prompt = ctl.context_ids(ext) + forced
    params = sampling_params(ext, sampling)
    raw = await (generate(prompt, params, tail=len(forced)) if scores else generate(prompt, params))
    ids, lps, stop_reason, tail = read_token_output(raw)
    if ext.max_sampled == 0:
        ids, lps = [], []  # a prefill-only request: some servers return a phantom token
    finish = _finish_of(stop_reason, ids, ext)
    if finish == "abort":
        raise BackendError(
            f"the server aborted a request of {len(prompt)} prompt tokens (stop_reason {stop_reason!r})"
        )
    if lps is None:
        lps = [math.nan] * len(ids)
    if len(lps) != len(ids):
        raise BackendError(f"generate returned {len(ids)} tokens but {len(lps)} logprobs")
    if len(ids) > ext.max_sampled:
        raise BackendError(f"generate returned {len(ids)} tokens, at most {ext.max_sampled} were asked for")
    forced_lps = nan
    if forced and tail is not None:
        if len(tail) != len(forced):
            raise BackendError(f"asked the logprobs of {len(forced)} prompt tokens, got {len(tail)}")
        forced_lps = [math.nan if v is None else float(v) for v in tail]
    return ExtensionResult(forced + ids, forced_lps + lps, finish)  # type: ignore[arg-type]


async def drive(
    ctl: SequenceController,
    generate: GenerateFn,
    sampling: SamplingSettings,
    limit: asyncio.Semaphore | None = None,
) -> SequenceController:
    """Run one controller to completion; the requests it allows at once (a block's branches) run
    concurrently. ``limit`` bounds requests in flight across every controller sharing it."""

    async def one(ext: Extension) -> tuple[Extension, ExtensionResult]:
        if limit is None:
            return ext, await run_extension(ctl, ext, generate, sampling)
        async with limit:
            return ext, await run_extension(ctl, ext, generate, sampling)

    pending = {asyncio.ensure_future(one(e)) for e in ctl.start()}
    try:
        while pending:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            # advance in stream order so a batch of answers is consumed the same way every run
            answers = sorted((t.result() for t in done), key=lambda er: er[0].stream)
            for ext, result in answers:
                try:
                    follow = ctl.advance(ext, result)
                except ControllerError as err:
                    raise BackendError(f"the backend's answer broke a decoding rule: {err}") from err
                pending |= {asyncio.ensure_future(one(e)) for e in follow}
    finally:
        for task in pending:
            task.cancel()
    return ctl


class _Routed:
    """``generate`` with every request of one sample marked ``route=<sample>`` (a backend that routes by
    sample, ``routes_by_sample``, keeps a sample's requests on one replica: SGLang's ``routed_dp_rank``)."""

    def __init__(self, generate: GenerateFn, route: int) -> None:
        self.generate, self.route = generate, route
        self.scores_prompt_tail = bool(getattr(generate, "scores_prompt_tail", False))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.generate(*args, route=self.route, **kwargs)


def routed(generate: GenerateFn, route: int) -> GenerateFn:
    """``generate`` as the driver calls it for sample ``route``."""
    return _Routed(generate, route) if getattr(generate, "routes_by_sample", False) else generate


async def drive_all(
    ctls: Sequence[SequenceController],
    generate: GenerateFn,
    sampling: SamplingSettings,
    max_in_flight: int,
    backend: str,
) -> list[Any]:
    """Drive every controller concurrently (at most ``max_in_flight`` requests at a time) and return
    their ``Generation``s in order, each timed from its first request to its last answer."""
    limit = asyncio.Semaphore(max_in_flight)

    async def timed(i: int, ctl: SequenceController) -> float:
        start = time.perf_counter()
        await drive(ctl, routed(generate, i), sampling, limit)
        return time.perf_counter() - start

    tasks = [asyncio.ensure_future(timed(i, c)) for i, c in enumerate(ctls)]
    try:
        walls = await asyncio.gather(*tasks)
    except BaseException:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    return [
        c.generation(backend=backend, merge_mode="reprefill", wall_time_s=w)
        for c, w in zip(ctls, walls, strict=True)
    ]


def controllers_for(
    tokenizer: Any,
    prompts: Sequence[str],
    cfg: GenerationConfig,
    tags: Any | None,
    response_prefixes: Sequence[str] | None = None,
) -> list[SequenceController]:
    """One controller per rendered prompt, with the sequence seeds every backend derives the same way."""
    policy = DecodePolicy.from_config(cfg, tokenizer, tags)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731 - prompts are rendered
    return [
        SequenceController(
            encode(p),
            policy,
            seed=cfg.seed * 1_000_003 + i,
            forced_prefix=encode(response_prefixes[i]) if response_prefixes is not None else (),
        )
        for i, p in enumerate(prompts)
    ]


async def generate_async(
    tokenizer: Any,
    prompts: Sequence[str],
    cfg: GenerationConfig,
    tags: Any | None,
    generate: GenerateFn,
    response_prefixes: Sequence[str] | None = None,
    backend: str = "async",
) -> list[Any]:
    """``components.engine.generate`` over an async token backend: same arguments, same ``Generation``s
    (``merge_mode="reprefill"``), at most ``cfg.batch_size`` requests in flight."""
    ctls = controllers_for(tokenizer, prompts, cfg, tags, response_prefixes)
    return await drive_all(ctls, generate, SamplingSettings.from_config(cfg), cfg.batch_size, backend)
