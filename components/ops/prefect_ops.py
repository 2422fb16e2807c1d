"""Running Prefect for the pipeline: a local server with its UI, the work pools, the deployments, workers.

``npr server`` = ``start_server``: starts ``prefect server start`` on HOST:PORT (UI and API on the same port),
waits for ``/api/health``, creates the ``cpu`` and ``gpu`` work pools and registers the deployments of
``prefect.yaml`` (``prefect deploy --all``), then stays in the foreground until Ctrl-C.
``npr worker --pool P`` = ``start_worker``: becomes ``prefect worker start --pool P``.

Work pools. Both are ``process`` pools here: a ``kubernetes`` pool needs the prefect-kubernetes package,
which the CPU environment does not carry. The ``gpu`` pool's template declares the same job variables as
the Kubernetes template shipped in infra/k8s/ (``image``, ``gpu_count``, ``env``), so the deployments in
prefect.yaml are identical for both; a process worker on a GPU machine ignores ``image``/``gpu_count``
(the machine *is* the environment), a Kubernetes worker turns them into the pod spec.

The servers and workers started here run in their own process group (session) so that stopping one also
stops what it spawned (uvicorn, flow-run subprocesses); stop workers before the server, since a worker
whose server is gone ignores SIGTERM.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from components.env import record_server, running_server_url, server_file
from components.ops.config import OrchestrationConfig

PREFECT_FILE = "prefect.yaml"
REPO_DIR_ENV = "NPR_REPO_DIR"  # where the flow code lives on a worker; prefect.yaml's pull step reads it
NIGHTLY_POOL_ENV = "NPR_NIGHTLY_POOL"  # resolved by `prefect deploy` into nightly-eval's work pool

QUIET_ENV = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DVC_NO_ANALYTICS": "1",
}


class PrefectOpsError(RuntimeError):
    """The Prefect server, a work pool, a deployment or a worker could not be brought up."""


def api_url(host: str, port: int) -> str:
    return f"http://{host}:{port}/api"


def prefect_bin() -> str:
    """The prefect executable of this environment (not whichever is first on PATH)."""
    local = Path(sys.executable).with_name("prefect")
    return str(local) if local.exists() else "prefect"


def _env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {**os.environ, **{k: v for k, v in QUIET_ENV.items() if k not in os.environ}}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return {**env, **(extra or {})}


# ----------------------------------------------------------------------------------------------------
# processes


def stop_process_group(proc: subprocess.Popen, timeout_s: float = 20.0) -> int | None:
    """SIGINT, then SIGTERM, then SIGKILL to the process group of ``proc``; returns its exit code."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGKILL):
        if proc.poll() is not None:
            break
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=timeout_s if sig != signal.SIGKILL else None)
        except subprocess.TimeoutExpired:
            continue
    with contextlib.suppress(ProcessLookupError):  # children that outlived the leader
        os.killpg(proc.pid, signal.SIGKILL)
    return proc.poll()


def wait_healthy(url: str, timeout_s: float, proc: subprocess.Popen | None = None) -> float:
    """Poll ``<api>/health`` until it answers true; returns the seconds waited."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if proc is not None and proc.poll() is not None:
            raise PrefectOpsError(f"prefect server exited with code {proc.returncode} before it was healthy")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if json.loads(response.read() or b"false") is True:
                    return time.monotonic() - start
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            pass
        time.sleep(0.5)
    raise PrefectOpsError(f"prefect server at {url} not healthy after {timeout_s:.0f} s")


def launch_server(
    host: str, port: int, env: dict[str, str] | None = None, log: Path | None = None
) -> subprocess.Popen:
    """Start ``prefect server start`` in its own session; the caller waits for health and stops it.

    The UI is told where its API is (``PREFECT_SERVER_UI_API_URL``): otherwise it calls port 4200 whatever
    ``--port`` says, and on any other port every page of the UI fails ("Oops. Something went wrong.").
    """
    out = open(log, "ab") if log else subprocess.DEVNULL  # noqa: SIM115 - owned by the child process
    ui = (
        {}
        if "PREFECT_SERVER_UI_API_URL" in os.environ
        else {"PREFECT_SERVER_UI_API_URL": api_url(host, port)}
    )
    return subprocess.Popen(
        [prefect_bin(), "server", "start", "--host", host, "--port", str(port)],
        env=_env({**ui, **(env or {})}),
        stdout=out,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )


def launch_worker(
    pool: str,
    url: str,
    root: Path,
    env: dict[str, str] | None = None,
    log: Path | None = None,
    stdout: int | None = subprocess.DEVNULL,
) -> subprocess.Popen:
    """Start ``prefect worker start --pool POOL`` in its own session, running flows from ``root``; its
    output goes to ``log``, else to ``stdout`` (None: this process's own, as `npr worker` shows it)."""
    out = open(log, "ab") if log else stdout  # noqa: SIM115 - owned by the child process
    extra = {"PREFECT_API_URL": url, REPO_DIR_ENV: str(Path(root).resolve()), **(env or {})}
    return subprocess.Popen(
        [prefect_bin(), "worker", "start", "--pool", pool],
        cwd=root,
        env=_env(extra),
        stdout=out,
        stderr=subprocess.STDOUT if log or stdout is not None else None,
        start_new_session=True,
    )


# ----------------------------------------------------------------------------------------------------
# work pools and deployments


def process_pool_template() -> dict[str, Any]:
    """Prefect's own base job template of a process pool."""
    from prefect.workers.process import ProcessWorker  # lazy: prefect

    return ProcessWorker.get_default_base_job_template()


def gpu_pool_template() -> dict[str, Any]:
    """The process template plus the GPU job variables of infra/k8s/gpu-pool-template.json."""
    template = copy.deepcopy(process_pool_template())
    template["variables"]["properties"].update(
        image={
            "type": "string",
            "title": "Image",
            "description": "GPU worker image (infra/gpu/Dockerfile); used by the Kubernetes pool, recorded here.",
        },
        gpu_count={
            "type": "integer",
            "minimum": 0,
            "default": 1,
            "title": "GPU count",
            "description": "GPUs per stage; the Kubernetes pool requests them as nvidia.com/gpu.",
        },
    )
    template["job_configuration"].update(image="{{ image }}", gpu_count="{{ gpu_count }}")
    return template


def ensure_work_pools(cfg: OrchestrationConfig, url: str) -> dict[str, str]:
    """Create (or update the templates of) the cpu and gpu work pools; returns {pool: action}."""
    from prefect.client.orchestration import get_client  # lazy: prefect
    from prefect.client.schemas.actions import WorkPoolCreate, WorkPoolUpdate  # lazy: prefect
    from prefect.exceptions import ObjectNotFound  # lazy: prefect
    from prefect.settings import PREFECT_API_URL, temporary_settings  # lazy: prefect

    wanted = {cfg.cpu_pool: process_pool_template(), cfg.gpu_pool: gpu_pool_template()}
    actions: dict[str, str] = {}
    with temporary_settings(updates={PREFECT_API_URL: url}), get_client(sync_client=True) as client:
        for name, template in wanted.items():
            try:
                client.read_work_pool(name)
            except ObjectNotFound:
                client.create_work_pool(WorkPoolCreate(name=name, type="process", base_job_template=template))
                actions[name] = "created"
            else:
                client.update_work_pool(name, WorkPoolUpdate(base_job_template=template))
                actions[name] = "updated"
    return actions


def register_deployments(cfg: OrchestrationConfig, url: str, root: Path) -> str:
    """``prefect deploy --all`` with prefect.yaml; the nightly pool comes from ``cfg.nightly_pool``."""
    nightly_pool = cfg.gpu_pool if cfg.nightly_pool == "gpu" else cfg.cpu_pool
    proc = subprocess.run(
        [prefect_bin(), "--no-prompt", "deploy", "--all", "--prefect-file", str(Path(root) / PREFECT_FILE)],
        cwd=root,
        env=_env({"PREFECT_API_URL": url, NIGHTLY_POOL_ENV: nightly_pool}),
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise PrefectOpsError(
            f"prefect deploy failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        )
    return proc.stdout


def register_all(cfg: OrchestrationConfig, url: str, root: Path) -> dict[str, str]:
    """Work pools first (deployments name them), then the deployments."""
    actions = ensure_work_pools(cfg, url)
    register_deployments(cfg, url, root)
    return actions


# ----------------------------------------------------------------------------------------------------
# the CLI's entry points (foreground)


class _Stop(Exception):
    """A termination signal reached `npr server`: stop the Prefect server it started, then exit."""


def _raise_stop(signum: int, _frame: Any) -> None:
    raise _Stop(signal.Signals(signum).name)


# What stops `npr server` / `npr worker`. SIGINT is handled explicitly too: a process started with SIGINT
# ignored (`cmd &` from a script: shells without job control start background commands so) gets no
# KeyboardInterrupt from Python, and Ctrl-C or `kill -INT` would then leave it running.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


def start_server(
    cfg: OrchestrationConfig, host: str = "127.0.0.1", port: int = 4200, register: bool = True
) -> None:
    """Start the server, wait until healthy, register pools and deployments, stay up until stopped.
    ``cfg``: the checkout's orchestration section (``components.config.load_orchestration``).

    The server runs in its own process group (so stopping it stops uvicorn and what it spawned); Ctrl-C
    (SIGINT), SIGTERM (``kill``, systemd, a container stop) and SIGHUP (the terminal closed) all stop that
    group before ``npr server`` exits. Only SIGKILL, which no process can catch, leaves it running. While it
    is healthy its API URL is recorded in PREFECT_HOME (``components.env.record_server``), so flows started
    by hand with the same PREFECT_HOME use it instead of a second writer on its database.
    """
    root = Path.cwd()
    url = api_url(host, port)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
    proc = launch_server(host, port)
    try:
        waited = wait_healthy(url, cfg.server_start_timeout_s, proc)
        record_server(url, os.getpid())
        print(
            f"Prefect server healthy after {waited:.1f} s; UI: http://{host}:{port}  API: {url}", flush=True
        )
        if register:
            actions = register_all(cfg, url, root)
            print(f"work pools: {actions}; deployments registered from {PREFECT_FILE}", flush=True)
        print(f"start a worker with: npr worker --pool {cfg.cpu_pool}", flush=True)
        proc.wait()
    except (KeyboardInterrupt, _Stop):
        print("stopping the Prefect server", flush=True)
    finally:
        # a second signal must not abort the stop half way (it escalates to SIGKILL on its own)
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        server_file().unlink(missing_ok=True)
        stop_process_group(proc)
        signal.signal(signal.SIGINT, interrupt)
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def start_worker(pool: str, cfg: OrchestrationConfig) -> int:
    """Run a ``prefect worker`` for ``pool`` (one of ``cfg``'s pools) until it exits or a signal stops it;
    returns its exit code (0 when a signal stopped it).

    The worker runs in its own process group, like the server: SIGINT (Ctrl-C), SIGTERM and SIGHUP to
    `npr worker` stop that group (SIGINT first, which the worker handles by shutting down, then SIGTERM,
    then SIGKILL; flow runs it started are in the group too). Its API: PREFECT_API_URL, else the running
    `npr server` recorded in PREFECT_HOME, else 127.0.0.1:4200.
    """
    root = Path.cwd().resolve()
    if pool not in (cfg.cpu_pool, cfg.gpu_pool):
        raise PrefectOpsError(
            f"unknown pool {pool!r}; this project's pools are {cfg.cpu_pool!r} and {cfg.gpu_pool!r}"
        )
    url = os.environ.get("PREFECT_API_URL") or running_server_url() or api_url("127.0.0.1", 4200)
    previous = {sig: signal.signal(sig, _raise_stop) for sig in STOP_SIGNALS}
    # flow code is pulled from $NPR_REPO_DIR (prefect.yaml's pull step): this checkout unless set (GPU image)
    repo_dir = {REPO_DIR_ENV: os.environ.get(REPO_DIR_ENV, str(root))}
    proc = launch_worker(pool, url, root, env=repo_dir, stdout=None)
    try:
        print(f"worker for pool {pool!r} on {url} (pid {proc.pid})", flush=True)
        return proc.wait()
    except (KeyboardInterrupt, _Stop):
        print(f"stopping the {pool!r} worker", flush=True)
    finally:
        interrupt = signal.signal(signal.SIGINT, signal.SIG_IGN)
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        stop_process_group(proc)
        signal.signal(signal.SIGINT, interrupt)
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return 0
