"""The SGLang client against a TEST DOUBLE: a tiny local HTTP server that answers /generate like SGLang's
native API (no GPU here to run the real one). It checks what the client sends and how it reads replies."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from components.engine import GenerationConfig, generate
from components.engine.backends.sglang_client import SGLangError
from components.engine.decoder import end_of_turn_ids
from components.models.tiny import tiny_test_world


class FakeSGLangGenerateHandler(BaseHTTPRequestHandler):
    """Test double of SGLang's /generate: echoes each prompt's last 3 ids, then end-of-turn."""

    requests: list[dict] = []
    stop_id = 0

    def do_POST(self) -> None:  # noqa: N802 - http.server naming
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).requests.append({"path": self.path, "body": body})
        if self.path != "/generate":
            self.send_response(404)
            self.end_headers()
            return
        out = []
        for ids in body["input_ids"]:
            toks = ids[-3:] + [type(self).stop_id]
            out.append(
                {
                    "text": "",
                    "meta_info": {
                        "finish_reason": {"type": "stop", "matched": type(self).stop_id},
                        "output_token_logprobs": [[-0.5 * (i + 1), t, None] for i, t in enumerate(toks)],
                    },
                }
            )
        data = json.dumps(out).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args) -> None:
        pass


@pytest.fixture()
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeSGLangGenerateHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_sglang_client_sends_token_ids_and_returns_generations(fake_server) -> None:
    _, tok = tiny_test_world()
    FakeSGLangGenerateHandler.stop_id = end_of_turn_ids(tok)[0]
    FakeSGLangGenerateHandler.requests = []
    prompts = ["hello there", "2+3=", "abc"]
    cfg = GenerationConfig(backend="sglang", server_url=fake_server, batch_size=2, max_new_tokens=9, top_k=5)
    gens = generate(None, tok, prompts, cfg)
    assert len(FakeSGLangGenerateHandler.requests) == 2  # batches of 2 + 1
    sent = FakeSGLangGenerateHandler.requests[0]["body"]
    assert sent["input_ids"] == [tok.encode(p, add_special_tokens=False) for p in prompts[:2]]
    assert sent["return_logprob"] is True
    assert sent["sampling_params"]["max_new_tokens"] == 9 and sent["sampling_params"]["top_k"] == 5
    assert sent["sampling_params"]["stop_token_ids"] == end_of_turn_ids(tok)
    for p, g in zip(prompts, gens, strict=True):
        ids = tok.encode(p, add_special_tokens=False)
        assert g.backend == "sglang" and g.finish_reason == "stop"
        assert g.token_ids == ids[-3:] and g.logprobs == [-0.5, -1.0, -1.5][: len(g.token_ids)]
        assert g.stop_token_id == FakeSGLangGenerateHandler.stop_id and g.stop_logprob < 0
        assert g.position_ids == list(range(len(ids), len(ids) + len(g.token_ids)))


def test_sglang_client_refuses_parallel_mode_and_reports_unreachable_server() -> None:
    _, tok = tiny_test_world()
    with pytest.raises(ValueError, match="parallel"):
        generate(None, tok, ["x"], GenerationConfig(backend="sglang", mode="parallel"))
    with pytest.raises(SGLangError, match="cannot reach"):
        generate(None, tok, ["x"], GenerationConfig(backend="sglang", server_url="http://127.0.0.1:9"))
