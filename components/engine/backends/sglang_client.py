"""SGLang backend: sequential sampling through a running SGLang server's native ``/generate`` HTTP API.

Use on the GPU box for the long sequential jobs (stage-1 rollouts, distillation, sequential evaluation):
the server (spec in ``infra/``) is started separately and this client sends token ids, so prompt
tokenisation is ours and identical across backends. Returned objects are the same ``Generation`` as the
torch backend's; ``logprobs`` are SGLang's (``return_logprob``), which trainers recompute anyway.

Parallel mode is NOT served by SGLang: stock SGLang cannot merge the KV of sibling requests into one
sequence (NPR vendored a patched 0.4.6 scheduler for that, npr-reference.md §1.9). The project's answer
on GPU is the torch engine in ``components.engine.decoder`` run on the GPU (one shared-prefix cache, exact
against the trainer). The alternative, SGLang fork/join with re-prefill (``s.fork(k)`` per block, then a
fresh request whose prompt is prefix + all branches, re-prefilled at the merge), recomputes every
branch's KV and uses sequential positions at the merge, so it does not match the trainer's parallel
positions; measuring its cost against our engine needs a GPU and is left to the evaluation stage there.
"""

from __future__ import annotations

import json
import os
import time
import urllib.error
import urllib.request
from typing import Any

from components.engine.config import GenerationConfig
from components.engine.decoder import end_of_turn_ids
from components.engine.generation import Generation

# The server's API key (infra/sglang/server.yaml api_key_env); sent as a bearer token when set.
API_KEY_ENV = "NPR_SGLANG_API_KEY"


class SGLangError(RuntimeError):
    """The server could not be reached or answered something this client does not understand."""


def sampling_params(cfg: GenerationConfig, stop_ids: list[int]) -> dict[str, Any]:
    """SGLang's ``sampling_params`` for one request (greedy = temperature 0)."""
    return {
        "temperature": cfg.temperature,
        "top_p": cfg.top_p,
        "top_k": cfg.top_k,
        "max_new_tokens": cfg.max_new_tokens,
        "stop_token_ids": stop_ids,
        "skip_special_tokens": False,
        "no_stop_trim": False,
    }


def post_json(url: str, payload: dict[str, Any], timeout_s: float) -> Any:
    headers = {"Content-Type": "application/json"}
    api_key = os.environ.get(API_KEY_ENV)
    if api_key:  # the server requires it (--api-key; infra/sglang/server.yaml)
        headers["Authorization"] = f"Bearer {api_key}"
    request = urllib.request.Request(url, data=json.dumps(payload).encode(), headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return json.loads(response.read().decode())
    except urllib.error.HTTPError as err:
        raise SGLangError(f"{url} answered HTTP {err.code}: {err.read()[:500]!r}") from err
    except (urllib.error.URLError, TimeoutError) as err:
        raise SGLangError(f"cannot reach the SGLang server at {url}: {err}") from err


def _to_generation(
    item: dict[str, Any], prompt_ids: list[int], tokenizer: Any, stop_ids: list[int]
) -> Generation:
    meta = item.get("meta_info")
    if not isinstance(meta, dict) or "output_token_logprobs" not in meta:
        raise SGLangError(f"response lacks meta_info.output_token_logprobs: {str(item)[:300]}")
    pairs = [(int(tok), float(lp)) for lp, tok, *_ in meta["output_token_logprobs"]]
    finish = meta.get("finish_reason") or {}
    stop_id = stop_lp = None
    if pairs and pairs[-1][0] in stop_ids:
        stop_id, stop_lp = pairs.pop()
    ids = [t for t, _ in pairs]
    start = len(prompt_ids)
    return Generation(
        prompt_ids=prompt_ids,
        token_ids=ids,
        text=tokenizer.decode(ids, skip_special_tokens=False),
        logprobs=[lp for _, lp in pairs],
        position_ids=list(range(start, start + len(ids))),
        forced=[False] * len(ids),
        finish_reason="stop" if finish.get("type") == "stop" else "length",
        stop_token_id=stop_id,
        stop_logprob=stop_lp,
        wall_time_s=float(meta.get("e2e_latency", 0.0)),
        backend="sglang",
    )


def generate_sglang(
    tokenizer: Any, prompts: list[str], cfg: GenerationConfig, response_prefixes: list[str] | None = None
) -> list[Generation]:
    """Sequential sampling on an SGLang server, ``cfg.batch_size`` prompts per request.

    ``cfg.seed`` is not forwarded: server-side sampling is seeded by the server's own ``random_seed``
    (infra/), so sglang runs are reproducible only as far as the server's deterministic mode allows.
    """
    if cfg.mode == "parallel" or response_prefixes is not None:
        raise ValueError(
            "the sglang backend samples sequentially without forced prefixes; use backend='torch' for "
            "parallel mode (see this module's docstring)"
        )
    stop_ids = end_of_turn_ids(tokenizer)
    url = cfg.server_url.rstrip("/") + "/generate"
    out: list[Generation] = []
    for lo in range(0, len(prompts), cfg.batch_size):
        ids = [tokenizer.encode(p, add_special_tokens=False) for p in prompts[lo : lo + cfg.batch_size]]
        payload = {
            "input_ids": ids,
            "sampling_params": sampling_params(cfg, stop_ids),
            "return_logprob": True,
        }
        start = time.perf_counter()
        answer = post_json(url, payload, cfg.request_timeout_s)
        items = answer if isinstance(answer, list) else [answer]
        if len(items) != len(ids):
            raise SGLangError(f"sent {len(ids)} prompts, got {len(items)} results")
        wall = time.perf_counter() - start
        for item, prompt_ids in zip(items, ids, strict=True):
            gen = _to_generation(item, prompt_ids, tokenizer, stop_ids)
            gen.wall_time_s = wall
            out.append(gen)
    return out
