"""One JSON request to an inference server, its failures as the backend's error: the SGLang and vLLM clients'.

Both clients send JSON over one ``httpx.AsyncClient`` and need the same four failures told apart (no answer in
time, no server, a dropped connection, a non-200 or non-JSON answer), each naming the server and the URL, so
a stage's log says which server failed and how; the clients differ only in their error class and name.
"""

from __future__ import annotations

import json
from typing import Any

import httpx

from components.engine.async_driver import BackendError


def error_message(response: httpx.Response) -> str:
    """The server's own reason for a failed answer: OpenAI-style ``{"error": {"message": ...}}`` (SGLang, newer
    vLLM), else the body, cut short."""
    try:
        body = response.json()
    except json.JSONDecodeError:
        return response.text[:500]
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        return str(body["error"].get("message", body["error"]))[:1000]
    return str(body)[:500]


async def request_json(
    http: httpx.AsyncClient | None,
    method: str,
    path: str,
    payload: dict[str, Any] | None,
    *,
    server: str,
    error: type[BackendError],
    timeout_s: float,
) -> Any:
    """``method path`` with ``payload`` as JSON on ``http`` (its base URL the server's); the decoded answer.

    Raises ``error`` naming ``server`` (``"SGLang"``, ``"vLLM"``) and the URL for a timeout, an unreachable
    server, a lost connection, a non-200 status (with the server's message) and a non-JSON answer.
    """
    if http is None:
        raise RuntimeError(f"use the {server} client inside 'async with'")
    url = str(http.base_url).rstrip("/") + path
    try:
        response = await http.request(method, path, json=payload)
    except httpx.TimeoutException as err:
        raise error(f"{server} server at {url} did not answer within {timeout_s:.0f} s") from err
    except httpx.ConnectError as err:
        raise error(f"cannot reach the {server} server at {url}: {err!r}") from err
    except httpx.TransportError as err:
        raise error(f"lost the connection to the {server} server at {url}: {err!r}") from err
    if response.status_code != 200:
        raise error(
            f"{server} server at {url} answered HTTP {response.status_code}: {error_message(response)}"
        )
    try:
        return response.json()
    except json.JSONDecodeError as err:
        raise error(f"{server} server at {url} answered non-JSON: {response.text[:300]!r}") from err
