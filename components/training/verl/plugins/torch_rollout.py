"""verl's ``torch`` rollout: the project's torch token server behind verl's rollout interfaces (``rollout.name: torch``).

verl 0.9.1's v1 trainer takes its rollouts from inference servers (SGLang, vLLM, TensorRT-LLM) through two
registries, both open for a new name:

- ``RolloutReplicaRegistry`` (``verl/workers/rollout/replica.py``): a *replica* launches the server actors
  and hands verl their handles. ``TorchReplica`` starts one ``TorchRolloutServer`` actor per replica on the
  node of its first training worker (hybrid mode: the replica's workers are the trainer's FSDP workers).
- the rollout registry (``verl/workers/rollout/base.py``: ``(name, "async") -> ServerAdapter``): the
  trainer-side adapter each hybrid worker holds. ``TorchServerAdapter.update_weights`` receives the
  trainer's weights after every step (verl's naive checkpoint-engine path) and pushes them to its
  replica's server, so every rollout is sampled from the policy being trained.

``TorchRolloutServer.generate`` answers verl's ``LLMServerClient`` the way ``SGLangHttpServer.generate``
does (the same ``max_new_tokens`` rule, ``logprobs`` flag and ``TokenOutput`` with ``global_steps`` in
``extra_fields``), with the semantics of ``components.engine.backends.torch_tokens.TorchTokenGenerator``
(SGLang's request semantics: causal prompt, stop ids, repetition penalty, temperature / top-k / top-p,
log-probs of the tempered distribution), with every draw seeded: by the request's ``sampling_seed`` or,
for a request without one, by a seed derived from the weight version, the prompt and how often it was
asked (``_request_seed``); so a job's rollouts repeat run to run and a resumed job's match. Concurrent requests are collected for a few milliseconds and
decoded as one batch (``generate_many``), as a server batches its running requests: verl's agent loops
send a step's rollouts at once, and the ``npr_parallel`` loop sends a block's branches at once.

The fork/merge decisions stay where they are for every backend: in the agent loop's
``SequenceController`` (``plugins.agent_loop``); the server only extends sequences. So a CPU run through
this rollout exercises the same agent loop, controller and async driver as a GPU run through SGLang.

Hybrid (colocated, synchronous) mode only: the standalone and colocated modes sync weights through a
checkpoint engine between separate processes, which this rollout does not implement (``launch_servers``
raises).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Generator
from typing import Any, ClassVar

import ray
import torch
from transformers import AutoModelForCausalLM
from verl.utils.config import omega_conf_to_dataclass
from verl.workers.config import HFModelConfig
from verl.workers.rollout import base as rollout_base
from verl.workers.rollout.base import BaseRollout
from verl.workers.rollout.replica import RolloutMode, RolloutReplica, RolloutReplicaRegistry, TokenOutput

from components.training.verl.plugin_names import TORCH_ROLLOUT
from components.training.verl.plugins.agent_loop import sample_seed

logger = logging.getLogger(__name__)
logger.setLevel(os.getenv("VERL_LOGGING_LEVEL", "WARN"))

ROLLOUT_NAME = TORCH_ROLLOUT
ADAPTER_PATH = f"{__name__}.TorchServerAdapter"
# How long the server waits for more concurrent requests before it decodes a batch (seconds).
BATCH_WINDOW_S = 0.02


def server_actor_name(replica_rank: int, node_rank: int = 0) -> str:
    """The Ray actor name of a replica's server (the adapter finds its server by it; the same for the torch
    and the ``vllm_server`` rollout: a job runs one of them)."""
    return f"npr_rollout_server_{replica_rank}_{node_rank}"


def max_new_tokens_of(
    sampling_params: dict[str, Any],
    prompt_len: int,
    response_length: int,
    prompt_length: int,
    max_model_len: int,
) -> int:
    """SGLang server's rule (``SGLangHttpServer.generate``): the request's ``max_new_tokens`` (or
    ``max_tokens``), else the response budget left by the prompt; clamped to the model's context."""
    possible = max_model_len - prompt_len - 1
    if possible < 0:
        raise ValueError(
            f"Prompt length ({prompt_len}) exceeds the model's maximum context length ({max_model_len})."
        )
    if "max_new_tokens" in sampling_params:
        wanted = int(sampling_params.pop("max_new_tokens"))
    elif "max_tokens" in sampling_params:
        wanted = int(sampling_params.pop("max_tokens"))
    else:
        wanted = min(response_length, prompt_length + response_length - prompt_len)
    return max(0, min(wanted, possible))


def hash_tokens(tokens: list[int]) -> str:
    """A short stable digest of a token sequence (part of a request's derived seed)."""
    return hashlib.sha256(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def request_seed(
    seed: int, global_steps: int | None, prompt: list[int], params: dict[str, Any], asked: dict[tuple, int]
) -> int:
    """A seed for a request that carries none (verl's single-turn loop sends none): the server's seed, the
    weight version, the prompt and sampler, and how many times this prompt was asked at this version
    (``asked``, the server's count, cleared at every weight update). So a step's rollouts are the same
    multiset of samples in every run, in whatever order the requests arrive, and a resumed job draws what
    the interrupted one would have."""
    key = (global_steps, tuple(prompt), params.get("temperature"), params.get("top_p"), params.get("top_k"))
    occurrence = asked.get(key, 0)
    asked[key] = occurrence + 1
    return sample_seed(seed, *key[:1], hash_tokens(prompt), *key[2:], occurrence)


class HostMemoryServerCalls:
    """The rest of verl's rollout-server calls, for a server that keeps its weights and KV cache in host memory
    for the whole job: there is no device memory to release or restore (the torch model on the CPU; vLLM's
    CPU platform, which has no sleep mode), and aborts belong to verl's asynchronous trainers (partial
    rollouts), which these rollouts do not serve. Shared by ``TorchRolloutServer`` and the vLLM server's proxy."""

    async def wake_up(self) -> None:
        return None

    async def sleep(self) -> None:
        return None

    async def clear_kv_cache(self) -> None:
        return None

    async def release_kv_cache(self) -> None:
        return None

    async def resume_kv_cache(self) -> None:
        return None

    async def abort_all_requests(self, reject_request: bool = False) -> None:
        return None

    async def resume_generation(self) -> None:
        return None

    async def start_profile(self, **kwargs: Any) -> None:
        return None

    async def stop_profile(self) -> None:
        return None


class TorchRolloutServer(HostMemoryServerCalls):
    """One replica's inference server on a torch model (a Ray actor; see the module docstring)."""

    def __init__(
        self,
        config: Any,
        model_config: Any,
        rollout_mode: RolloutMode,
        replica_rank: int,
        node_rank: int = 0,
    ) -> None:
        from components.engine.backends.torch_tokens import TorchTokenGenerator  # lazy: transformers

        self.config = omega_conf_to_dataclass(config)
        self.model_config = omega_conf_to_dataclass(model_config, dataclass_type=HFModelConfig)
        config = self.config
        self.rollout_mode = rollout_mode
        self.replica_rank = replica_rank
        self.node_rank = node_rank
        torch.set_num_threads(max(1, int(os.environ.get("OMP_NUM_THREADS", "1"))))
        attn = (self.model_config.override_config or {}).get("attn_implementation", "sdpa")
        self.model = AutoModelForCausalLM.from_pretrained(
            self.model_config.local_path, dtype=torch.float32, attn_implementation=attn
        )
        self.model.eval()
        eos = self.model.generation_config.eos_token_id
        if eos is None:
            eos = self.model_config.tokenizer.eos_token_id
        eos_ids = [int(e) for e in (eos if isinstance(eos, list) else [eos])]
        # SGLang's request semantics, but every draw is seeded: by the request's sampling_seed (the npr_parallel
        # agent loop seeds every extension), else by _request_seed; so rollouts repeat run to run
        self.generator = TorchTokenGenerator(
            self.model, eos_ids, random_seed=int(getattr(config, "seed", 0) or 0), seed_requests=True
        )
        self.prompt_length = int(config.prompt_length)
        self.response_length = int(config.response_length)
        self.max_model_len = int(config.max_model_len or (self.prompt_length + self.response_length))
        self.max_batch = max(1, int(config.max_num_seqs))
        self.global_steps: int | None = None
        self.weight_version = 0
        self._pending: list[tuple[list[int], dict[str, Any], asyncio.Future]] = []
        self._batcher: asyncio.Task | None = None
        self.seed = int(getattr(config, "seed", 0) or 0)
        self._asked: dict[tuple, int] = {}  # (weight version, prompt, sampler) -> requests so far
        self.batches = 0
        self.requests = 0

    # ----------------------------------------------------------------------------------------- serving
    def get_server_address(self) -> tuple[str, int]:
        """A unique key for verl's load balancer (this server speaks Ray, not HTTP)."""
        return f"npr-torch-{self.replica_rank}-{self.node_rank}", 0

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
            raise ValueError("the torch rollout serves text models only")
        prompt = [int(t) for t in (prompt_ids.tolist() if hasattr(prompt_ids, "tolist") else prompt_ids)]
        params = dict(sampling_params)
        params["max_new_tokens"] = max_new_tokens_of(
            params, len(prompt), self.response_length, self.prompt_length, self.max_model_len
        )
        return_logprob = bool(params.pop("logprobs", False))
        if params.get("sampling_seed") is None:
            params["sampling_seed"] = request_seed(self.seed, self.global_steps, prompt, params, self._asked)
        if params["max_new_tokens"] == 0:
            answer_ids, answer_lps, reason = [], [], "length"
        else:
            future = asyncio.get_running_loop().create_future()
            self._pending.append((prompt, params, future))
            self.requests += 1
            if self._batcher is None or self._batcher.done():
                self._batcher = asyncio.create_task(self._serve_batches())
            answer = await future
            answer_ids, answer_lps, reason = answer.token_ids, answer.log_probs, answer.stop_reason
        return TokenOutput(
            token_ids=list(answer_ids),
            log_probs=list(answer_lps) if return_logprob else None,
            stop_reason=reason,
            extra_fields={"global_steps": self.global_steps},
        )

    async def _serve_batches(self) -> None:
        while self._pending:
            await asyncio.sleep(BATCH_WINDOW_S)  # let the other concurrent requests arrive
            batch, self._pending = self._pending[: self.max_batch], self._pending[self.max_batch :]
            try:
                answers = await asyncio.to_thread(self.generator.generate_many, [(p, s) for p, s, _ in batch])
            except Exception as err:  # every waiting request gets the error, none hangs
                for _, _, future in batch:
                    if not future.done():
                        future.set_exception(err)
                continue
            self.batches += 1
            for (_, _, future), answer in zip(batch, answers, strict=True):
                if not future.done():
                    future.set_result(answer)

    # ----------------------------------------------------------------------------------------- weights
    async def update_weights(self, state: dict[str, torch.Tensor], global_steps: int | None = None) -> int:
        """Load the trainer's weights (HF names); returns the new weight version."""
        while self._pending or (self._batcher is not None and not self._batcher.done()):
            await asyncio.sleep(0.01)  # verl syncs between steps; never swap weights under a batch
        own = self.model.state_dict()
        unknown = sorted(set(state) - set(own))
        if unknown:
            raise KeyError(f"the trainer sent weights the rollout model does not have: {unknown[:5]}")
        with torch.no_grad():
            for name, tensor in state.items():
                own[name].copy_(tensor.to(own[name].dtype))
        if self.model.config.tie_word_embeddings:
            self.model.tie_weights()
        self.weight_version += 1
        if global_steps is not None:
            self.global_steps = global_steps
        self._asked.clear()
        return self.weight_version

    async def set_global_steps(self, global_steps: int) -> None:
        self.global_steps = global_steps

    def stats(self) -> dict[str, Any]:
        """What the server has done (tests read it)."""
        return {
            "requests": self.requests,
            "batches": self.batches,
            "weight_version": self.weight_version,
            "global_steps": self.global_steps,
            "pid": os.getpid(),
        }


class TorchReplica(RolloutReplica):
    """A replica whose server is one ``server_class`` actor (hybrid mode): ``TorchRolloutServer`` here, the
    vLLM server's proxy in ``plugins.vllm_rollout``."""

    server_class: ClassVar[type] = TorchRolloutServer

    async def launch_servers(self) -> None:
        if self.rollout_mode != RolloutMode.HYBRID:
            raise NotImplementedError(
                f"the project's rollouts run colocated with the trainer (hybrid mode), not {self.rollout_mode}: "
                "set actor_rollout_ref.hybrid_engine=true and trainer.v1.trainer_mode=sync"
            )
        node_id = await self.workers[0].__ray_call__.remote(
            lambda self: ray.get_runtime_context().get_node_id()
        )
        server = (
            ray.remote(self.server_class)
            .options(
                scheduling_strategy=ray.util.scheduling_strategies.NodeAffinitySchedulingStrategy(
                    node_id=node_id, soft=False
                ),
                name=server_actor_name(self.replica_rank),
                max_concurrency=self.max_concurrency,
                num_cpus=0,
            )
            .remote(
                config=self.config,
                model_config=self.model_config,
                rollout_mode=self.rollout_mode,
                replica_rank=self.replica_rank,
            )
        )
        self.servers = [server]
        host, port = await server.get_server_address.remote()
        self._server_handle = server
        self._server_address = f"{host}:{port}"


class TorchServerAdapter(BaseRollout):
    """The trainer side of the torch rollout (and of ``vllm_server``'s) in each hybrid worker: pushes the
    trainer's weights to the replica's server actor (``update_weights``); memory calls are no-ops on CPU."""

    def __init__(self, config: Any, model_config: Any, device_mesh: Any, replica_rank: int = -1) -> None:
        super().__init__(config, model_config, device_mesh)
        rank = int(os.environ.get("RANK", 0))
        world = (
            self.config.tensor_model_parallel_size
            * self.config.data_parallel_size
            * self.config.pipeline_model_parallel_size
        )
        self.replica_rank = rank // world if replica_rank == -1 else replica_rank
        self.rollout_rank = rank % world
        self._server = None

    def _server_actor(self) -> Any:
        if self._server is None:
            self._server = ray.get_actor(server_actor_name(self.replica_rank))
        return self._server

    async def resume(self, tags: list[str]) -> None:
        return None

    async def release(self) -> None:
        return None

    async def update_weights(
        self,
        weights: Generator[tuple[str, torch.Tensor], None, None],
        global_steps: int | None = None,
        wire_format: str = "named_tensors",
        **kwargs: Any,
    ) -> None:
        if wire_format != "named_tensors":
            raise NotImplementedError(f"the torch rollout receives full named tensors, not {wire_format!r}")
        if kwargs.get("peft_config") is not None:
            raise NotImplementedError("the torch rollout takes merged weights (no LoRA adapters)")
        start = time.perf_counter()
        # every rank iterates the generator: gathering a sharded tensor is a collective
        state = {name: tensor.detach().to("cpu", copy=True) for name, tensor in weights}
        if self.rollout_rank == 0:
            await self._server_actor().update_weights.remote(state, global_steps)
        logger.info("torch rollout: %d tensors synced in %.2fs", len(state), time.perf_counter() - start)


def register() -> None:
    """Make ``rollout.name: torch`` resolvable in both of verl's rollout registries."""
    RolloutReplicaRegistry.register(ROLLOUT_NAME, lambda: TorchReplica)
    rollout_base._ROLLOUT_REGISTRY[(ROLLOUT_NAME, "async")] = ADAPTER_PATH


register()

__all__ = [
    "ADAPTER_PATH",
    "ROLLOUT_NAME",
    "TorchReplica",
    "TorchRolloutServer",
    "TorchServerAdapter",
    "max_new_tokens_of",
    "request_seed",
    "server_actor_name",
]
