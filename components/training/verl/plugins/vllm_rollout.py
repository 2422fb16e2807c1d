"""verl's ``vllm_server`` rollout: a stock vLLM server behind verl's rollout interfaces, on CPU (``rollout.name:
vllm_server``).

verl 0.9.1's own vLLM rollout is CUDA-only at run time (CUDA IPC weight sync, GPU resources, sleep mode);
this one is the CPU shape of the same job, registered beside the torch rollout (``plugins.torch_rollout``)
and sharing its replica and trainer-side adapter:

- ``VLLMServerReplica`` (``RolloutReplicaRegistry``) starts one ``VLLMRolloutServer`` actor per replica on
  the node of its first training worker (hybrid mode), as ``TorchReplica`` does.
- ``VLLMRolloutServer`` launches a stock vLLM OpenAI server from the stage's server spec
  (``verl.rollout_server.spec``, infra/vllm/server.yaml: its own locked environment, 127.0.0.1, a fresh API key
  of the actor's when none is set) on the job's starting checkpoint (``components.engine.served_policy``), and
  answers verl's ``generate`` calls by ``/v1/completions`` token-id requests (``vllm_client``), with the
  torch server's request rules: the same ``max_new_tokens`` rule, and every draw seeded (the request's
  ``sampling_seed``, else ``request_seed``), so a job's rollouts repeat run to run on one vLLM version.
- The adapter (``TorchServerAdapter``, the rollout registry's ``(vllm_server, async)``) hands the trainer's
  weights to the actor after every update (verl's naive checkpoint-engine path); the actor loads them into the
  running server exactly: an untied copy served, a reload in place, a prefix-cache reset
  (``ServedPolicy.load``; why each: the module docstring there).

Log-probs are vLLM's raw ones (the model's distribution before temperature and truncation), what verl's
actor recomputes at temperature 1 (the launcher refuses another rollout temperature for this rollout).
What the server did is written to ``<work_dir>/replica-<rank>/stats.json`` after every update (start
seconds, each load's seconds, tokens generated and the seconds requests were in flight).

The server process is bound to the actor's (``bound_to_caller``): Ray ends actors without unwinding them.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import secrets
import time
from pathlib import Path
from typing import Any

import torch
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.replica import RolloutMode, RolloutReplicaRegistry, TokenOutput

from components.engine.backends.vllm_client import API_KEY_ENV, VLLMClient
from components.engine.config import GenerationConfig
from components.engine.served_policy import ServedPolicy
from components.training.verl.plugin_names import (
    SERVED_ROLLOUT,
    SERVED_SPEC_KEY,
    SERVED_START_TIMEOUT_KEY,
    SERVED_WORK_DIR_KEY,
)
from components.training.verl.plugins.torch_rollout import (
    ADAPTER_PATH,
    HostMemoryServerCalls,
    TorchReplica,
    max_new_tokens_of,
    request_seed,
)

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

ROLLOUT_NAME = SERVED_ROLLOUT


class VLLMRolloutServer(HostMemoryServerCalls):
    """One replica's vLLM server and the verl calls it answers (a Ray actor; see the module docstring)."""

    def __init__(
        self,
        config: Any,
        model_config: Any,
        rollout_mode: RolloutMode,
        replica_rank: int,
        node_rank: int = 0,
    ) -> None:
        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        custom = dict(self.config.custom or {})
        missing = [k for k in (SERVED_SPEC_KEY, SERVED_START_TIMEOUT_KEY, SERVED_WORK_DIR_KEY) if k not in custom]
        if missing:
            raise KeyError(f"rollout.custom lacks {missing}: the job was not rendered by the project's launcher")
        # the server and this actor's client share the key; a fresh one when the environment sets none
        os.environ.setdefault(API_KEY_ENV, secrets.token_urlsafe(24))
        gen_cfg = GenerationConfig(
            backend="vllm",
            merge_mode="reprefill",
            vllm_server_spec=str(custom[SERVED_SPEC_KEY]),
            server_start_timeout_s=float(custom[SERVED_START_TIMEOUT_KEY]),
        )
        self.work_dir = Path(custom[SERVED_WORK_DIR_KEY]) / f"replica-{replica_rank}-{node_rank}"
        self.policy = ServedPolicy(self.model_config.local_path, self.work_dir, gen_cfg)
        self.url = self.policy.start(bound_to_caller=True)
        logger.warning("vllm_server rollout: %s ready in %.1f s", self.url, self.policy.start_s)
        self.prompt_length = int(self.config.prompt_length)
        self.response_length = int(self.config.response_length)
        self.max_model_len = int(self.config.max_model_len or (self.prompt_length + self.response_length))
        self.seed = int(getattr(self.config, "seed", 0) or 0)
        self.global_steps: int | None = None
        self.weight_version = 0
        self._asked: dict[tuple, int] = {}  # (weight version, prompt, sampler) -> requests so far
        self._client: VLLMClient | None = None
        self._in_flight = 0
        self._busy_since: float | None = None
        self.stats_: dict[str, Any] = {
            "url": self.url,
            "start_s": self.policy.start_s,
            "load_s": [],
            "requests": 0,
            "tokens": 0,
            "busy_s": 0.0,
        }
        self._write_stats()

    # ----------------------------------------------------------------------------------------- serving
    def get_server_address(self) -> tuple[str, int]:
        """A unique key for verl's load balancer (verl calls this actor, which calls the server)."""
        return f"npr-vllm-{self.replica_rank}-{self.node_rank}", 0

    async def _http(self) -> VLLMClient:
        if self._client is None:  # made in the actor's event loop, which every call runs on
            self._client = await VLLMClient(self.url, timeout_s=600.0).__aenter__()
        return self._client

    async def generate(
        self,
        prompt_ids: Any,
        sampling_params: dict[str, Any],
        request_id: str,
        image_data: Any = None,
        video_data: Any = None,
        **kwargs: Any,
    ) -> TokenOutput:
        if image_data or video_data:
            raise ValueError("the vllm_server rollout serves text models only")
        prompt = [int(t) for t in (prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else prompt_ids)]
        params = dict(sampling_params)
        params["max_new_tokens"] = max_new_tokens_of(
            params, len(prompt), self.response_length, self.prompt_length, self.max_model_len
        )
        return_logprob = bool(params.pop("logprobs", False))
        if params.get("sampling_seed") is None:
            params["sampling_seed"] = request_seed(self.seed, self.global_steps, prompt, params, self._asked)
        if params["max_new_tokens"] == 0:
            ids, lps, reason = [], [], "length"
        else:
            client = await self._http()
            self._enter()
            try:
                ids, lps, reason, _ = await client(prompt, params)
            finally:
                self._leave()
            self.stats_["requests"] += 1
            self.stats_["tokens"] += len(ids)
        return TokenOutput(
            token_ids=ids,
            log_probs=lps if return_logprob else None,
            stop_reason=reason,
            extra_fields={"global_steps": self.global_steps},
        )

    def _enter(self) -> None:
        if self._in_flight == 0:
            self._busy_since = time.monotonic()
        self._in_flight += 1

    def _leave(self) -> None:
        self._in_flight -= 1
        if self._in_flight == 0 and self._busy_since is not None:
            self.stats_["busy_s"] += time.monotonic() - self._busy_since
            self._busy_since = None

    # ----------------------------------------------------------------------------------------- weights
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the trainer's weights (HF names) into the server; returns the new weight version."""
        while self._in_flight:
            await asyncio.sleep(0.01)  # verl syncs between steps; never reload under a request
        seconds = await self.policy.load(await self._http(), state)
        self.stats_["load_s"].append(seconds)
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        self._asked.clear()
        self._write_stats()
        logger.info("vllm_server rollout: weights v%d loaded in %.2f s", self.weight_version, seconds)
        return self.weight_version

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        """What the server has done (also in ``stats.json``)."""
        return {**self.stats_, "weight_version": self.weight_version, "global_steps": self.global_steps}

    def _write_stats(self) -> None:
        (self.work_dir / "stats.json").write_text(json.dumps(self.stats(), indent=2))


class VLLMServerReplica(TorchReplica):
    """A replica whose server is one ``VLLMRolloutServer`` actor (hybrid mode)."""

    server_class = VLLMRolloutServer


def register() -> None:
    """Make ``rollout.name: vllm_server`` resolvable in both of verl's rollout registries."""
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: VLLMServerReplica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


register()

__all__ = ["ROLLOUT_NAME", "VLLMRolloutServer", "VLLMServerReplica"]
