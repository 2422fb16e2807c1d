"""Process-wide defaults applied by the CLI before any library is imported: no telemetry, no surprise
network traffic, W&B offline unless a key is configured. Explicit user settings always win."""

from __future__ import annotations

import os
import socket
import sys
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
    return applied
