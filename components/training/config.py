"""Config of the SFT and RL stages (owned by components/training)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel


class SFTStageConfig(StrictModel):
    """`parallel_warmup` (NPR-Beta) and `sequential_warmup` (SR-Beta)."""

    init_from: str = "seed"  # an upstream stage name whose `model` output starts this stage
    mode: Literal["parallel", "sequential"] = "parallel"
    # Instruction the training prompts carry (render_prompt style); SR-Beta trains the same parallel-format
    # responses, so both warmups use the parallel instruction unless configured otherwise.
    prompt_style: Literal["parallel", "sequential"] = "parallel"
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


class VerlSettings(StrictModel):
    """Cluster-side settings of a verl run (`backend: verl`); the algorithm comes from the stage fields."""

    entry: Literal["main_ppo"] = "main_ppo"  # verl 0.9.1's own trainer (DAPO filter_groups included)
    nnodes: int = Field(1, ge=1)
    n_gpus_per_node: int = Field(8, ge=1)
    rollout_name: Literal["sglang", "vllm"] = "sglang"
    rollout_tp: int = Field(1, ge=1)
    gpu_memory_utilization: float = Field(0.5, gt=0, le=1)
    max_prompt_length: int = Field(2048, ge=16)
    train_prompt_mini_batch: int = Field(1, ge=1)  # prompts per optimizer step (x group_size responses)
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
    val_n: int = Field(8, ge=1)
    val_top_p: float = Field(0.7, gt=0, le=1)
    total_epochs: int = Field(1, ge=1)
    ray_address: str = "http://127.0.0.1:8265"


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

    init_from: str = "seed"
    algorithm: Literal["dapo", "papo"] = "dapo"
    reward: Literal["stage1", "stage3"] = "stage1"
    engine_mode: Literal["sequential", "parallel"] = "sequential"
    # How the local trainer's torch engine continues after a parallel block: shared_kv (exact) or
    # reprefill (the branches re-read as text, what an SGLang server does; its post-merge tokens then get
    # rollout_correction's weights). A verl job always re-prefills (its rollouts come from SGLang).
    merge_mode: Literal["shared_kv", "reprefill"] = "shared_kv"
    # Which instruction the prompt carries (prompts.parallel_instruction or prompts.sequential_instruction).
    prompt_style: Literal["parallel", "sequential"] = "parallel"
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
