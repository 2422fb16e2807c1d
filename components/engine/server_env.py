"""The locked environment a launched server runs in, installed on first use and recorded.

A server spec may name ``environment: <target>``: a ``[tool.npr.lock.<target>]`` table with a venv of its own
(infra/vllm/server.yaml: ``vllm``, ``.venv-vllm``). Its interpreter then runs the server, and a launch
installs the venv from its lock first when it is missing or was synced to another lock
(``components.envlock.install``, what ``make install-vllm`` runs). ``server_environment`` is what a stage
records next to its own environment (``provenance.server_environment``): the server venv against its lock.
"""

from __future__ import annotations

import logging
from typing import Any

from components import envlock
from components.engine.config import DecodeStageConfig

log = logging.getLogger(__name__)


def ensure_interpreter(spec: dict[str, Any]) -> str | None:
    """The python a spec's server runs with: its environment's (installed now if it is not its lock yet), or
    the spec's ``python`` (None: the renderer's default)."""
    name = spec.get("environment")
    if not name:
        return str(spec["python"]) if spec.get("python") else None
    if spec.get("python"):
        raise envlock.LockError(f"a server spec names either python or environment, not both ({name})")
    tgt = envlock.target(str(name))
    venv = envlock.venv_of(tgt)
    if venv is None:
        raise envlock.LockError(f"[tool.npr.lock.{name}] names no venv for the server to run in")
    if not envlock.is_installed(tgt):
        log.warning(
            "installing the %s server environment %s from %s (first use)", name, venv, tgt.output.name
        )
        envlock.install(tgt)
    return str(venv / "bin" / "python")


def server_environment(section: Any) -> dict[str, Any] | None:
    """For a decoding stage whose server runs in a locked environment of its own: that venv against its lock
    (``envlock.venv_environment``); None for any other stage."""
    if not isinstance(section, DecodeStageConfig) or not section.generation.served:
        return None
    from components.engine.serving import server_spec  # lazy: serving imports the HTTP clients

    spec = server_spec(section.generation, "-", 0)
    name = spec.get("environment")
    return envlock.venv_environment(envlock.target(str(name))) if name else None
