"""Process-wide defaults applied by the CLI before any library is imported: no telemetry, no surprise
network traffic, W&B offline unless a key is configured. Explicit user settings always win."""

from __future__ import annotations

import json
import os
import socket
import sys
import urllib.error
import urllib.request
from pathlib import Path

QUIET_DEFAULTS = {
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "120",
    "DVC_NO_ANALYTICS": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "HF_UPDATE_DOWNLOAD_COUNTS": "0",
    "TOKENIZERS_PARALLELISM": "false",
}


# Set by the pipeline flow for a stage that runs beside another, so the two share the cores (one thread
# each on 2 cores) instead of oversubscribing them; overrides run.torch_threads in that stage's process.
THREADS_ENV = "NPR_TORCH_THREADS"


def torch_threads(configured: int) -> int:
    """``configured`` (run.torch_threads), or the flow's share in ``NPR_TORCH_THREADS`` when set."""
    raw = os.environ.get(THREADS_ENV)
    if raw is None or raw == "":
        return configured
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"{THREADS_ENV}={raw!r}: expected a positive integer")
    return value


def hub_reachable(host: str = "huggingface.co", timeout_s: float = 1.5) -> bool:
    """A cheap check (DNS + TCP connect) used to decide HF offline mode when the user did not."""
    try:
        with socket.create_connection((host, 443), timeout=timeout_s):
            return True
    except OSError:
        return False


def hub_offline() -> bool:
    """True when HF_HUB_OFFLINE says so (the CLI sets it, components.env); when unset, probe the hub."""
    flag = os.environ.get("HF_HUB_OFFLINE")
    if flag is not None:
        return flag.strip().lower() in ("1", "true", "yes", "on")
    return not hub_reachable()


def apply_defaults(project_root: Path | None = None) -> dict[str, str]:
    """Set quiet defaults in os.environ (only where unset); returns what was set."""
    applied: dict[str, str] = {}
    for key, value in QUIET_DEFAULTS.items():
        if key not in os.environ:
            os.environ[key] = applied[key] = value
    if "WANDB_MODE" not in os.environ:
        os.environ["WANDB_MODE"] = applied["WANDB_MODE"] = (
            "online" if os.environ.get("WANDB_API_KEY") else "offline"
        )
    if "HF_HUB_OFFLINE" not in os.environ:
        offline = "0" if hub_reachable() else "1"
        os.environ["HF_HUB_OFFLINE"] = os.environ["HF_DATASETS_OFFLINE"] = applied["HF_HUB_OFFLINE"] = offline
    if not sys.stderr.isatty() and "HF_HUB_DISABLE_PROGRESS_BARS" not in os.environ:
        # transformers' and the hub's tqdm bars ("Loading weights", "Writing model shards") would add two
        # lines per model load to DVC/Prefect logs; components.progress reports the long steps there
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = applied["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    root = project_root or Path.cwd()
    if "PREFECT_HOME" not in os.environ:
        os.environ["PREFECT_HOME"] = applied["PREFECT_HOME"] = str(root / ".prefect")
    url = use_running_server()
    if url is not None:
        applied["PREFECT_API_URL"] = url
    return applied


# ----------------------------------------------------------------------------------------------------
# Prefect: one writer per database. `npr server` records its API URL in its PREFECT_HOME; a flow started by
# hand (`npr run`, `npr nightly run`, a script importing ``flows``) with the same PREFECT_HOME and no
# PREFECT_API_URL then talks to that server instead of starting an ephemeral one on the same SQLite file
# (two writers: "database is locked").

SERVER_FILE = "npr-server.json"


def prefect_home() -> Path:
    return Path(os.environ.get("PREFECT_HOME") or Path.home() / ".prefect")


def server_file(home: Path | None = None) -> Path:
    return (home or prefect_home()) / SERVER_FILE


def record_server(url: str, pid: int, home: Path | None = None) -> Path:
    """Written by `npr server` once its server is healthy; removed when it stops."""
    path = server_file(home)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"api_url": url, "pid": pid}), encoding="utf-8")
    return path


def running_server_url(home: Path | None = None, timeout_s: float = 1.0) -> str | None:
    """The API URL of the `npr server` recorded in ``home`` when it answers its health check, else None
    (no server, or a stale record of one that was killed)."""
    path = server_file(home)
    try:
        url = json.loads(path.read_text(encoding="utf-8"))["api_url"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=timeout_s) as response:
            return url if json.loads(response.read() or b"false") is True else None
    except (urllib.error.URLError, OSError, ValueError):
        return None


def use_running_server(home: Path | None = None) -> str | None:
    """Point this process's Prefect client at the running `npr server` (PREFECT_API_URL), unless the user
    chose an API already. Must run before ``prefect`` is imported (its settings are read at import)."""
    if os.environ.get("PREFECT_API_URL"):
        return None
    url = running_server_url(home)
    if url is not None:
        os.environ["PREFECT_API_URL"] = url
    return url


PREFECT_QUIET = (
    "DO_NOT_TRACK",
    "PREFECT_SERVER_ANALYTICS_ENABLED",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS",
)


def apply_prefect_defaults() -> None:
    """What a flow needs wherever it is started from (the CLI, a worker, a script importing ``flows``): no
    telemetry (an ephemeral server's heartbeat to Prefect logs an ERROR on every start offline), time for
    an ephemeral server to start on a busy 2-core machine (Prefect's 20 s are not always enough), and the
    running `npr server` when there is one."""
    for key in PREFECT_QUIET:
        os.environ.setdefault(key, QUIET_DEFAULTS[key])
    home = None
    if "PREFECT_HOME" not in os.environ and Path("dvc.yaml").exists():
        home = Path.cwd() / ".prefect"  # where the CLI's `npr server` keeps its database (apply_defaults)
    use_running_server(home)
