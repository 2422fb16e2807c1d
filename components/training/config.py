"""Config of the SFT and RL stages (owned by components/training)."""

from __future__ import annotations

from typing import Any, ClassVar, Literal, Protocol

from pydantic import BaseModel, Field, model_validator

from components.settings import ConfigError, StrictModel

PromptStyle = Literal["parallel", "sequential", "parallel_r1"]


class SFTStageConfig(StrictModel):
    """`parallel_warmup` (NPR-Beta) and `sequential_warmup` (SR-Beta)."""

    # The structure schema of the stage's traces; None = the pipeline's schema_name (a recipe's own
    # stages, Parallel-R1's, fix theirs).
    SCHEMA: ClassVar[str | None] = None

    init_from: str = "seed"  # an upstream stage name whose `model` output starts this stage
    mode: Literal["parallel", "sequential"] = "parallel"
    # Instruction the training prompts carry (render_prompt style); SR-Beta trains the same parallel-format
    # responses, so both warmups use the parallel instruction unless configured otherwise.
    prompt_style: PromptStyle = "parallel"
    lr: float = Field(1e-6, gt=0)
    min_lr: float = Field(5e-7, ge=0)
    weight_decay: float = Field(0.1, ge=0)
    warmup_ratio: float = Field(0.05, ge=0, le=1)
    scheduler: Literal["cosine", "constant", "linear"] = "cosine"
    epochs: int = Field(1, ge=1)
    max_steps: int | None = Field(None, ge=1)
    batch_size: int = Field(8, ge=1)
    grad_accum: int = Field(1, ge=1)
    max_length: int = Field(32768, ge=16)
    adam_betas: tuple[float, float] = (0.9, 0.95)
    grad_clip: float = Field(1.0, gt=0)
    save_every: int = Field(1000, ge=1)
    seed: int = Field(521, ge=0)
    # Passes per micro-batch over length-sorted slices of the step: same gradient, less padding (sft.py)
    length_splits: int = Field(1, ge=1)
    # Processes (one per GPU) for FSDP; > 1 makes `npr stage` relaunch itself under torchrun
    # (components.training.distributed). batch_size * grad_accum must be divisible by it.
    nproc_per_node: int = Field(1, ge=1)
    # Recompute each decoder layer's activations in the backward (keeps only layer inputs): what lets a
    # 32k-token sequence of a 4B model train on one GPU (components.training.memory counts both ways).
    gradient_checkpointing: bool = False


class RolloutServerSettings(StrictModel):
    """The stock server the ``vllm_server`` rollout launches for a CPU verl job (``plugins.vllm_rollout``)."""

    # the vLLM server's spec (the one distill and evaluate launch from; relative to the checkout)
    spec: str = "infra/vllm/server.yaml"
    # seconds a launch may take to serve its first completion (40-80 s on idle cores, minutes on busy ones)
    start_timeout_s: float = Field(1800.0, gt=0)


class VerlSettings(StrictModel):
    """Cluster-side settings of a verl run (`backend: verl`); the algorithm comes from the stage fields."""

    entry: Literal["main_ppo"] = "main_ppo"  # verl 0.9.1's own trainer (DAPO filter_groups included)
    # The device verl trains on: cuda, or cpu through the project's CPU platform plugin (gloo process
    # groups, a logical device slot per rank; components.training.verl.plugins.cpu_platform).
    device: Literal["cuda", "cpu"] = "cuda"
    nnodes: int = Field(1, ge=1)
    # Training ranks per node (GPUs; on cpu, processes each holding one logical device slot).
    n_gpus_per_node: int = Field(8, ge=1)
    # sglang / vllm: verl's own inference-server rollouts (CUDA); torch: the project's torch token server inside
    # the job (components.training.verl.plugins.torch_rollout); vllm_server: a stock vLLM server given the
    # trainer's weights after every update (plugins.vllm_rollout). The last two: hybrid mode, device: cpu.
    rollout_name: Literal["sglang", "vllm", "torch", "vllm_server"] = "sglang"
    rollout_server: RolloutServerSettings = RolloutServerSettings()
    rollout_tp: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    max_prompt_length: int = Field(2048, ge=16)
    micro_batch_size_per_gpu: int = Field(1, ge=1)
    # Sequences per forward of the log-prob passes (old/ref log-probs); verl requires it when
    # use_dynamic_bsz is false. None = micro_batch_size_per_gpu.
    log_prob_micro_batch_size_per_gpu: int | None = Field(None, ge=1)
    use_dynamic_bsz: bool = True
    max_token_len_per_gpu: int = Field(32768, ge=1024)
    ulysses_sp: int = Field(1, ge=1)
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"
    param_offload: bool = True
    optimizer_offload: bool = True
    gradient_checkpointing: bool = True
    # verl's packed (remove-padding) forward; None = the actor's choice: on for the stock actor (DAPO
    # stages), off for PAPO's NPR actor, whose 4D parallel mask verl would drop when packing.
    use_remove_padding: bool | None = None
    # TransferQueue's storage units (verl's default 8 is for clusters; each is a Ray actor, and on a
    # machine with few CPUs eight of them stalled the job).
    storage_units: int = Field(8, ge=1)
    # The dtype FSDP computes the actor in (mixed_precision.param_dtype; gradients reduce in fp32). bf16 is
    # verl's default for GPUs; the CPU jobs use fp32, where a batch summed in another order (verl orders a
    # step's samples by random uids) moves a step by rounding only, so a resumed job reproduces the
    # uninterrupted one (in bf16 the same step's gradient norm differed by 2%).
    param_dtype: Literal["bf16", "fp32"] = "bf16"
    # Helper processes of the job (verl's defaults, 8 each, are for GPU nodes with many cores): agent-loop
    # workers (rollout.agent.num_workers), reward-loop workers (reward.num_workers), dataloader workers
    # (data.dataloader_num_workers; 0 = in the trainer's process).
    agent_loop_workers: int = Field(8, ge=1)
    reward_workers: int = Field(8, ge=1)
    dataloader_workers: int = Field(8, ge=0)
    # Structural-filter stages: a step may replace at most this many batches of groups the filter emptied
    # (components.training.verl.plugins.replay), then it fails naming the filter.
    max_refill_batches: int = Field(4, ge=1)
    # Checkpoints verl keeps (trainer.max_actor_ckpt_to_keep; verl's default keeps every one).
    keep_checkpoints: int = Field(2, ge=1)
    total_epochs: int = Field(1, ge=1)
    # Where the job runs (components.training.verl.ray_cluster). None: the stage starts a Ray head on its own
    # node (one node; the stage's job holds that node's GPUs) and stops it afterwards. An address
    # (http://<head>:8265): the stage is submitted as a Ray job to that running cluster, which reproduces
    # it and pushes its outputs; the workers then read their inputs from `shared_dir`.
    ray_address: str | None = None
    # The address a head started by the stage binds its services to (one node: loopback).
    ray_head_host: str = "127.0.0.1"
    # Whether that head runs Ray's dashboard (the cluster's UI and job API). Off where nobody reads it, as in
    # the tiny profile's CPU jobs: it is about ten more processes and ~6 s more start per head on 2 cores.
    ray_dashboard: bool = True
    # A filesystem every Ray node mounts (inputs, checkpoints): required with ray_address or nnodes > 1.
    shared_dir: str | None = None


class RolloutCorrectionConfig(StrictModel):
    """PAPO's correction of tokens sampled after a re-prefilled merge (``components.training.papo``).

    A backend that merges branches by re-prefilling them (SGLang, verl's server manager) samples every token
    after the first multi-branch merge from a context the trainer does not reproduce; those tokens get the
    truncated importance weight ``min(exp(logp_trainer - logp_rollout), is_threshold)`` (verl's TIS with
    ``rollout_is_threshold`` = ``is_threshold``). Exact (shared-KV) merges are never reweighted.
    """

    post_merge_is: bool = True
    is_threshold: float = Field(2.0, ge=1.0)


class RLStageConfig(StrictModel):
    """`npr_zero` (DAPO), `papo_rl` (PAPO) and `sr_rl` (DAPO, sequential)."""

    # The structure schema of the stage's traces; None = the pipeline's schema_name.
    SCHEMA: ClassVar[str | None] = None

    init_from: str = "seed"
    # dapo: GRPO advantages + clip-higher loss + dynamic sampling; grpo: the same without dynamic sampling
    # (Parallel-R1's); papo: NPR's on-policy parallel objective.
    algorithm: Literal["dapo", "grpo", "papo"] = "dapo"
    # components.grading.rewards: stage1 / stage3 (NPR), accuracy / accuracy_parallel_interv (Parallel-R1)
    reward: Literal["stage1", "stage3", "accuracy", "accuracy_parallel_interv"] = "stage1"
    engine_mode: Literal["sequential", "parallel"] = "sequential"
    # How the local trainer's torch engine continues after a parallel block: shared_kv (exact) or
    # reprefill (the branches re-read as text, what an SGLang server does; its post-merge tokens then get
    # rollout_correction's weights). A verl job always re-prefills (its rollouts come from SGLang).
    merge_mode: Literal["shared_kv", "reprefill"] = "shared_kv"
    # Which instruction the prompt carries (prompts.parallel_instruction, .sequential_instruction or
    # .parallel_r1_instruction).
    prompt_style: PromptStyle = "parallel"
    # Drop rollouts whose parallel structure the canonical mask builder rejects (PAPO), counted not scored.
    structural_filter: bool = False
    backend: Literal["local", "verl"] = "local"
    steps: int = Field(100, ge=0)
    prompts_per_step: int = Field(32, ge=1)
    # Prompts per generation batch when dynamic sampling refills (verl data.gen_batch_size); None = prompts_per_step.
    gen_batch_prompts: int | None = Field(None, ge=1)
    group_size: int = Field(16, ge=1)
    # Optimizer steps per rollout batch (verl ppo_mini_batch); > 1 makes the DAPO clip act on later ones.
    mini_batches: int = Field(1, ge=1)
    # Rollouts per forward/backward inside a mini-batch, sorted by length to cut padding; the gradient is
    # the mini-batch's (verl's global_batch_info). None = the whole mini-batch in one forward.
    micro_batch_size: int | None = Field(None, ge=1)
    lr: float = Field(1e-6, gt=0)
    lr_scheduler: Literal["constant", "cosine"] = "constant"
    lr_warmup_steps: int = Field(0, ge=0)
    min_lr_ratio: float = Field(0.0, ge=0, le=1)
    adam_betas: tuple[float, float] = (0.9, 0.999)
    weight_decay: float = Field(0.1, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_ratio_low: float = Field(0.2, ge=0)
    clip_ratio_high: float = Field(0.28, ge=0)
    clip_ratio_c: float = Field(10.0, gt=1)
    loss_agg_mode: Literal["token-mean", "token-sum", "seq-mean-token-sum", "seq-mean-token-mean"] = (
        "token-mean"
    )
    # DAPO/GRPO only (verl's algorithm.norm_adv_by_std_in_grpo): divide group-centred rewards by the group's
    # std. Off (Dr. GRPO) keeps the advantage proportional to the reward gap, so a format-only difference
    # (valid-but-wrong vs invalid) is not inflated to the size of a correctness difference.
    norm_adv_by_std: bool = True
    dynamic_sampling: bool = True
    max_gen_batches: int = Field(10, ge=0)
    overlong_buffer_len: int = Field(0, ge=0)
    overlong_penalty_factor: float = Field(1.0, ge=0)
    max_new_tokens: int = Field(30000, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    eval_before_train: bool = True
    eval_every: int = Field(10, ge=1)
    eval_n: int = Field(200, ge=1)
    # Samples per held-out problem: rates are means over eval_n * eval_samples responses (one sample of 200
    # problems has a standard error of ~2.4 points at 15%, too coarse to compare two checkpoints).
    eval_samples: int = Field(1, ge=1)
    eval_temperature: float = Field(1.0, ge=0)
    eval_top_p: float = Field(1.0, gt=0, le=1)
    save_every: int = Field(20, ge=1)
    seed: int = Field(0, ge=0)
    rollout_correction: RolloutCorrectionConfig = RolloutCorrectionConfig()
    verl: VerlSettings = VerlSettings()


# ------------------------------------------------------------------------------------------ Parallel-R1
DifficultyName = Literal["easy", "medium", "hard"]
# Keys of the Parallel-R1 stage sections that the recipe sets (from parallel_r1.attention), never the profile.
_DERIVED_SFT = ("mode", "prompt_style")
_DERIVED_RL = ("engine_mode", "structural_filter", "prompt_style")


def _reject_derived(data: Any, keys: tuple[str, ...], section: str) -> Any:
    if isinstance(data, dict):
        given = sorted(k for k in keys if k in data)
        if given:
            raise ValueError(
                f"{section}: {', '.join(given)} are set from parallel_r1.attention (and the Parallel-R1 "
                "instruction), not in the section; remove them"
            )
    return data


class ParallelR1Config(StrictModel):
    """``parallel_r1``: what both Parallel-R1 stages and their evaluation share (arXiv 2509.07980).

    ``attention`` is the paper's variant, and the one key that chooses it (``PipelineConfig`` derives the
    stages' modes from it):

    ========================  ================================  ================================
    setting                   ``unseen``                        ``seen``
    ========================  ================================  ================================
    SFT mask / positions      canonical parallel (structure)    causal / ``arange``
    RL rollouts               fork at ``<Parallel>``, paths     one sequential stream
                              decoded concurrently
    RL loss mask / positions  canonical parallel                causal / ``arange``
    structural filter         on (no mask for a broken trace)   off (every rollout is scored)
    evaluation decoding       parallel (speedup measured)       sequential
    ========================  ================================  ================================

    Where this differs from the public code, on purpose: it samples the paths of a block independently in
    both variants and only the trainer's mask changes, so its "Seen" trains on contexts the rollouts never
    had (paths that saw their siblings); here decoding and training always share one visibility, so the
    log-probs the policy gradient uses are those the tokens were sampled with.

    ``paths``: branches per block (the paper: 2); ``max_path_tokens``: a path longer than this is closed with
    a forced ``</Path>`` (the paper's ``max_path_response_length``, 4096; None = only the token budget);
    ``max_new_tokens``: the token budget (summed over paths) of the evaluation's decoding of the Parallel-R1
    checkpoints (None = ``evaluate.generation.max_new_tokens``): its paths each solve the whole problem, so a
    trace is about twice an NPR trace of the same problem.
    """

    SCHEMA: ClassVar[str] = "parallel_r1"
    PROMPT_STYLE: ClassVar[str] = "parallel_r1"

    attention: Literal["unseen", "seen"] = "unseen"
    paths: int = Field(2, ge=2)
    max_path_tokens: int | None = Field(None, ge=2)
    max_new_tokens: int | None = Field(None, ge=1)

    @property
    def mode(self) -> Literal["parallel", "sequential"]:
        """Training and decoding mode of the variant: ``unseen`` -> parallel, ``seen`` -> sequential."""
        return "parallel" if self.attention == "unseen" else "sequential"

    def engine_settings(self) -> dict[str, Any]:
        """``GenerationConfig`` fields of the recipe's decoding: paths per block and the path cap (the RL
        stage's budget is its own ``max_new_tokens``; the evaluation's is ``evaluation_settings``)."""
        return {"paths": self.paths, "max_step_tokens": self.max_path_tokens}

    def evaluation_settings(self) -> dict[str, Any]:
        """``engine_settings`` plus the evaluation's token budget when ``max_new_tokens`` is set."""
        budget = {} if self.max_new_tokens is None else {"max_new_tokens": self.max_new_tokens}
        return {**self.engine_settings(), **budget}


class ProblemSourceConfig(StrictModel):
    """Where a Parallel-R1 stage's problems come from, and the quality floors they pass (the same Great
    Expectations suite as ``sample_orz``: ``components.data.quality``).

    ``source``: ``sample_orz`` (the pipeline's problems, train split, filtered to ``difficulties``; the tiny
    profile's synthetic ones carry a difficulty) or ``local`` (files under ``local_path``: the GPU profile's
    GSM8K-style cold-start set, or its DAPO-17k-style RL problems).
    """

    source: Literal["sample_orz", "local"] = "sample_orz"
    local_path: str = "data/pr1"
    # None = every difficulty (sources without levels, such as ORZ, have none)
    difficulties: list[DifficultyName] | None = None
    n: int | None = Field(None, ge=1)
    seed: int = Field(0, ge=0)
    min_problem_chars: int = Field(5, ge=1)
    max_problem_chars: int = Field(8000, ge=1)
    max_answer_chars: int = Field(200, ge=1)
    min_kept_fraction: float = Field(0.9, ge=0.0, le=1.0)


class PR1ColdStartConfig(SFTStageConfig):
    """``pr1_coldstart``: SFT on parallel trajectories of easy problems (Parallel-R1's cold start).

    The SFT settings are the warmups'; ``mode`` (from ``parallel_r1.attention``) and ``prompt_style``
    (``parallel_r1``) are set by ``PipelineConfig``, not here. ``data``: the problems the trajectories solve
    (tiny: rendered from the synthetic generator; GPU: a local GSM8K-style set with its trajectories).
    """

    SCHEMA: ClassVar[str | None] = ParallelR1Config.SCHEMA

    mode: Literal["parallel", "sequential"] = Field("parallel", exclude=True)
    prompt_style: PromptStyle = Field("parallel_r1", exclude=True)
    data: ProblemSourceConfig = ProblemSourceConfig(difficulties=["easy"])

    @model_validator(mode="before")
    @classmethod
    def _derived_keys(cls, data: Any) -> Any:
        return _reject_derived(data, _DERIVED_SFT, "pr1_coldstart")


class PR1RLConfig(RLStageConfig):
    """``pr1_rl``: GRPO on hard problems with ``accuracy`` or the alternating ``accuracy_parallel_interv``
    reward (Parallel-R1's Stage 1 / Stage 2). ``engine_mode`` and ``structural_filter`` follow
    ``parallel_r1.attention`` (set by ``PipelineConfig``) (unseen: native parallel rollouts, malformed ones filtered because no mask
    exists for them; seen: sequential rollouts, every one scored), ``prompt_style`` is ``parallel_r1``.
    ``problems``: the training problems (the held-out ones are ``sample_orz``'s test split).
    """

    SCHEMA: ClassVar[str | None] = ParallelR1Config.SCHEMA

    init_from: str = "pr1_coldstart"
    algorithm: Literal["grpo"] = "grpo"
    reward: Literal["accuracy", "accuracy_parallel_interv"] = "accuracy_parallel_interv"
    engine_mode: Literal["sequential", "parallel"] = Field("parallel", exclude=True)
    structural_filter: bool = Field(True, exclude=True)
    prompt_style: PromptStyle = Field("parallel_r1", exclude=True)
    dynamic_sampling: bool = False
    problems: ProblemSourceConfig = ProblemSourceConfig(difficulties=["medium", "hard"])

    @model_validator(mode="before")
    @classmethod
    def _derived_keys(cls, data: Any) -> Any:
        return _reject_derived(data, _DERIVED_RL, "pr1_rl")

    @model_validator(mode="after")
    def _no_dynamic_sampling(self) -> PR1RLConfig:
        if self.dynamic_sampling:
            raise ValueError("pr1_rl is GRPO (Parallel-R1): dynamic_sampling must be false")
        return self


class StageSections(Protocol):
    """How a stage's section is read off the pipeline config (components.config.PipelineConfig, a floor above
    this package): by the stage's name, and all sections of one type."""

    def section(self, stage: str) -> BaseModel | None: ...

    def sections(self, kind: type[RLStageConfig]) -> dict[str, RLStageConfig]: ...


def rl_section(cfg: StageSections, stage: str) -> RLStageConfig:
    """``stage``'s section, which must be an RL stage's (its type says so, whatever the stage is called);
    ConfigError naming the RL stages otherwise."""
    section = cfg.section(stage)
    if not isinstance(section, RLStageConfig):
        rl = ", ".join(cfg.sections(RLStageConfig))
        raise ConfigError(f"{stage!r} is not an RL stage; the RL stages are {rl}")
    return section
