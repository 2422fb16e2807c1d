"""Config of models, tokenizers and the tiny seed stage (owned by components/models)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.settings import StrictModel


class TinyArchitecture(StrictModel):
    """A Qwen3 architecture small enough to train on 2 CPU cores in minutes."""

    hidden_size: int = Field(192, ge=8)
    intermediate_size: int = Field(512, ge=8)
    num_hidden_layers: int = Field(4, ge=1)
    num_attention_heads: int = Field(4, ge=1)
    num_key_value_heads: int = Field(2, ge=1)
    head_dim: int = Field(48, ge=4)
    max_position_embeddings: int = Field(512, ge=16)
    rope_theta: float = Field(10000.0, gt=0)
    tokenizer_vocab_size: int = Field(512, ge=300)
    tokenizer_corpus_size: int = Field(20000, ge=100)


class ModelArchitecture(StrictModel):
    """The shape of a hub model, as its config.json states it: what the memory planner
    (``components.training.memory``) computes with before the model is downloaded. When a stage's model
    directory exists, its config.json is read instead (and a test keeps the two in step)."""

    hidden_size: int = Field(ge=1)
    intermediate_size: int = Field(ge=1)
    num_hidden_layers: int = Field(ge=1)
    num_attention_heads: int = Field(ge=1)
    num_key_value_heads: int = Field(ge=1)
    head_dim: int = Field(ge=1)
    vocab_size: int = Field(ge=1)
    max_position_embeddings: int = Field(ge=1)
    tie_word_embeddings: bool = True


class ModelsConfig(StrictModel):
    """How the starting model is obtained and loaded."""

    base_model: str = "tiny"  # "tiny" = built by the seed stage; else a hub id or a local directory
    # sdpa takes the parallel 4D mask and needs no kernel download (flash-attention kernels are fetched from
    # the hub when the flash-attn package is absent; they also reject arbitrary masks)
    attn_implementation: Literal["sdpa", "eager"] = "sdpa"
    pad_embeddings_to_multiple_of: int = Field(64, ge=1)
    tiny: TinyArchitecture | None = None
    # Shape of a hub base_model for the memory planner (None for the tiny model, whose shape is `tiny`).
    architecture: ModelArchitecture | None = None


class SeedConfig(StrictModel):
    """The tiny instruct model's build recipe (``components.training.tiny_seed``) and stage `seed`'s measurement.

    The recipe (steps, batch, schedule, style mix) is what built the committed ``models/tiny-instruct`` and
    what stage `seed` runs when ``models.base_model`` is ``tiny`` (a from-scratch build; ``enabled: false``
    then saves the untrained model). When the stage materialises a checkpoint (the committed one, or a hub
    model) only ``eval_*`` and ``max_new_tokens`` are used.
    """

    enabled: bool = True
    steps: int = Field(400, ge=0)
    batch_size: int = Field(64, ge=1)
    lr: float = Field(2e-3, gt=0)
    warmup_steps: int = Field(30, ge=0)
    # After the warmup: hold ``lr`` (constant) or anneal it to ``min_lr`` by the last step (cosine/linear).
    scheduler: Literal["constant", "cosine", "linear"] = "constant"
    min_lr: float = Field(0.0, ge=0)
    parallel_fraction: float = Field(0.2, ge=0.0, le=1.0)
    mistake_fraction: float = Field(0.05, ge=0.0, le=1.0)
    # Difficulty mix of the generated SFT problems (synthetic task levels); held-out test problems are excluded.
    difficulty_weights: dict[str, float] = {"easy": 0.8, "medium": 0.1, "hard": 0.1}
    adam_betas: tuple[float, float] = (0.9, 0.98)
    weight_decay: float = Field(0.0, ge=0)
    grad_clip: float = Field(1.0, gt=0)
    max_length: int = Field(256, ge=16)
    # Mixed precision of the build's SFT on CPU: bfloat16 autocast over fp32 weights, grads and AdamW (the
    # same mechanism as run.autocast: components.training.precision.compute_autocast); null = float32.
    autocast: Literal["bfloat16"] | None = None
    save_every: int = Field(50, ge=1)
    # Passes per step over length-sorted slices of it: same gradient, less padding (training/sft.py)
    length_splits: int = Field(1, ge=1)
    # Held-out problems the stage measures its output on (the validation split when sample_orz has one,
    # else the test split); 0 = no measurement (a hub model the stage only materialises).
    eval_n: int = Field(200, ge=0)
    eval_temperature: float = Field(1.0, ge=0.0)
    eval_batch_size: int = Field(200, ge=1)
    max_new_tokens: int = Field(96, ge=1)
