"""SGLang backend: the fork/merge controller over a running SGLang server's native ``/generate`` HTTP API.

Sequential and parallel mode both run through ``components.engine.async_driver``: one ``/generate``
request per controller ``Extension`` (token ids in, so tokenisation is ours and identical across
backends), at most ``cfg.batch_size`` in flight; SGLang batches concurrent requests itself. In parallel
mode the branches of a block are concurrent requests ``prefix + <step> + label`` stopped at ``</step>``:
SGLang's radix cache shares the prefix KV and each branch's positions restart after the prefix, exactly
as the trainer's mask and positions do, so branch tokens are exact. The merge is a new request whose
prompt is prefix + every branch + ``<takeaway>``: SGLang has no position or mask fields
(``GenerateReqInput``, sglang/srt/managers/io_struct.py), so it re-reads the branches as sequential text
(``merge_mode="reprefill"``) and the tokens after the first merge are sampled from that context
(docs/results.md measures the gap; trainers correct it with a truncated importance weight).

Request/answer shapes (checked against SGLang 0.5.12's source, see tests/support/sglang_standin.py):
``{"input_ids", "sampling_params", "return_logprob": true, "logprob_start_len", "rid"}`` ->
``meta_info.output_token_logprobs`` ``[[logprob, id, text]]``, ``meta_info.input_token_logprobs`` (the
forced tokens' log-probs: ``logprob_start_len = len(prompt) - n_forced - 1``, first entry None),
``meta_info.finish_reason.type`` in ``stop | length | abort``. Per-request seeds go out as
``sampling_seed`` (SGLang honours them with ``--enable-deterministic-inference``).

Failures raise ``SGLangError`` with what happened (HTTP status and the server's message, an abort, a
lost connection, a timeout): a stage stops, and what it finished before (distill's chunks) is kept.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import json
import os
from typing import Any

import httpx

from components.engine.async_driver import BackendError, generate_async
from components.engine.backends.http_json import request_json
from components.engine.backends.sglang_isolated import request_fields
from components.engine.config import GenerationConfig
from components.engine.generation import Generation
from components.structure import TagIds

# The server's API key (infra/sglang/server.yaml api_key_env); sent as a bearer token when set.
API_KEY_ENV = "NPR_SGLANG_API_KEY"


def auth_headers(key_env: str = API_KEY_ENV) -> dict[str, str]:
    """The headers every request to a server started with ``--api-key`` needs: SGLang answers 401 on every
    endpoint but ``/health*`` and ``/metrics`` without ``Authorization: Bearer <key>`` (vLLM on every ``/v1``
    route; its key is in ``vllm_client.API_KEY_ENV``). One definition for the clients and the launcher's model
    and context checks."""
    api_key = os.environ.get(key_env)
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


class SGLangError(BackendError):
    """The SGLang server failed a request, could not be reached, or answered something unexpected."""


class SGLangClient:
    """``await client(prompt_ids, sampling_params, tail=n)`` -> ``(ids, logprobs, stop_reason, tail_lps)``.

    One ``httpx.AsyncClient`` per event loop; ``rid`` is a fresh id per request (SGLang rejects duplicates
    in flight).
    """

    scores_prompt_tail = True
    routes_by_sample = True  # takes ``route=<sample index>`` (the async driver passes it)

    def __init__(
        self, base_url: str, timeout_s: float = 600.0, isolated: tuple[list[int], Any] | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        # EXPERIMENTAL isolated merge: (response start per sample, TagIds); every request of sample i then
        # carries sglang_isolated.request_fields(starts[i], tags) for the server's plugin
        self.isolated = isolated
        self._http: httpx.AsyncClient | None = None
        self._ids = itertools.count()
        self.n_requests = 0
        self.dp_size = 1

    async def __aenter__(self) -> SGLangClient:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=self.timeout_s, limits=limits, headers=auth_headers()
        )
        # data-parallel replicas: every request of one sample goes to one replica (routed_dp_rank), whose
        # radix cache then holds the prefix its branches and its merge share
        try:
            info = await self._http.get("/server_info")
            self.dp_size = int(info.json().get("dp_size") or 1) if info.status_code == 200 else 1
        except (httpx.HTTPError, ValueError, json.JSONDecodeError):
            self.dp_size = 1
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __call__(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], tail: int = 0, route: int | None = None
    ) -> tuple[list[int], list[float], str, list[float | None] | None]:
        payload: dict[str, Any] = {
            "rid": f"npr-{next(self._ids)}",
            "input_ids": list(prompt_ids),
            "sampling_params": sampling_params,
            "return_logprob": True,
            "logprob_start_len": len(prompt_ids) - tail - 1 if tail else -1,
        }
        if route is not None and self.dp_size > 1:
            payload["routed_dp_rank"] = route % self.dp_size
        if self.isolated is not None:
            if route is None:
                raise SGLangError(
                    "an isolated-merge request needs its sample (route) to know its response start"
                )
            starts, tags = self.isolated
            fields = request_fields(starts[route], tags)
            payload["extra_key"] = fields["extra_key"]
            payload["sampling_params"] = {**sampling_params, "custom_params": fields["custom_params"]}
        item = await self.post("/generate", payload)
        self.n_requests += 1
        return parse_generate_item(item, tail)

    async def post(self, path: str, payload: dict[str, Any]) -> Any:
        return await request_json(
            self._http, "POST", path, payload, server="SGLang", error=SGLangError, timeout_s=self.timeout_s
        )


def parse_generate_item(
    item: Any, tail: int = 0
) -> tuple[list[int], list[float], str, list[float | None] | None]:
    """``(output ids, their logprobs, finish type, logprobs of the last ``tail`` prompt tokens)`` of one
    ``/generate`` answer; SGLangError for an abort or a malformed answer."""
    meta = item.get("meta_info") if isinstance(item, dict) else None
    if not isinstance(meta, dict) or "output_token_logprobs" not in meta:
        raise SGLangError(f"answer lacks meta_info.output_token_logprobs: {str(item)[:300]}")
    finish = meta.get("finish_reason") or {}
    kind = finish.get("type") if isinstance(finish, dict) else None
    if kind == "abort":
        raise SGLangError(
            f"SGLang aborted the request: {finish.get('message')} (status {finish.get('status_code')})"
        )
    pairs = [(int(tok), float(lp)) for lp, tok, *_ in meta["output_token_logprobs"]]
    ids = [t for t, _ in pairs]
    output_ids = item.get("output_ids")
    if output_ids is not None and list(output_ids) != ids and len(output_ids) == len(ids):
        raise SGLangError(f"output_ids {output_ids[:8]}... disagree with output_token_logprobs {ids[:8]}...")
    tail_lps = None
    if tail:
        entries = meta.get("input_token_logprobs") or []
        if len(entries) != tail + 1:
            raise SGLangError(f"asked the logprobs of the last {tail} prompt tokens, got {len(entries) - 1}")
        tail_lps = [None if e[0] is None else float(e[0]) for e in entries[1:]]
    return ids, [lp for _, lp in pairs], str(kind or ""), tail_lps


def _run(coro: Any) -> Any:
    """Run a coroutine to completion from synchronous code, also when the caller already runs a loop."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, coro).result()


def generate_sglang(
    tokenizer: Any,
    prompts: list[str],
    cfg: GenerationConfig,
    tags: Any | None = None,
    response_prefixes: list[str] | None = None,
) -> list[Generation]:
    """Sample one response per prompt on the SGLang server at ``cfg.server_url`` (sequential or parallel
    mode, same ``Generation`` as the torch backend; ``merge_mode`` is ``reprefill``). With
    ``cfg.sglang_isolated_merge`` in parallel mode, every request carries its response start (the prompt's
    length) and ``tags`` for the server's EXPERIMENTAL isolated-merge plugin."""
    isolated = None
    if cfg.mode == "parallel" and getattr(cfg, "sglang_isolated_merge", False):
        if not isinstance(tags, TagIds):
            raise ValueError(
                f"generation.sglang_isolated_merge needs the schema's TagIds, got {type(tags).__name__}"
            )
        starts = [len(tokenizer.encode(p, add_special_tokens=False)) for p in prompts]  # as controllers_for
        isolated = (starts, tags)

    async def run_all() -> list[Generation]:
        async with SGLangClient(cfg.server_url, cfg.request_timeout_s, isolated) as client:
            return await generate_async(tokenizer, prompts, cfg, tags, client, response_prefixes, "sglang")

    return _run(run_all())
