"""A protocol-faithful stand-in for an SGLang 0.5.12 server, for tests on machines where SGLang cannot run.

SGLang needs CUDA and its own environment; this is a stdlib HTTP server with a torch model behind it
(``components.engine.backends.torch_tokens.TorchTokenGenerator``), started as a real subprocess with the
same command-line flags as ``python -m sglang.launch_server`` (those ``components.ops.launch`` renders).
Every request and response shape below was checked against SGLang 0.5.12's source (the PyPI wheel):

- ``POST /generate`` (``sglang/srt/entrypoints/http_server.py: generate_request``; the body is
  ``GenerateReqInput``, ``sglang/srt/managers/io_struct.py``): ``text`` or ``input_ids`` (one or a
  batch), ``sampling_params`` (``sglang/srt/sampling/sampling_params.py``: ``max_new_tokens``,
  ``stop_token_ids``, ``temperature``, ``top_p``, ``top_k``, ``repetition_penalty``, ``sampling_seed``,
  ``skip_special_tokens``, ``no_stop_trim``, ``ignore_eos``), ``return_logprob``, ``logprob_start_len``
  (-1: output tokens only), ``rid``. Answer (``managers/tokenizer_manager.py``): ``{"text", "output_ids",
  "meta_info": {"id", "finish_reason", "prompt_tokens", "completion_tokens", "cached_tokens",
  "e2e_latency", "output_token_logprobs": [[logprob, token_id, null]], "input_token_logprobs": [...]}}``
  (a list for a batch). ``finish_reason`` is ``{"type": "stop", "matched": id}``, ``{"type": "length",
  "length": n}`` or ``{"type": "abort", "message", "status_code", "err_type"}``
  (``managers/schedule_batch.py: FINISH_*``). The matched stop token is in ``output_ids`` and its
  log-prob in ``output_token_logprobs``; only the text is trimmed unless ``no_stop_trim``
  (``managers/detokenizer_manager.py: trim_matched_stop``). Input log-probs start at
  ``logprob_start_len`` with ``None`` for that token (``scheduler_output_processor_mixin.py``).
- Request validation (``tokenizer_manager.py: _validate_one_request``): input >= context length, or
  input + ``max_new_tokens`` > context length, is a 400 ``{"error": {"message": ...}}`` with SGLang's
  wording.
- ``GET /health`` and ``/health_generate``: 503 while the model loads, then 200. ``GET /get_model_info``
  (and ``/model_info``): ``model_path``, ``tokenizer_path``, ``is_generation``, ... ``GET /server_info``
  (and ``/get_server_info``): the server args (``context_length``, ``random_seed``, ...) and ``version``.
  ``POST``/``GET /flush_cache``: empties the prefix cache, 200 with SGLang's text.

What it does not do: it recomputes every prompt instead of reusing KV, but reports ``cached_tokens`` as
the longest prefix a radix cache would have matched against earlier requests (so tests can see that
branches share their prefix). Requests are served one at a time.

``--dp-size N``: N data-parallel replicas, each with its own radix cache; a request runs on
``routed_dp_rank`` when it names one (``GenerateReqInput.routed_dp_rank``), else on the next replica in
round robin (SGLang's default load balancing), so ``cached_tokens`` shows whether a sample's requests met
their prefix. ``--api-key KEY``: as SGLang's middleware, every endpoint but ``/health*`` and ``/metrics``
answers 401 ``{"error": "Unauthorized"}`` without ``Authorization: Bearer KEY``.

Fault injection for tests, by environment variable ``SGLANG_STANDIN_FAULT``: ``http500@N`` (the N-th
``/generate`` answers 500), ``abort@N`` (the N-th answers with an abort finish reason), ``exit@N`` (the
process dies while answering the N-th), ``slowstart@S`` (health is 503 for S more seconds).
The same faults (``http500``, ``abort``, ``exit``) can be armed for the next ``/generate`` of a running
server with ``POST /_standin/fault {"fault": KIND}`` (not an SGLang endpoint; tests only).
``SGLANG_STANDIN_REQUEST_LOG=path`` appends every ``/generate`` request it serves to ``path`` (JSON lines).

    python -m tests.support.sglang_standin --model-path DIR --host 127.0.0.1 --port 0 [--context-length N]
    # --port 0 picks a free port; the chosen one is printed as "listening on http://HOST:PORT"
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

VERSION = "0.5.12"


class StandIn:
    """The server state: arguments, the model (loaded in the background), the prefix store, faults."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.ready = False
        self.load_error: str | None = None
        self.generator: Any = None
        self.tokenizer: Any = None
        self.context_length: int = args.context_length or 0
        # one radix cache per data-parallel replica: a request reuses only the prefixes of its replica
        self.seen_by_rank: list[list[list[int]]] = [[] for _ in range(max(1, args.dp_size))]
        self.next_rank = 0  # SGLang's default DP routing: round robin
        self.n_generate = 0
        self.unauthorized = 0
        self.lock = threading.Lock()
        fault = os.environ.get("SGLANG_STANDIN_FAULT", "")
        self.fault_kind, _, at = fault.partition("@")
        self.fault_at = float(at) if at else 0.0
        self.ready_after = time.time() + (self.fault_at if self.fault_kind == "slowstart" else 0.0)
        self.fault_next: str | None = None

    def load(self) -> None:
        try:
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer

            from components.engine.backends.torch_tokens import TorchTokenGenerator
            from components.engine.controller import end_of_turn_ids

            torch.set_num_threads(1)
            path = self.args.model_path
            self.tokenizer = AutoTokenizer.from_pretrained(path)
            dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}.get(
                self.args.dtype, torch.float32
            )
            model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype)
            model.eval()
            if not self.context_length:
                self.context_length = int(getattr(model.config, "max_position_embeddings", 32768))
            eos = list(end_of_turn_ids(self.tokenizer))
            gen_eos = getattr(model.generation_config, "eos_token_id", None)
            for e in gen_eos if isinstance(gen_eos, list) else [gen_eos]:
                if e is not None and e not in eos:
                    eos.append(int(e))
            self.generator = TorchTokenGenerator(
                model,
                eos,
                random_seed=self.args.random_seed or 0,
                deterministic=self.args.enable_deterministic_inference,
                return_original_logprob=os.environ.get("SGLANG_RETURN_ORIGINAL_LOGPROB", "") in ("1", "true"),
            )
            self.ready = True
        except Exception as err:  # SGLang's launcher exits when the model cannot be loaded
            self.load_error = f"{type(err).__name__}: {err}"
            print(f"model load failed: {self.load_error}", file=sys.stderr, flush=True)
            os._exit(1)

    def healthy(self) -> bool:
        return self.ready and time.time() >= self.ready_after

    def dp_rank(self, routed: Any) -> int:
        """The replica a request runs on: ``routed_dp_rank`` when given, else round robin (SGLang's
        ``--load-balance-method round_robin``); a rank outside the replicas is a 400, as SGLang's."""
        if routed is not None:
            rank = int(routed)
            if not 0 <= rank < len(self.seen_by_rank):
                raise ValueError(f"routed_dp_rank {rank} is out of range [0, {len(self.seen_by_rank)})")
            return rank
        rank, self.next_rank = self.next_rank, (self.next_rank + 1) % len(self.seen_by_rank)
        return rank

    def cached_prefix(self, ids: list[int], rank: int = 0) -> int:
        best = 0
        for seq in self.seen_by_rank[rank]:
            n = 0
            for a, b in zip(seq, ids, strict=False):
                if a != b:
                    break
                n += 1
            best = max(best, n)
        return min(best, max(len(ids) - 1, 0))

    # ------------------------------------------------------------------ /generate
    def generate(self, body: dict[str, Any]) -> tuple[int, Any]:
        if body.get("stream"):
            return 400, {"error": {"message": "the stand-in server does not stream"}}
        batch, inputs = self._inputs(body)
        params = body.get("sampling_params") or {}
        out = []
        for i, ids in enumerate(inputs):
            sp = params[i] if isinstance(params, list) else params
            rid = body.get("rid")
            rid = rid[i] if isinstance(rid, list) else (rid or f"standin-{self.n_generate}-{i}")
            start = body.get("logprob_start_len")
            start = start[i] if isinstance(start, list) else start
            ret_lp = body.get("return_logprob")
            ret_lp = bool(ret_lp[i] if isinstance(ret_lp, list) else ret_lp)
            rank = self.dp_rank(body.get("routed_dp_rank"))
            status, item = self._one(ids, dict(sp), rid, ret_lp, -1 if start is None else int(start), rank)
            if status != 200:
                return status, item
            out.append(item)
        return 200, out if batch else out[0]

    def _inputs(self, body: dict[str, Any]) -> tuple[bool, list[list[int]]]:
        if body.get("input_ids") is not None:
            ids = body["input_ids"]
            batch = bool(ids) and isinstance(ids[0], list)
            return batch, [list(map(int, x)) for x in (ids if batch else [ids])]
        text = body.get("text")
        if text is None:
            raise ValueError("Either text, input_ids or input_embeds should be provided.")
        batch = isinstance(text, list)
        return batch, [
            self.tokenizer.encode(t, add_special_tokens=False) for t in (text if batch else [text])
        ]

    def _one(
        self, ids: list[int], sp: dict[str, Any], rid: str, return_logprob: bool, start: int, rank: int = 0
    ) -> tuple[int, Any]:
        n_in = len(ids)
        if n_in >= self.context_length:
            msg = f"The input ({n_in} tokens) is longer than the model's context length ({self.context_length} tokens)."
            return 400, {"error": {"message": msg}}
        max_new = sp.get("max_new_tokens", 128)
        if max_new is not None and n_in + int(max_new) > self.context_length:
            msg = (
                f"Requested token count exceeds the model's maximum context length of {self.context_length} "
                f"tokens. You requested a total of {n_in + int(max_new)} tokens: {n_in} tokens from the input "
                f"messages and {int(max_new)} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit."
            )
            return 400, {"error": {"message": msg}}
        self.n_generate += 1
        log = os.environ.get("SGLANG_STANDIN_REQUEST_LOG")
        if log:
            with open(log, "a") as f:
                f.write(
                    json.dumps(
                        {
                            "input_ids": ids,
                            "sampling_params": sp,
                            "rid": rid,
                            "return_logprob": return_logprob,
                            "logprob_start_len": start,
                            "dp_rank": rank,
                        }
                    )
                    + "\n"
                )
        armed, self.fault_next = self.fault_next, None
        if armed is None and self.n_generate == int(self.fault_at or -1):
            armed = self.fault_kind
        if armed == "http500":
            return 500, {"error": {"message": "stand-in fault: internal server error"}}
        if armed == "exit":
            os._exit(3)
        tic = time.perf_counter()
        cached = self.cached_prefix(ids, rank)
        answer = self.generator.generate(ids, sp, start if return_logprob else -1)
        self.seen_by_rank[rank].append(ids + answer.token_ids)
        if armed == "abort":
            finish: dict[str, Any] = {
                "type": "abort",
                "message": "Abort by stand-in fault",
                "status_code": 500,
                "err_type": None,
            }
        elif answer.stop_reason == "stop":
            finish = {"type": "stop", "matched": answer.matched}
        else:
            finish = {"type": "length", "length": int(sp.get("max_new_tokens", 128))}
        text_ids = answer.token_ids
        if finish["type"] == "stop" and not sp.get("no_stop_trim", False) and text_ids:
            text_ids = text_ids[:-1]
        skip = sp.get("skip_special_tokens", True)
        meta: dict[str, Any] = {
            "id": rid,
            "finish_reason": finish,
            "prompt_tokens": n_in,
            "weight_version": self.args.weight_version,
            "completion_tokens": len(answer.token_ids),
            "cached_tokens": cached,
            "e2e_latency": time.perf_counter() - tic,
        }
        if return_logprob:
            meta["output_token_logprobs"] = [
                [lp, tok, None] for lp, tok in zip(answer.log_probs, answer.token_ids, strict=True)
            ]
            if start >= 0:
                meta["input_token_logprobs"] = [
                    [lp, tok, None] for lp, tok in zip(answer.input_logprobs, ids[start:], strict=True)
                ]
            else:
                meta["input_token_logprobs"] = []
        item = {
            "text": self.tokenizer.decode(text_ids, skip_special_tokens=bool(skip)),
            "output_ids": answer.token_ids,
            "meta_info": meta,
        }
        return 200, item

    # ------------------------------------------------------------------ info
    def model_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "tokenizer_path": self.args.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": self.args.weight_version,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "qwen3",
            "architectures": ["Qwen3ForCausalLM"],
        }

    def server_info(self) -> dict[str, Any]:
        return {
            "model_path": self.args.model_path,
            "served_model_name": self.args.served_model_name or self.args.model_path,
            "context_length": self.context_length,
            "random_seed": self.args.random_seed,
            "enable_deterministic_inference": self.args.enable_deterministic_inference,
            "tp_size": self.args.tp_size,
            "dp_size": self.args.dp_size,
            "max_req_input_len": self.context_length - 1,
            "version": VERSION,
        }


def make_handler(state: StandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def _send(self, status: int, payload: Any, text: bool = False) -> None:
            data = payload.encode() if text else json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "text/plain" if text else "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _empty(self, status: int) -> None:
            self.send_response(status)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def _authorized(self, path: str) -> bool:
            """SGLang's --api-key middleware: every path but /health* and /metrics needs the bearer key."""
            key = state.args.api_key
            if not key or path.startswith(("/health", "/metrics")):
                return True
            if self.headers.get("Authorization") == f"Bearer {key}":
                return True
            state.unauthorized += 1
            self._send(401, {"error": "Unauthorized"})
            return False

        def do_GET(self) -> None:  # noqa: N802 - http.server naming
            path = self.path.split("?", 1)[0]
            if not self._authorized(path):
                return
            if path in ("/health", "/health_generate"):
                self._empty(200 if state.healthy() else 503)
            elif path in ("/get_model_info", "/model_info"):
                self._send(200, state.model_info())
            elif path in ("/server_info", "/get_server_info"):
                self._send(200, state.server_info())
            elif path == "/flush_cache":
                self._flush()
            else:
                self._send(404, {"detail": "Not Found"})

        def do_POST(self) -> None:  # noqa: N802
            path = self.path.split("?", 1)[0]
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b""
            if not self._authorized(path):
                return
            if path == "/flush_cache":
                self._flush()
                return
            if path == "/_standin/fault":
                state.fault_next = json.loads(raw or b"{}").get("fault")
                self._send(200, {"armed": state.fault_next})
                return
            if path != "/generate":
                self._send(404, {"detail": "Not Found"})
                return
            if not state.healthy():
                self._send(503, {"error": {"message": "The server is starting"}})
                return
            try:
                body = json.loads(raw or b"{}")
                with state.lock:
                    status, payload = state.generate(body)
            except (ValueError, KeyError, TypeError) as err:
                status, payload = 400, {"error": {"message": str(err)}}
            self._send(status, payload)

        def _flush(self) -> None:
            with state.lock:
                for seen in state.seen_by_rank:
                    seen.clear()
            self._send(
                200,
                "Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)\n",
                text=True,
            )

        def log_message(self, *args: Any) -> None:
            pass

    return Handler


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The ``sglang.launch_server`` flags the project renders (components/ops/launch.py), same spelling."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model-path", required=True)
    p.add_argument("--tokenizer-path")
    p.add_argument("--served-model-name")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=30000)
    p.add_argument("--tp-size", type=int, default=1)
    p.add_argument("--dp-size", type=int, default=1)
    p.add_argument("--dtype", default="auto")
    p.add_argument("--mem-fraction-static", type=float)
    p.add_argument("--context-length", type=int)
    p.add_argument("--random-seed", type=int, default=0)
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--enable-deterministic-inference", action="store_true")
    p.add_argument("--skip-server-warmup", action="store_true")
    p.add_argument("--api-key")
    p.add_argument("--weight-version", default="default")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.dtype == "auto":
        args.dtype = "float32"
    state = StandIn(args)
    server = ThreadingHTTPServer((args.host, args.port), make_handler(state))
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on http://{host}:{port}", flush=True)
    threading.Thread(target=state.load, daemon=True).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()


def _stop(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt  # SIGTERM: stop serving and exit like SGLang's launcher does


if __name__ == "__main__":
    import signal

    signal.signal(signal.SIGTERM, _stop)
    main()
