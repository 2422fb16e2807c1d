"""Command lines for the GPU side, rendered from the specs in infra/ (so the specs are the one definition).

(infra/ray/job.yaml is rendered by ``components.training.verl.ray_cluster.submit_stage_job``.)

- ``sglang_server_command(spec)``: infra/sglang/server.yaml -> ``python -m sglang.launch_server ...``
  (``components.engine.serving`` starts it for a stage's checkpoint, waits for health, stops it); a
  server that listens beyond loopback must name ``api_key_env``, whose value becomes ``--api-key``
  (the key comes from the environment, a secret, never from the spec).

Nothing here imports sglang or ray: these run on the GPU image (infra/gpu/), not in the CPU environment.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import yaml

from components.errors import UserError

INFRA = Path("infra")
SGLANG_SPEC = INFRA / "sglang" / "server.yaml"
RAY_JOB_SPEC = INFRA / "ray" / "job.yaml"

# spec key -> sglang.launch_server flag (value flags); booleans become bare flags when true
SGLANG_FLAGS = {
    "model_path": "--model-path",
    "served_model_name": "--served-model-name",
    "host": "--host",
    "port": "--port",
    "tp_size": "--tp-size",
    "dp_size": "--dp-size",
    "dtype": "--dtype",
    "mem_fraction_static": "--mem-fraction-static",
    "context_length": "--context-length",
    "random_seed": "--random-seed",
    "attention_backend": "--attention-backend",
    "page_size": "--page-size",
}
SGLANG_SWITCHES = {
    "trust_remote_code": "--trust-remote-code",
    # per-request sampling_seed is honoured only in SGLang's deterministic mode (sampling_batch_info.py)
    "enable_deterministic_inference": "--enable-deterministic-inference",
    "disable_piecewise_cuda_graph": "--disable-piecewise-cuda-graph",
}
# where and with what it runs, not how: the image, SGLang's own interpreter (it cannot share verl's
# environment), the module to run, and environment variables for the server process
SGLANG_META = {"image", "python", "module", "env", "api_key_env"}  # the key is rendered apart
SGLANG_IGNORED = SGLANG_META
SGLANG_KEYS = frozenset(SGLANG_FLAGS) | frozenset(SGLANG_SWITCHES) | SGLANG_META
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# EXPERIMENTAL: a server with NPR's isolated-merge plugin (components.engine.backends.sglang_plugin) on: the
# environment flag the plugin checks, and the settings its hooks need (the triton backend's custom mask,
# one token per KV page, extends outside piecewise CUDA graphs).
ISOLATED_MERGE_ENV = "NPR_SGLANG_ISOLATED_MERGE"
ISOLATED_MERGE_SPEC = {"attention_backend": "triton", "page_size": 1, "disable_piecewise_cuda_graph": True}
SGLANG_API_KEY_ENV = "NPR_SGLANG_API_KEY"  # what the spec names and the client reads (sglang_client)


class LaunchSpecError(UserError, ValueError):
    """A spec in infra/ is missing a required key or has one the renderer does not know."""


def load_spec(path: Path | str) -> dict[str, Any]:
    data = yaml.safe_load(Path(path).read_text())
    if not isinstance(data, dict):
        raise LaunchSpecError(f"{path} must hold a mapping")
    return data


def with_isolated_merge(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with the isolated-merge plugin on: ``ISOLATED_MERGE_SPEC`` and ``ISOLATED_MERGE_ENV=1`` in its
    ``env``; a spec that sets one of those keys to another value is refused."""
    for key, value in ISOLATED_MERGE_SPEC.items():
        if spec.get(key) not in (None, value):
            raise LaunchSpecError(
                f"the isolated-merge plugin needs {key}: {value!r}, the spec sets {spec[key]!r}"
            )
    env = {**(spec.get("env") or {}), ISOLATED_MERGE_ENV: "1"}
    return {**spec, **ISOLATED_MERGE_SPEC, "env": env}


def sglang_server_command(
    spec: dict[str, Any], python: str | None = None, env: dict[str, str] | None = None
) -> list[str]:
    """argv of the SGLang server described by ``spec`` (keys of infra/sglang/server.yaml).

    The interpreter is ``python`` if given, else the spec's ``python`` (default ``python``); the module is
    the spec's ``module`` (default ``sglang.launch_server``; tests point it at their stand-in server).
    ``--api-key`` is the value of the environment variable ``spec["api_key_env"]`` (``env``, default
    ``os.environ``) when it is set; a server that listens beyond loopback without a key is refused.
    """
    unknown = set(spec) - SGLANG_KEYS
    if unknown:
        raise LaunchSpecError(f"unknown SGLang spec keys {sorted(unknown)}; known: {sorted(SGLANG_KEYS)}")
    for key in ("model_path", "port", "tp_size"):
        if key not in spec:
            raise LaunchSpecError(f"SGLang spec lacks {key!r}")
    interpreter = python or str(spec.get("python") or "python")
    argv = [interpreter, "-m", str(spec.get("module") or "sglang.launch_server")]
    for key, flag in SGLANG_FLAGS.items():
        if spec.get(key) is not None:
            argv += [flag, str(spec[key])]
    argv += [flag for key, flag in SGLANG_SWITCHES.items() if spec.get(key)]
    key_env = spec.get("api_key_env")
    key = (os.environ if env is None else env).get(str(key_env)) if key_env else None
    if key:
        return argv + ["--api-key", key]
    host = str(spec.get("host", "127.0.0.1"))  # SGLang's default host is loopback
    if host not in LOOPBACK:
        if not key_env:
            raise LaunchSpecError(
                f"an SGLang server on {host} must require an API key: set api_key_env (e.g. {SGLANG_API_KEY_ENV})"
            )
        raise LaunchSpecError(
            f"an SGLang server on {host} needs its API key: export {key_env} (on k8s: the npr-credentials secret)"
        )
    return argv  # loopback: only this machine can reach it; the key is used when it is set
