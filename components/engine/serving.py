"""An inference server (SGLang or vLLM) for the checkpoint a stage samples: started, checked, always stopped.

``serving(model_dir, gen_cfg, ...)`` is what ``distill`` and ``evaluate`` wrap their decoding in when
``generation.backend`` is a server (``sglang`` or ``vllm``; ``SERVERS`` holds what differs between them):

- ``server: launch`` renders the server's command from its spec (``generation.server_spec``,
  infra/sglang/server.yaml: ``python -m sglang.launch_server``; ``generation.vllm_server_spec``,
  infra/vllm/server.yaml: ``python -m vllm.entrypoints.openai.api_server`` in its own locked environment,
  installed on first use, ``components.engine.server_env``) with ``model_path`` = this checkpoint, bound to
  127.0.0.1 on a free port, in its own process group, output to a log file; waits until its health route
  (``/health_generate``; vLLM ``/health``, which answers only once the engine is up) answers 200 (or fails
  at once if the process exits, with the log's tail); checks that the server names this checkpoint
  (``/get_model_info``; vLLM ``/v1/models``); yields the URL; and on the way out (normal end, an error,
  Ctrl-C) sends SIGTERM to the whole group, then SIGKILL after a grace period. A fresh server per
  checkpoint, so nothing samples a stale model (e.g. NPR-Zero's server after ``npr_zero`` retrained).
- ``server: attach`` uses the server at ``generation.server_url`` (started elsewhere), after the same
  health check and a check of the weights it serves: a path proves nothing across machines (the server
  resolves its ``model_path`` in its own directory, which may hold another version of that checkpoint), so
  an SGLang server is named by its weights: started with ``--weight-version <the checkpoint's DVC md5>``
  (what dvc.lock records; ``launch`` does this itself), and the client compares that with the md5 of the
  checkpoint it samples (``checkpoint_fingerprint``). vLLM has no such field; its attach still compares
  the path.

``check_context_length`` is the static check both run before any work: every prompt plus
``max_new_tokens`` must fit the server's context length (the server rejects the request otherwise).

While a launched server runs, SIGTERM to the stage (a task timeout, ``kill``) raises ``SystemExit`` in the
main thread instead of ending the process on the spot, so the server is stopped too rather than left
holding its GPUs.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.engine.backends.sglang_client import API_KEY_ENV as SGLANG_KEY_ENV
from components.engine.backends.sglang_client import auth_headers
from components.engine.backends.vllm_client import API_KEY_ENV as VLLM_KEY_ENV
from components.engine.config import GenerationConfig
from components.engine.server_env import ensure_interpreter
from components.ops.launch import (
    SGLANG,
    VLLM,
    LaunchSpecError,
    ServerKind,
    load_spec,
    server_command,
    with_isolated_merge,
)
from components.storage import dvc_md5

STOP_GRACE_S = 30.0
PR_SET_PDEATHSIG = 1  # linux/prctl.h


class SGLangServerError(RuntimeError):
    """The server (SGLang or vLLM; the name is older than the second) could not be started, did not become
    healthy, serves another model, or cannot fit."""


ServerError = SGLangServerError


@dataclass(frozen=True)
class ServerAPI:
    """What differs between the servers a stage launches: how to render them, where to ask."""

    label: str  # in messages
    kind: ServerKind
    health_path: str
    api_key_env: str  # the variable the client sends as its bearer token
    spec_field: str  # the GenerationConfig field that names the spec file


SERVERS = {
    "sglang": ServerAPI("SGLang", SGLANG, "/health_generate", SGLANG_KEY_ENV, "server_spec"),
    "vllm": ServerAPI("vLLM", VLLM, "/health", VLLM_KEY_ENV, "vllm_server_spec"),
}


def server_api(gen_cfg: GenerationConfig) -> ServerAPI:
    if gen_cfg.backend not in SERVERS:
        raise ServerError(f"generation.backend {gen_cfg.backend!r} is not a server ({', '.join(SERVERS)})")
    return SERVERS[gen_cfg.backend]


def spec_file(gen_cfg: GenerationConfig) -> Path:
    """The spec file the stage's server is launched from (the backend's own field)."""
    return Path(getattr(gen_cfg, server_api(gen_cfg).spec_field))


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def server_spec(
    gen_cfg: GenerationConfig, model_dir: Path | str, port: int, spec_path: Path | str | None = None
) -> dict[str, Any]:
    """The spec of a stage-launched server: the file, ``server_args`` overrides, this model, 127.0.0.1, and
    with ``generation.sglang_isolated_merge`` the EXPERIMENTAL plugin's settings (``with_isolated_merge``)."""
    api = server_api(gen_cfg)
    path = Path(spec_path or spec_file(gen_cfg))
    if not path.is_file():
        raise ServerError(f"{api.label} server spec {path} does not exist (generation.{api.spec_field})")
    spec = {**load_spec(path), **dict(gen_cfg.server_args)}
    spec.update(model_path=str(model_dir), host="127.0.0.1", port=port)
    if getattr(gen_cfg, "sglang_isolated_merge", False):
        try:
            spec = with_isolated_merge(spec)
        except LaunchSpecError as err:
            raise ServerError(f"generation.sglang_isolated_merge: {err}") from err
    return spec


def spec_context_length(gen_cfg: GenerationConfig, spec_path: Path | str | None = None) -> int | None:
    """The context length a launched server will have (``server_args`` first, then the spec file)."""
    key = "max_model_len" if gen_cfg.backend == "vllm" else "context_length"
    if key in gen_cfg.server_args:
        return int(gen_cfg.server_args[key])
    path = Path(spec_path or spec_file(gen_cfg))
    if not path.is_file():
        return None
    value = load_spec(path).get(key)
    return int(value) if value is not None else None


def check_context_length(
    context_length: int | None, prompt_tokens: int, max_new_tokens: int, where: str, server: str = "SGLang"
) -> None:
    """Raise unless the longest prompt plus ``max_new_tokens`` fits ``context_length`` (None: the model's
    own, unknown here, so nothing is checked)."""
    if context_length is None:
        return
    need = prompt_tokens + max_new_tokens
    if need > context_length or prompt_tokens >= context_length:
        raise ServerError(
            f"{where}: the longest prompt ({prompt_tokens} tokens) + generation.max_new_tokens "
            f"({max_new_tokens}) = {need} tokens exceed the {server} server's context length "
            f"({context_length}); raise it in the server spec (context_length in infra/sglang/server.yaml, "
            f"max_model_len in infra/vllm/server.yaml, or generation.server_args) or lower max_new_tokens"
        )


def _get(url: str, timeout_s: float = 5.0, key_env: str = SGLANG_KEY_ENV) -> tuple[int, bytes]:
    # the key the server was started with (--api-key): SGLang refuses everything but /health* without it,
    # vLLM everything under /v1
    request = urllib.request.Request(url, headers=auth_headers(key_env))
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _log_tail(log: Path | None, n: int = 30) -> str:
    if log is None or not log.exists():
        return "(no log)"
    lines = log.read_text(errors="replace").splitlines()
    return "\n".join(lines[-n:]) or "(empty log)"


def wait_healthy(
    url: str,
    timeout_s: float,
    proc: subprocess.Popen | None = None,
    log: Path | None = None,
    api: ServerAPI = SERVERS["sglang"],
) -> float:
    """Poll the server's health route until 200; returns the seconds waited. Fails at once if ``proc`` exits."""
    start = time.monotonic()
    delay = 0.2
    while time.monotonic() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise ServerError(
                f"{api.label} server exited with code {proc.returncode} before it was healthy; log tail:\n"
                f"{_log_tail(log)}"
            )
        try:
            status, _ = _get(f"{url}{api.health_path}", timeout_s=10.0, key_env=api.api_key_env)
            if status == 200:
                return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(delay)
        delay = min(delay * 1.5, 2.0)
    raise ServerError(
        f"{api.label} server at {url} not healthy after {timeout_s:.0f} s; log tail:\n{_log_tail(log)}"
    )


def served_model(url: str) -> str:
    """The ``model_path`` the server at ``url`` reports (``/get_model_info``)."""
    status, body = _get(f"{url}/get_model_info")
    if status != 200:
        raise ServerError(f"{url}/get_model_info answered HTTP {status}")
    return str(json.loads(body)["model_path"])


def server_context_length(url: str) -> int | None:
    """The context length the running server reports (``/server_info``), if it does."""
    try:
        status, body = _get(f"{url}/server_info")
    except (urllib.error.URLError, OSError):
        return None
    if status != 200:
        return None
    value = json.loads(body).get("context_length")
    return int(value) if value is not None else None


def vllm_model_info(url: str) -> tuple[str, int | None]:
    """``(model path, max_model_len)`` of the vLLM server at ``url`` (``/v1/models``: ``root``, the path it
    loaded, and its context length)."""
    status, body = _get(f"{url}/v1/models", key_env=VLLM_KEY_ENV)
    if status != 200:
        raise ServerError(f"{url}/v1/models answered HTTP {status}: {body[:200]!r}")
    models = json.loads(body).get("data") or []
    if len(models) != 1:
        raise ServerError(f"{url}/v1/models lists {len(models)} models, expected the one checkpoint")
    length = models[0].get("max_model_len")
    return str(models[0]["root"]), int(length) if length is not None else None


def checkpoint_fingerprint(model_dir: Path | str) -> str:
    """The DVC md5 of a checkpoint directory (``<hex>.dir``, what dvc.lock records for the stage output):
    the name an SGLang server is given for the weights it serves (``--weight-version``)."""
    return str(dvc_md5(model_dir)["md5"])


def served_weights(url: str) -> str:
    """The ``weight_version`` the SGLang server at ``url`` reports (``/get_model_info``; "default" unless it
    was started with ``--weight-version``)."""
    status, body = _get(f"{url}/get_model_info")
    if status != 200:
        raise ServerError(f"{url}/get_model_info answered HTTP {status}")
    return str(json.loads(body).get("weight_version"))


def check_vllm_runs(url: str, log: Path | None = None) -> None:
    """One one-token completion. vLLM answers ``/health`` before its engine has run a forward, so a model its
    kernels cannot run fails only on the first request, after which every request answers HTTP 500 (on AVX2,
    its CPU attention refuses head_dim 16: "Unsupported CPU attention configuration"); this fails the launch
    with the server's log instead."""
    status, body = _get(f"{url}/v1/models", key_env=VLLM_KEY_ENV)
    name = json.loads(body)["data"][0]["id"] if status == 200 else ""
    payload = json.dumps({"model": name, "prompt": [[0]], "max_tokens": 1}).encode()
    headers = {"Content-Type": "application/json", **auth_headers(VLLM_KEY_ENV)}
    request = urllib.request.Request(f"{url}/v1/completions", data=payload, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            if response.status == 200:
                return
            status = response.status
    except urllib.error.HTTPError as err:
        status = err.code
    raise ServerError(
        f"the vLLM server at {url} is healthy but cannot decode (a one-token completion answered HTTP "
        f"{status}); log tail:\n{_log_tail(log, 60)}"
    )


def model_of(url: str, api: ServerAPI) -> str:
    """The checkpoint the server at ``url`` loaded."""
    return vllm_model_info(url)[0] if api.kind is VLLM else served_model(url)


def _same_model(served: str, model_dir: Path | str) -> bool:
    try:
        return Path(served).resolve() == Path(model_dir).resolve()
    except OSError:
        return served == str(model_dir)


def stop(proc: subprocess.Popen, grace_s: float = STOP_GRACE_S) -> None:
    """SIGTERM the server's process group, then SIGKILL it if it has not exited after ``grace_s``."""
    if proc.poll() is not None:
        return
    try:
        os.killpg(proc.pid, signal.SIGTERM)
    except ProcessLookupError:
        return
    try:
        proc.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return
        proc.wait(timeout=grace_s)


@contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """In the main thread: SIGTERM raises SystemExit(143) (so ``finally`` blocks run) inside the block."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum: int, frame: Any) -> None:
        raise SystemExit(128 + signum)

    previous = signal.signal(signal.SIGTERM, _raise)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _terminate_with_parent() -> None:
    """In the child before exec: SIGTERM when the thread that started it ends (prctl PR_SET_PDEATHSIG)."""
    import ctypes  # lazy: only servers bound to their caller need libc

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextmanager
def launched(
    model_dir: Path | str,
    gen_cfg: GenerationConfig,
    log_dir: Path | str,
    spec_path: Path | str | None = None,
    env: dict[str, str] | None = None,
    bound_to_caller: bool = False,
) -> Iterator[str]:
    """Start a server for ``model_dir``, yield its URL once healthy and serving that model, always stop it.
    ``bound_to_caller``: the kernel also sends the server SIGTERM when the launching thread ends (Linux's
    parent-death signal), for callers that may be killed without unwinding (a Ray actor)."""
    api = server_api(gen_cfg)
    port = free_port()
    spec = server_spec(gen_cfg, model_dir, port, spec_path)
    if api.kind is SGLANG and Path(model_dir).is_dir():  # named by its weights: attachable (``attached``)
        spec["weight_version"] = checkpoint_fingerprint(model_dir)
    python = ensure_interpreter(spec)  # a locked environment of its own (vLLM): installed on first use
    try:
        argv = server_command(api.kind, spec, python)
    except LaunchSpecError as err:
        raise ServerError(f"{api.label} server spec: {err}") from err
    log_dir = Path(log_dir)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"{api.kind.name}-{Path(model_dir).parent.name or 'model'}-{port}.log"
    server_env = {**os.environ, **{k: str(v) for k, v in (spec.get("env") or {}).items()}, **(env or {})}
    url = f"http://127.0.0.1:{port}"
    with _sigterm_unwinds():
        with open(log, "ab") as out:
            proc = subprocess.Popen(
                argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                env=server_env,
                start_new_session=True,
                preexec_fn=_terminate_with_parent if bound_to_caller else None,
            )
        try:
            wait_healthy(url, gen_cfg.server_start_timeout_s, proc, log, api)
            served = model_of(url, api)
            if not _same_model(served, model_dir):
                raise ServerError(f"the server at {url} serves {served}, not {model_dir}")
            if api.kind is VLLM:
                check_vllm_runs(url, log)
            yield url
        finally:
            stop(proc)


@contextmanager
def attached(
    url: str, model_dir: Path | str, timeout_s: float = 30.0, api: ServerAPI = SERVERS["sglang"]
) -> Iterator[str]:
    """Use a server started elsewhere, after checking it is healthy and serves ``model_dir``."""
    url = url.rstrip("/")
    wait_healthy(url, timeout_s, api=api)
    if api.kind is SGLANG:
        served, wanted = served_weights(url), checkpoint_fingerprint(model_dir)
        if served != wanted:
            raise ServerError(
                f"the SGLang server at {url} serves weights {served!r} (its --weight-version), not "
                f"{wanted!r}, the DVC md5 of the checkpoint {model_dir} this stage samples; start it on this "
                f"checkpoint with --weight-version {wanted} (infra/k8s/sglang-server.yaml: NPR_SERVE_MD5) "
                "or use generation.server: launch"
            )
        yield url
        return
    served = model_of(url, api)
    if not _same_model(served, model_dir):
        raise ServerError(
            f"the {api.label} server at {url} serves {served}, not the checkpoint {model_dir} this stage samples; "
            "restart it on this checkpoint or use generation.server: launch"
        )
    yield url


@contextmanager
def serving(model_dir: Path | str, gen_cfg: GenerationConfig, log_dir: Path | str) -> Iterator[Any]:
    """A ``GenerationConfig`` whose ``server_url`` serves ``model_dir`` for the duration of the block."""
    if gen_cfg.server == "attach":
        with attached(
            gen_cfg.server_url, model_dir, gen_cfg.server_start_timeout_s, server_api(gen_cfg)
        ) as url:
            yield gen_cfg.model_copy(update={"server_url": url})
    else:
        with launched(model_dir, gen_cfg, log_dir) as url:
            yield gen_cfg.model_copy(update={"server_url": url})


def context_length_for(gen_cfg: GenerationConfig) -> int | None:
    """The context length requests will meet: the spec's for a launched server, the server's for attach."""
    if gen_cfg.server == "attach":
        url = gen_cfg.server_url.rstrip("/")
        return vllm_model_info(url)[1] if gen_cfg.backend == "vllm" else server_context_length(url)
    return spec_context_length(gen_cfg)


def server_label(gen_cfg: GenerationConfig) -> str:
    """The server's name in messages (``check_context_length``)."""
    return server_api(gen_cfg).label
