"""Command lines for the GPU side, rendered from the specs in infra/ (so the specs are the one definition).

(infra/ray/job.yaml is rendered by ``components.training.verl.ray_cluster.submit_stage_job``.)

- ``sglang_server_command(spec)``: infra/sglang/server.yaml -> ``python -m sglang.launch_server ...``;
  ``vllm_server_command(spec)``: infra/vllm/server.yaml -> ``python -m vllm.entrypoints.openai.api_server
  ...`` (``components.engine.serving`` starts either for a stage's checkpoint, waits for health, stops it);
  a server that listens beyond loopback must name ``api_key_env``, whose value becomes ``--api-key`` (the
  key comes from the environment, a secret, never from the spec). One renderer, one table per server
  (``ServerKind``): the keys a spec may hold and the flag each becomes.

Nothing here imports sglang, vllm or ray: they run in their own environments (infra/gpu/, .venv-vllm).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
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
    # the name of the weights it serves, reported by /model_info (components.engine.serving: the checkpoint's
    # DVC md5, which an attaching client checks)
    "weight_version": "--weight-version",
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
# spec key -> vLLM OpenAI server flag (vllm/engine/arg_utils.py, 0.31.0)
VLLM_FLAGS = {
    "model_path": "--model",
    "served_model_name": "--served-model-name",
    "host": "--host",
    "port": "--port",
    "tensor_parallel_size": "--tensor-parallel-size",
    "data_parallel_size": "--data-parallel-size",
    "dtype": "--dtype",
    "gpu_memory_utilization": "--gpu-memory-utilization",
    "max_model_len": "--max-model-len",
    "max_num_seqs": "--max-num-seqs",
    "seed": "--seed",
}
VLLM_SWITCHES = {
    "trust_remote_code": "--trust-remote-code",
    # eager mode: no torch.compile or graph capture at start (on CPU they cost minutes, gain nothing here)
    "enforce_eager": "--enforce-eager",
    "enable_prefix_caching": "--enable-prefix-caching",
    # usage.prompt_tokens_details.cached_tokens in every answer: how much of a prompt the prefix cache served
    "enable_prompt_tokens_details": "--enable-prompt-tokens-details",
}
# as SGLANG_META, plus the locked environment the interpreter belongs to (components.engine.server_env)
VLLM_META = SGLANG_META | {"environment"}
VLLM_KEYS = frozenset(VLLM_FLAGS) | frozenset(VLLM_SWITCHES) | VLLM_META
LOOPBACK = {"127.0.0.1", "localhost", "::1"}
# EXPERIMENTAL: a server with NPR's isolated-merge plugin (components.engine.backends.sglang_plugin) on: the
# environment flag the plugin checks, and the settings its hooks need (the triton backend's custom mask,
# one token per KV page, extends outside piecewise CUDA graphs).
ISOLATED_MERGE_ENV = "NPR_SGLANG_ISOLATED_MERGE"
ISOLATED_MERGE_SPEC = {"attention_backend": "triton", "page_size": 1, "disable_piecewise_cuda_graph": True}
SGLANG_API_KEY_ENV = "NPR_SGLANG_API_KEY"  # what the spec names and the client reads (sglang_client)


class LaunchSpecError(UserError, ValueError):
    """A spec in infra/ is missing a required key or has one the renderer does not know."""


@dataclass(frozen=True)
class ServerKind:
    """How one inference server's spec becomes its command line."""

    name: str
    module: str  # the default ``python -m`` entry (a spec's ``module`` replaces it: tests' stand-ins)
    flags: dict[str, str]
    switches: dict[str, str]
    keys: frozenset[str]
    required: tuple[str, ...]


SGLANG = ServerKind(
    "sglang",
    "sglang.launch_server",
    SGLANG_FLAGS,
    SGLANG_SWITCHES,
    SGLANG_KEYS,
    ("model_path", "port", "tp_size"),
)
VLLM = ServerKind(
    "vllm", "vllm.entrypoints.openai.api_server", VLLM_FLAGS, VLLM_SWITCHES, VLLM_KEYS, ("model_path", "port")
)
SERVER_KINDS = {kind.name: kind for kind in (SGLANG, VLLM)}


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
    """argv of the SGLang server described by ``spec`` (keys of infra/sglang/server.yaml; ``server_command``)."""
    return server_command(SGLANG, spec, python, env)


def vllm_server_command(
    spec: dict[str, Any], python: str | None = None, env: dict[str, str] | None = None
) -> list[str]:
    """argv of the vLLM OpenAI server described by ``spec`` (keys of infra/vllm/server.yaml)."""
    return server_command(VLLM, spec, python, env)


def server_command(
    kind: ServerKind, spec: dict[str, Any], python: str | None = None, env: dict[str, str] | None = None
) -> list[str]:
    """argv of the ``kind`` server described by ``spec``.

    The interpreter is ``python`` if given, else the spec's ``python`` (default ``python``); the module is
    the spec's ``module`` (default ``kind.module``; tests point it at their stand-in server).
    ``--api-key`` is the value of the environment variable ``spec["api_key_env"]`` (``env``, default
    ``os.environ``) when it is set; a server that listens beyond loopback without a key is refused.
    """
    unknown = set(spec) - kind.keys
    if unknown:
        raise LaunchSpecError(f"unknown {kind.name} spec keys {sorted(unknown)}; known: {sorted(kind.keys)}")
    for key in kind.required:
        if key not in spec:
            raise LaunchSpecError(f"{kind.name} spec lacks {key!r}")
    interpreter = python or str(spec.get("python") or "python")
    argv = [interpreter, "-m", str(spec.get("module") or kind.module)]
    for key, flag in kind.flags.items():
        if spec.get(key) is not None:
            argv += [flag, str(spec[key])]
    argv += [flag for key, flag in kind.switches.items() if spec.get(key)]
    key_env = spec.get("api_key_env")
    key = (os.environ if env is None else env).get(str(key_env)) if key_env else None
    if key:
        # one token: a key beginning with "-" (secrets.token_urlsafe gives one in 64) would otherwise be read
        # by the server's argparse as a flag ("--api-key: expected at least one argument")
        return argv + [f"--api-key={key}"]
    host = str(
        spec.get("host", "127.0.0.1")
    )  # both servers' default host here is loopback (set by the stage)
    if host not in LOOPBACK:
        if not key_env:
            raise LaunchSpecError(
                f"a {kind.name} server on {host} must require an API key: set api_key_env (e.g. {SGLANG_API_KEY_ENV})"
            )
        raise LaunchSpecError(
            f"a {kind.name} server on {host} needs its API key: export {key_env} (on k8s: the npr-credentials secret)"
        )
    return argv  # loopback: only this machine can reach it; the key is used when it is set
