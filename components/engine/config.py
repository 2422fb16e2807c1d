"""Config of generation, distillation and rejection filtering (owned by components/engine)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import Field, model_validator

from components.ops.launch import SGLANG_KEYS, VLLM_KEYS
from components.settings import StrictModel

# the backends that decode on an inference server (components.engine.serving starts or attaches it)
SERVER_BACKENDS = ("sglang", "vllm")


class GenerationConfig(StrictModel):
    """Sampling settings shared by every engine backend.

    ``mode="parallel"`` makes the engine (every backend: the decisions are ``components.engine.controller``'s)
    fork at the schema's trigger, ``</guideline>`` (one branch per plan, at most ``max_branches``, nesting at
    most ``max_depth``; a schema whose fork rule has a fixed number of branches, Parallel-R1, forks at its
    trigger into ``paths`` of them); ``"sequential"`` decodes one stream with plain causal visibility.
    ``temperature=0`` is greedy. ``top_k=-1`` disables top-k.

    Budgets: ``max_new_tokens`` bounds the tokens generated across ALL branches of a response (a fork is
    refused unless every branch can write ``min_step_tokens`` content tokens plus its tags, and the
    ``<takeaway>``); ``kv_budget_tokens`` bounds the KV entries one sequence may hold (prompt + response);
    a fork that would cross it is refused and a sequence that reaches it finishes with reason
    ``kv_budget`` (in the torch engine's ``reprefill`` mode the hidden branch slots are not counted).
    ``max_step_tokens`` closes a runaway branch with a forced ``</step>``. ``step_repetition_penalty``
    applies inside steps; SGLang returns the log-probs of the penalised distribution, the torch engine
    those of the model's own.

    Backends (docs/architecture.md "Engine"): ``torch`` decodes in this process; ``sglang`` sends the
    controller's requests to an SGLang server's native ``/generate`` API, ``vllm`` to a vLLM server's
    ``/v1/completions`` (token ids in, sampled-token log-probs out; launched from ``vllm_server_spec`` in its
    own locked environment), at most ``batch_size`` in flight.
    ``merge_mode`` is how a merged block is continued: ``shared_kv`` (the torch engine only: exact) or
    ``reprefill`` (the branches re-read as sequential text; the only mode a stock server can do, and what
    the torch engine does on request to measure it). With ``server: launch`` the stage starts a server for
    the checkpoint it samples from ``server_spec`` and stops it afterwards; ``attach`` uses the server
    already running at ``server_url`` (it must serve that checkpoint).

    ``sglang_isolated_merge`` (EXPERIMENTAL, off by default; ``backend: sglang`` with ``server: launch``): the
    launched server runs with NPR's isolated-merge plugin on (components/engine/backends/sglang_plugin.py) and
    parallel-mode requests carry their response start, so the server reads a merge's branches with the
    trainer's mask and positions instead of re-reading them as sequential text. Until a GPU run shows it
    exact, the generations still record ``merge_mode: reprefill``.
    """

    mode: Literal["sequential", "parallel"] = "sequential"
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    top_k: int = Field(-1, ge=-1)
    max_new_tokens: int = Field(30000, ge=1)
    max_branches: int = Field(5, ge=1)
    # Branches of a fork rule with a fixed number of unlabelled branches (Parallel-R1's paths); None = the
    # schema's number (components.structure.ForkRule.branches). A plan-labelled schema rejects it.
    paths: int | None = Field(None, ge=1)
    max_depth: int = Field(1, ge=1)
    step_repetition_penalty: float = Field(1.02, gt=0)
    min_step_tokens: int = Field(1, ge=1)
    max_step_tokens: int | None = Field(None, ge=2)
    kv_budget_tokens: int | None = Field(None, ge=1)
    batch_size: int = Field(64, ge=1)
    seed: int = Field(0, ge=0)
    backend: Literal["torch", "sglang", "vllm"] = "torch"
    merge_mode: Literal["shared_kv", "reprefill"] = "shared_kv"
    # server backends only: the server (launched per checkpoint from its spec, or attached), a per-request
    # timeout and how long a launched server may take to become healthy.
    server: Literal["launch", "attach"] = "launch"
    server_spec: str = "infra/sglang/server.yaml"
    vllm_server_spec: str = "infra/vllm/server.yaml"
    server_url: str = "http://127.0.0.1:30000"
    # keys of the server spec overridden for this stage's launched server (e.g. {dp_size: 1})
    server_args: dict[str, int | float | bool | str] = {}
    request_timeout_s: float = Field(600.0, gt=0)
    server_start_timeout_s: float = Field(900.0, gt=0)
    sglang_isolated_merge: bool = False

    @property
    def served(self) -> bool:
        """Whether an inference server decodes (the stage launches or attaches it), not this process."""
        return self.backend in SERVER_BACKENDS

    @model_validator(mode="after")
    def _merge_mode_fits_backend(self) -> GenerationConfig:
        keys = VLLM_KEYS if self.backend == "vllm" else SGLANG_KEYS
        settable = keys - {"model_path", "host", "port"}
        unknown = sorted(set(self.server_args) - settable)
        if unknown:
            raise ValueError(
                f"server_args {unknown} are not keys a launched {self.backend} server takes (model_path, host "
                f"and port are set by the stage); known: {sorted(settable)}"
            )
        if self.served and self.merge_mode == "shared_kv":
            raise ValueError(
                f"merge_mode 'shared_kv' needs the torch backend: {self.backend}'s API has no parallel "
                "mask or positions, so a merge re-reads the branches (merge_mode: reprefill); set "
                "generation.merge_mode to reprefill or generation.backend to torch"
            )
        if self.sglang_isolated_merge and (self.backend != "sglang" or self.server != "launch"):
            raise ValueError(
                "sglang_isolated_merge needs backend 'sglang' with server 'launch' (the stage starts the server "
                f"with the plugin on); got backend {self.backend!r}, server {self.server!r}"
            )
        return self


class DecodeStageConfig(StrictModel):
    """The section of a stage that decodes with the engine (``distill``, ``evaluate``): each declares its own
    ``generation`` (its defaults differ). What depends on decoding (the memory planner) dispatches on this
    type instead of naming the stages."""

    if TYPE_CHECKING:  # declared by each subclass, with its own default; here only for the type checker
        generation: GenerationConfig


class DistillConfig(DecodeStageConfig):
    """Stage `distill`: K samples per problem from NPR-Zero."""

    init_from: str = "npr_zero"
    k: int = Field(8, ge=1)
    # The bound: at most this many train problems (file order) are sampled (None = all).
    n_problems: int | None = Field(None, ge=1)
    # Stop once this many problems have a trajectory reject_filter accepts (its rule, its section), so the
    # warmups get the same amount of data however NPR-Zero trained; None = sample all n_problems. A bound
    # reached first is reported as the shortfall.
    target_accepted: int | None = Field(None, ge=1)
    shard_size: int = Field(1024, ge=1)
    generation: GenerationConfig = GenerationConfig()
