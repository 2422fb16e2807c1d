"""vLLM backend: the fork/merge controller over a stock vLLM server's OpenAI ``/v1/completions`` API.

The same request protocol as ``sglang_client`` (``await client(prompt_ids, sampling_params, tail=n)`` ->
``(ids, logprobs, finish, tail_logprobs)``, driven by ``components.engine.async_driver``): token ids in, so
tokenisation is ours; one request per controller ``Extension``, at most ``cfg.batch_size`` in flight. The
controller's sampling parameters (SGLang's names) become vLLM's (``completion_request``). Branches are
concurrent requests sharing the prefix (vLLM's prefix cache shares its full blocks; positions restart after
the prefix, as the trainer's do); the merge is a request of prefix + every branch, re-read as sequential text
(``merge_mode="reprefill"``): exact under ``merge_semantics: reread``.

Log-probs: vLLM returns the sampled tokens' log-probs of the model's own distribution (``logprobs_mode``
``raw_logprobs``, its default: before temperature, top-p/k and penalties), what ``Generation`` records and the
trainer recomputes. Forced tokens (``<step>`` + label, ``<takeaway>``) are prompt tokens; scoring them needs
``prompt_logprobs``, and a request that asks for those never reads the prefix cache (vLLM skips the cache
read so every prompt position is computed), so the client scores them only when built with
``score_forced=True``; otherwise they are NaN, as on any backend that cannot score them (the trainers
recompute them). vLLM rejects ``max_tokens: 0``, so a prefill-only request asks for one token, which the
driver drops.

Answer shape (vLLM 0.31.0, ``return_token_ids: true``, ``logprobs: 0``): ``choices[0].token_ids`` (the
stop token included), ``choices[0].logprobs.token_logprobs``, ``choices[0].finish_reason`` in ``stop |
length | abort``, ``choices[0].prompt_logprobs`` (one ``{token id: {logprob, ...}}`` per prompt token, the
first None). Failures raise ``VLLMError`` naming what happened.
"""

from __future__ import annotations

from typing import Any

import httpx

from components.engine.async_driver import BackendError, generate_async
from components.engine.backends.http_json import request_json
from components.engine.backends.sglang_client import _run, auth_headers
from components.engine.config import GenerationConfig
from components.engine.generation import Generation

# The server's API key (infra/vllm/server.yaml api_key_env); sent as a bearer token when set.
API_KEY_ENV = "NPR_VLLM_API_KEY"
COMPLETIONS = "/v1/completions"
MODELS = "/v1/models"


class VLLMError(BackendError):
    """The vLLM server failed a request, could not be reached, or answered something unexpected."""


def completion_request(
    model: str, prompt_ids: list[int], sampling_params: dict[str, Any], tail: int = 0
) -> dict[str, Any]:
    """The ``/v1/completions`` body for one extension: ``sampling_params`` in the controller's (SGLang's)
    names, ``tail`` the number of trailing prompt tokens to score."""
    request: dict[str, Any] = {
        "model": model,
        "prompt": [list(prompt_ids)],
        "max_tokens": max(1, int(sampling_params["max_new_tokens"])),
        "stop_token_ids": list(sampling_params.get("stop_token_ids") or []),
        "temperature": sampling_params["temperature"],
        "top_p": sampling_params["top_p"],
        "top_k": sampling_params["top_k"],
        "repetition_penalty": sampling_params.get("repetition_penalty", 1.0),
        "skip_special_tokens": False,  # the tags are special tokens; the text keeps them
        "logprobs": 0,  # the sampled token's log-prob only
        "return_token_ids": True,
    }
    if sampling_params.get("sampling_seed") is not None:
        request["seed"] = int(sampling_params["sampling_seed"])
    if tail:
        request["prompt_logprobs"] = 0  # the prompt token's own log-prob only
    return request


def parse_completion(
    body: Any, prompt_ids: list[int], tail: int = 0
) -> tuple[list[int], list[float], str, list[float | None] | None]:
    """``(output ids, their logprobs, finish reason, logprobs of the last ``tail`` prompt tokens)`` of one
    ``/v1/completions`` answer; VLLMError for an abort or a malformed answer."""
    choices = body.get("choices") if isinstance(body, dict) else None
    if not choices or not isinstance(choices[0], dict):
        raise VLLMError(f"answer has no choices: {str(body)[:300]}")
    choice = choices[0]
    finish = str(choice.get("finish_reason") or "")
    if finish == "abort":
        raise VLLMError(f"vLLM aborted the request (stop_reason {choice.get('stop_reason')!r})")
    ids = choice.get("token_ids")
    lps = (choice.get("logprobs") or {}).get("token_logprobs")
    if ids is None or lps is None or len(ids) != len(lps):
        raise VLLMError(f"answer lacks matching token_ids and token_logprobs: {str(choice)[:300]}")
    tail_lps: list[float | None] | None = None
    if tail:
        entries = choice.get("prompt_logprobs") or []
        if len(entries) != len(prompt_ids):
            raise VLLMError(f"asked the logprobs of {len(prompt_ids)} prompt tokens, got {len(entries)}")
        tail_lps = []
        for tok, entry in zip(prompt_ids[-tail:], entries[-tail:], strict=True):
            scored = (entry or {}).get(str(tok))
            tail_lps.append(None if scored is None else float(scored["logprob"]))
    return [int(t) for t in ids], [float(x) for x in lps], finish, tail_lps


class VLLMClient:
    """``await client(prompt_ids, sampling_params, tail=n)`` against a vLLM server; the model name is the
    one ``/v1/models`` lists (the server serves one checkpoint)."""

    routes_by_sample = False  # one engine per server here; a data-parallel server balances by itself

    def __init__(self, base_url: str, timeout_s: float = 600.0, score_forced: bool = False) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout_s = timeout_s
        self.scores_prompt_tail = score_forced
        self.model = ""
        self._http: httpx.AsyncClient | None = None
        self.n_requests = 0
        self.cached_tokens = 0  # prompt tokens the prefix cache served (with --enable-prompt-tokens-details)

    async def __aenter__(self) -> VLLMClient:
        limits = httpx.Limits(max_connections=None, max_keepalive_connections=64)
        self._http = httpx.AsyncClient(
            base_url=self.base_url, timeout=self.timeout_s, limits=limits, headers=auth_headers(API_KEY_ENV)
        )
        models = await self.request("GET", MODELS)
        data = models.get("data") if isinstance(models, dict) else None
        if not data:
            raise VLLMError(f"{self.base_url}{MODELS} lists no model: {str(models)[:300]}")
        self.model = str(data[0]["id"])
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._http is not None:
            await self._http.aclose()
            self._http = None

    async def __call__(
        self, prompt_ids: list[int], sampling_params: dict[str, Any], tail: int = 0
    ) -> tuple[list[int], list[float], str, list[float | None] | None]:
        body = await self.request(
            "POST", COMPLETIONS, completion_request(self.model, prompt_ids, sampling_params, tail)
        )
        self.n_requests += 1
        details = (body.get("usage") or {}).get("prompt_tokens_details") or {}
        self.cached_tokens += int(details.get("cached_tokens") or 0)
        return parse_completion(body, prompt_ids, tail)

    async def request(self, method: str, path: str, payload: dict[str, Any] | None = None) -> Any:
        return await request_json(
            self._http, method, path, payload, server="vLLM", error=VLLMError, timeout_s=self.timeout_s
        )


def generate_vllm(
    tokenizer: Any,
    prompts: list[str],
    cfg: GenerationConfig,
    tags: Any | None = None,
    response_prefixes: list[str] | None = None,
) -> list[Generation]:
    """Sample one response per prompt on the vLLM server at ``cfg.server_url`` (sequential or parallel mode,
    same ``Generation`` as every backend; ``merge_mode`` is ``reprefill``)."""

    async def run_all() -> list[Generation]:
        async with VLLMClient(cfg.server_url, cfg.request_timeout_s) as client:
            return await generate_async(tokenizer, prompts, cfg, tags, client, response_prefixes, "vllm")

    return _run(run_all())
