"""components.env: a flow started by hand finds the running `npr server` through its PREFECT_HOME record."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

from components.env import record_server, running_server_url, server_file, use_running_server


@pytest.fixture()
def health_api() -> Iterator[str]:
    """An HTTP server on 127.0.0.1 answering Prefect's ``/api/health`` with ``true``."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            ok = self.path == "/api/health"
            self.send_response(200 if ok else 404)
            self.end_headers()
            self.wfile.write(b"true" if ok else b"")

        def log_message(self, *args: object) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_port}/api"
    server.shutdown()


def test_a_recorded_healthy_server_becomes_the_api(
    tmp_path: Path, health_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # setenv first, so teardown removes the URL use_running_server writes to os.environ: a bare
    # delenv(raising=False) of an unset variable records nothing, and the URL of this test's (then stopped)
    # server leaked into later tests on the worker (CI: the e2e's `npr run` inherited it, "Failed to reach API")
    monkeypatch.setenv("PREFECT_API_URL", "unset-by-this-test")
    monkeypatch.delenv("PREFECT_API_URL")
    assert use_running_server(tmp_path) is None  # nothing recorded: Prefect's own (ephemeral) API
    record_server(health_api, 123, tmp_path)
    assert server_file(tmp_path).exists()
    assert use_running_server(tmp_path) == health_api
    assert os.environ["PREFECT_API_URL"] == health_api


def test_a_stale_record_or_a_chosen_api_is_left_alone(
    tmp_path: Path, health_api: str, monkeypatch: pytest.MonkeyPatch
) -> None:

    monkeypatch.setenv("PREFECT_API_URL", "http://elsewhere:4200/api")
    record_server(health_api, 123, tmp_path)
    assert use_running_server(tmp_path) is None  # the user's PREFECT_API_URL wins
    monkeypatch.delenv("PREFECT_API_URL")
    record_server("http://127.0.0.1:9/api", 123, tmp_path)  # a killed server's record: nothing answers
    assert running_server_url(tmp_path, timeout_s=0.5) is None
