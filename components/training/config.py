"""Config of the SFT and RL stages (owned by components/training)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel


class SFTStageConfig(StrictModel):
    """`parallel_warmup` (NPR-Beta) and `sequential_warmup` (SR-Beta)."""

    init_from: str = "seed"  # an upstream stage name whose `model` output starts this stage
    mode: Literal["parallel", "sequential"] = "parallel"
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


class RLStageConfig(StrictModel):
    """`npr_zero` (DAPO), `papo_rl` (PAPO) and `sr_rl` (DAPO, sequential)."""

    init_from: str = "seed"
    algorithm: Literal["dapo", "papo"] = "dapo"
    reward: Literal["stage1", "stage3"] = "stage1"
    engine_mode: Literal["sequential", "parallel"] = "sequential"
    backend: Literal["local", "verl"] = "local"
    steps: int = Field(100, ge=0)
    prompts_per_step: int = Field(32, ge=1)
    group_size: int = Field(16, ge=1)
    lr: float = Field(1e-6, gt=0)
    weight_decay: float = Field(0.1, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    clip_ratio_low: float = Field(0.2, ge=0)
    clip_ratio_high: float = Field(0.28, ge=0)
    dynamic_sampling: bool = True
    max_gen_batches: int = Field(10, ge=0)
    overlong_buffer_len: int = Field(0, ge=0)
    overlong_penalty_factor: float = Field(1.0, ge=0)
    max_new_tokens: int = Field(30000, ge=1)
    temperature: float = Field(1.0, ge=0)
    top_p: float = Field(1.0, gt=0, le=1)
    eval_every: int = Field(10, ge=1)
    eval_n: int = Field(200, ge=1)
    save_every: int = Field(20, ge=1)
    seed: int = Field(0, ge=0)
