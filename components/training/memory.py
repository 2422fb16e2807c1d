"""Memory plans: what each stage holds on a GPU, estimated from the model's shape before any work starts.

A plan is a list of phases (an RL stage rolls out, then updates; verl's actor and its SGLang rollout take
turns on the same GPUs), each a sum of named terms (weights, optimizer, activations, KV cache, logits,
masks) per GPU. ``check_stage`` raises ``MemoryPlanError`` when a phase does not fit the GPU, naming the
setting that would make it fit; ``npr config check`` runs it for every stage against the declared GPUs
(``orchestration.gpu``), and a stage runs it against the device it got before loading anything.

Where the numbers come from (tests/unit/training/test_memory.py measures them on the tiny model, CPU):

- parameters, KV bytes per token (2 x layers x kv_heads x head_dim x dtype bytes): exact, from the shape;
- weights/gradients/optimizer: fp32 run 4 + 4 + 8 bytes per parameter; bf16 run 2 + 4 (master) + 4 (fp32
  gradient) + 8 (moments) (``components.training.precision``); FSDP divides the fp32 state by the ranks and
  adds the bf16 layers it gathers;
- activations per token per decoder layer: what transformers' Qwen3 layer keeps for its backward, counted
  tensor by tensor (``layer_activation_bytes``: norms keep fp32 copies, a mask makes sdpa read keys and
  values repeated to every query head and a float copy of the mask per layer, L x L per row); with gradient
  checkpointing a layer keeps only its input and one layer is recomputed at a time;
- verl's actor: during its update the whole sharded fp32 state (weights, gradients, AdamW moments) whatever
  the offload settings, since verl's train-mode switch loads what is offloaded for the update
  (``verl_train_mode_loads``); during the rollout only what is not offloaded;
- logits: the trainers' chunked scorer (``components.training.token_logprobs``) holds one chunk of
  ``(C, V)`` logits; the torch engine holds one row of logits per sequence; verl's stock actor holds its
  micro-batch's ``(T, V)`` logits plus an fp32 working copy;
- the torch engine's KV cache grows with what is generated, doubling when full; a plan assumes the worst
  case, every sequence reaching ``prompt + max_new_tokens`` in a buffer twice that size. SGLang (distill, verl rollouts) preallocates a KV pool in the
  memory fraction it is given; its plan checks that the pool holds at least one full-length sequence.

Prompt lengths: an RL stage's prompts are bounded by its ``verl.max_prompt_length`` (verl's
``data.max_prompt_length``, whose ``truncation: error`` refuses longer ones); distill and evaluate use
NPR-Zero's bound (``prompt_bound``).
"""

from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

import torch
import yaml
from pydantic import BaseModel

from components.engine.config import DecodeStageConfig, GenerationConfig
from components.models.config import ModelsConfig, SeedConfig
from components.ops.config import GpuSpec, OrchestrationConfig
from components.settings import RunConfig
from components.structure.merge import MergeSemantics
from components.training.config import RLStageConfig, SFTStageConfig, VerlSettings
from components.training.token_logprobs import DEFAULT_CHUNK_TOKENS

SectionT = TypeVar("SectionT", bound=BaseModel)
GIB = 2**30
DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
DEFAULT_SGLANG_SPEC = "infra/sglang/server.yaml"


class PlanConfig(Protocol):
    """What a memory plan reads of the pipeline's config. That is components.config.PipelineConfig, which
    sits a floor above this package (it assembles this package's sections), so it is named here by what a
    plan uses: the stage's own section (``section``), the run's dtype and device, the model, the merge
    semantics, the declared GPU and NPR-Zero's prompt bound (distill's and evaluate's)."""

    @property
    def run(self) -> RunConfig: ...

    @property
    def models(self) -> ModelsConfig: ...

    @property
    def merge_semantics(self) -> MergeSemantics: ...

    @property
    def orchestration(self) -> OrchestrationConfig: ...

    @property
    def npr_zero(self) -> RLStageConfig: ...

    def section(self, stage: str) -> BaseModel | None: ...

    def sections(self, kind: type[SectionT]) -> dict[str, SectionT]: ...


@dataclass(frozen=True)
class PlanContext:
    """What every stage's plan shares, read off the profile once (``plan_context``): the stage functions below
    take it with their own section, never the whole config."""

    dtype: str  # run.dtype: the compute dtype of local work
    device: str  # run.device: ``cuda``/``auto`` plan local work on the GPU, ``cpu`` holds no device memory
    models: ModelsConfig  # the model's shape (``model_shape``) and whether the seed trains one (tiny)
    merge_semantics: MergeSemantics  # a reread layout's extra tokens in parallel rows
    gpu: GpuSpec  # the GPU planned against: orchestration.gpu, or the one a stage got / --gpu asked for
    default_prompt_bound: int  # NPR-Zero's verl.max_prompt_length: distill and evaluate prompt the same way


def plan_context(cfg: PlanConfig, gpu: GpuSpec | None = None) -> PlanContext:
    """``cfg``'s shared planning settings, against ``gpu`` (default ``orchestration.gpu``)."""
    return PlanContext(
        dtype=cfg.run.dtype,
        device=cfg.run.device,
        models=cfg.models,
        merge_semantics=cfg.merge_semantics,
        gpu=gpu or cfg.orchestration.gpu,
        default_prompt_bound=cfg.npr_zero.verl.max_prompt_length,
    )


# A stage's plan follows its section's type (components.config's stage table), not a list of names: the
# section is looked up once (``cfg.section``) and dispatched on.
def _uses_verl(section: BaseModel | None) -> bool:
    return isinstance(section, RLStageConfig) and section.backend == "verl"


def _serves_with_sglang(section: BaseModel | None) -> bool:
    return isinstance(section, DecodeStageConfig) and section.generation.backend == "sglang"


class MemoryPlanError(ValueError):
    """A stage's memory plan does not fit its GPU; the message names the setting to change."""


# ----------------------------------------------------------------------------------------- model shape
@dataclass(frozen=True)
class ModelShape:
    """The numbers of a Qwen3-style decoder that memory depends on."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    tied: bool = True
    max_positions: int = 0

    @property
    def q_width(self) -> int:
        return self.heads * self.head_dim

    @property
    def kv_width(self) -> int:
        return self.kv_heads * self.head_dim

    @property
    def layer_params(self) -> int:
        h, q, kv = self.hidden, self.q_width, self.kv_width
        # q, k, v, o projections; gate, up, down; two RMSNorms over H and the q/k norms over head_dim
        return h * (q + 2 * kv) + q * h + 3 * h * self.intermediate + 2 * h + 2 * self.head_dim

    @property
    def embedding_params(self) -> int:
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        head = 0 if self.tied else self.embedding_params
        return self.embedding_params + head + self.layers * self.layer_params + self.hidden

    def kv_bytes_per_token(self, dtype_bytes: int) -> int:
        """Keys and values of one token in every layer."""
        return 2 * self.layers * self.kv_width * dtype_bytes

    @classmethod
    def from_hf_config(cls, config: Any) -> ModelShape:
        """From a transformers config object or a config.json dict."""
        get = (
            (lambda k, d=None: config.get(k, d))
            if isinstance(config, dict)
            else (lambda k, d=None: getattr(config, k, d))
        )
        heads = get("num_attention_heads")
        return cls(
            hidden=get("hidden_size"),
            intermediate=get("intermediate_size"),
            layers=get("num_hidden_layers"),
            heads=heads,
            kv_heads=get("num_key_value_heads") or heads,
            head_dim=get("head_dim") or get("hidden_size") // heads,
            vocab=get("vocab_size"),
            tied=bool(get("tie_word_embeddings", False)),
            max_positions=get("max_position_embeddings") or 0,
        )


def model_shape(models: ModelsConfig, model_dir: str | Path | None = None) -> ModelShape:
    """The shape of the model a stage loads: ``model_dir``'s config.json when it exists, else the profile's
    ``models.architecture`` (a hub model) or ``models.tiny`` (vocabulary at its upper bound, padded)."""
    if model_dir is not None and (Path(model_dir) / "config.json").exists():
        return ModelShape.from_hf_config(json.loads((Path(model_dir) / "config.json").read_text()))
    arch = models.architecture
    if arch is not None:
        return ModelShape.from_hf_config(arch.model_dump())
    tiny = models.tiny
    if tiny is None:
        raise MemoryPlanError(
            f"no model shape for {models.base_model!r}: set models.architecture (its config.json numbers)"
        )
    multiple = models.pad_embeddings_to_multiple_of
    return ModelShape(
        hidden=tiny.hidden_size,
        intermediate=tiny.intermediate_size,
        layers=tiny.num_hidden_layers,
        heads=tiny.num_attention_heads,
        kv_heads=tiny.num_key_value_heads,
        head_dim=tiny.head_dim,
        vocab=math.ceil(tiny.tokenizer_vocab_size / multiple) * multiple,
        tied=True,
        max_positions=tiny.max_position_embeddings,
    )


# ----------------------------------------------------------------------------------------- activations
def layer_activation_bytes(shape: ModelShape, dtype_bytes: int, masked: bool) -> int:
    """Bytes per token one decoder layer keeps for its backward (transformers' Qwen3 layer under sdpa).

    ``masked``: an attention mask is passed (the parallel 4D mask, or padding), so keys and values are
    repeated to every query head before sdpa and kept that way. Counted tensor by tensor on the tiny model
    (tests pin it); a low-precision run keeps fp32 copies inside each RMSNorm instead of the residuals.
    """
    w, h, q, kv = dtype_bytes, shape.hidden, shape.q_width, shape.kv_width
    low = w < 4
    norms = 2 * (8 * h + 4)  # fp32 input copy (or the input itself), 1/rms, normalised, scaled
    residual = 0 if low else 2 * w * h  # the two residual sums (low precision: the next norm's fp32 copy)
    query = (8 if low else 12) * q + 4 * shape.heads  # projection, q-norm, rotary
    key = (6 if low else 8) * kv + 4 * shape.kv_heads  # projection, k-norm (the rotary output is below)
    attn_kv = 2 * w * (q if masked else kv)  # keys and values as sdpa reads them
    attn_out = w * q + 4 * shape.heads  # output and log-sum-exp
    mlp = 4 * w * shape.intermediate  # gate, silu(gate), up, product
    return norms + residual + query + key + attn_kv + attn_out + mlp


@dataclass(frozen=True)
class ForwardShape:
    """One training forward: ``rows`` sequences padded to ``seq_len`` tokens, ``scored`` tokens scored."""

    rows: int
    seq_len: int
    masked: bool = True  # a 4D mask (parallel layout or padding): the worst case, and what batches carry
    scored: int | None = None  # tokens the scorer projects to the vocabulary (default: every token)

    @property
    def tokens(self) -> int:
        return self.rows * self.seq_len


def training_activation_terms(
    shape: ModelShape,
    fwd: ForwardShape,
    dtype_bytes: int,
    checkpointing: bool,
    length: str,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> list[Term]:
    """Activation terms of one forward + backward through the chunked scorer (peak, per process); ``length``
    names the setting that bounds the sequences (``<stage>.max_length`` for SFT and the seed,
    ``<stage>.max_new_tokens`` for RL), for the fix a too-large plan suggests."""
    w, tokens, h = dtype_bytes, fwd.tokens, shape.hidden
    per_layer = layer_activation_bytes(shape, w, fwd.masked)
    mask_per_layer = fwd.rows * fwd.seq_len**2 * w if fwd.masked else 0  # sdpa's float copy of the mask
    stage = length.split(".")[0]
    fix = f"{stage}.gradient_checkpointing: true, or lower {length}"
    # what a layer's backward holds beyond the activations it frees as it goes: about one MLP-wide and two
    # H-wide gradients per token (measured on the tiny model: tests/unit/training/test_memory.py)
    working = tokens * (shape.intermediate + 2 * h) * w
    if checkpointing:
        kept = tokens * shape.layers * w * h  # each layer's input
        working += tokens * per_layer + mask_per_layer  # the backward recomputes one layer at a time
        fix = f"lower {length} or the rows per forward"
    else:
        kept = shape.layers * (tokens * per_layer + mask_per_layer)
    outside = tokens * (2 * shape.head_dim * w + 8 * h + 4 + (0 if w < 4 else w * h))  # rotary, final norm
    scored = fwd.scored if fwd.scored is not None else tokens
    sources = scored * h * 2 * w  # the scored tokens' hidden states and their gradient
    # The backward starts in the scorer (one chunk's logits recomputed, upcast, and their gradient) while
    # every layer's activations are still held; by the time a layer's backward runs, the scorer's are gone.
    logits = min(chunk_tokens, scored) * shape.vocab * (2 * w + 12)
    terms = [
        Term("activations kept for backward", kept + outside + sources, fix),
        Term("backward transient (a logits chunk or one layer)", max(logits, working), fix),
    ]
    if fwd.masked:
        terms.append(Term("attention mask (bool)", fwd.rows * fwd.seq_len**2, f"lower {length}"))
    return terms


# ----------------------------------------------------------------------------------------- plans
@dataclass(frozen=True)
class Term:
    name: str
    bytes: int
    setting: str = ""  # what to change to make this term smaller


@dataclass
class PhasePlan:
    """What one phase of a stage holds on each of its GPUs at its peak."""

    stage: str
    phase: str
    gpus: int
    terms: list[Term]
    notes: list[str] = field(default_factory=list)
    # A floor the phase must clear beside fitting (e.g. an SGLang KV pool that holds one full sequence).
    requirement: str | None = None

    @property
    def total_bytes(self) -> int:
        return sum(t.bytes for t in self.terms)

    def largest(self) -> Term:
        return max(self.terms, key=lambda t: t.bytes)

    def describe(self) -> str:
        parts = ", ".join(f"{t.name} {t.bytes / GIB:.1f}" for t in self.terms if t.bytes >= 0.05 * GIB)
        return f"{self.total_bytes / GIB:.1f} GiB per GPU ({parts or 'all terms < 0.05 GiB'})"


def headroom(plan: PhasePlan, capacity: int) -> float:
    """The share of ``capacity`` a phase leaves free (negative: it does not fit)."""
    return 1 - plan.total_bytes / capacity


def capacity_bytes(gpu: GpuSpec) -> int:
    """Usable bytes of one GPU of ``orchestration.gpu`` (total minus the reserve)."""
    return int((gpu.memory_gib - gpu.reserved_gib) * GIB)


def compute_dtype_bytes(ctx: PlanContext) -> int:
    return DTYPE_BYTES[ctx.dtype]


def prompt_bound(ctx: PlanContext, section: BaseModel | None = None) -> int:
    """Tokens a prompt of a stage may have: an RL stage's own ``verl.max_prompt_length`` (verl refuses
    longer ones), else NPR-Zero's (distillation and evaluation prompt the same way)."""
    if isinstance(section, RLStageConfig):
        return section.verl.max_prompt_length
    return ctx.default_prompt_bound


def training_state_terms(shape: ModelShape, dtype_bytes: int, shards: int = 1) -> list[Term]:
    """Weights, gradients and AdamW state per process; ``shards > 1``: FSDP over that many ranks."""
    p = shape.params
    if shards > 1:
        # fp32 shards (masters), their fp32 gradients and moments; the gathered compute-dtype layers
        # (current + prefetched), the gathered root (embeddings, tied head) and a layer's unsharded gradient
        gathered = 2 * shape.layer_params * dtype_bytes + shape.embedding_params * dtype_bytes
        return [
            Term("sharded fp32 weights, gradients and AdamW state", 16 * p // shards, "nproc_per_node"),
            Term("gathered layers and embeddings", gathered + shape.layer_params * 4, "nproc_per_node"),
        ]
    if dtype_bytes < 4:
        return [
            Term("bf16 weights", p * dtype_bytes, "nproc_per_node"),
            Term("fp32 master weights, gradients and AdamW state", 16 * p, "nproc_per_node"),
        ]
    return [Term("fp32 weights, gradients and AdamW state", 16 * p, "nproc_per_node")]


# The torch engine's KV buffer doubles when full (components/engine/kv_cache.py), so at worst it holds
# twice the slots its longest sequence needs.
ENGINE_KV_GROWTH = 2


def engine_terms(
    shape: ModelShape, rows: int, prompt: int, max_new: int, dtype_bytes: int, knob: str
) -> list[Term]:
    """The torch engine decoding ``rows`` sequences (weights counted by the caller)."""
    kv = ENGINE_KV_GROWTH * rows * (prompt + max_new + 1) * shape.kv_bytes_per_token(dtype_bytes)
    per_step = rows * shape.vocab * (dtype_bytes + 12)  # the last position's logits, fp32 log-softmax, probs
    # prefill: one layer's activations at a time (no gradient), the prompt's mask, one row of logits
    prefill = rows * prompt * (layer_activation_bytes(shape, dtype_bytes, True) // 2) + rows * prompt**2 * (
        1 + dtype_bytes
    )
    return [
        Term(
            "KV cache (doubling buffer) at prompt + max_new_tokens",
            kv,
            f"{knob}.batch_size or {knob}.max_new_tokens",
        ),
        Term("decode logits", per_step, f"{knob}.batch_size"),
        Term("prefill working set", prefill, f"{knob}.batch_size"),
    ]


def reread_tokens(
    merge: MergeSemantics, section: RLStageConfig | SFTStageConfig, response_tokens: int
) -> int:
    """Tokens a ``reread`` layout (``merge_semantics``) may add to a parallel sequence: the re-read copies
    of branches 2..k, at most the response itself (``components.structure.merge``); 0 under ``isolated``
    or sequentially."""
    parallel = getattr(section, "engine_mode", getattr(section, "mode", "sequential")) == "parallel"
    return response_tokens if parallel and merge == "reread" else 0


def _sft_plan(stage: str, sc: SeedConfig | SFTStageConfig, ctx: PlanContext, shape: ModelShape) -> PhasePlan:
    w = compute_dtype_bytes(ctx)
    if isinstance(sc, SeedConfig):
        nproc, rows, seq_len = 1, math.ceil(sc.batch_size / max(1, sc.length_splits)), sc.max_length
        checkpointing, masked = False, sc.batch_size > 1
    else:
        nproc = sc.nproc_per_node
        per_rank = max(1, sc.batch_size // nproc)
        rows, seq_len = math.ceil(per_rank / sc.length_splits), sc.max_length
        seq_len += reread_tokens(ctx.merge_semantics, sc, sc.max_length)
        checkpointing, masked = sc.gradient_checkpointing, sc.mode == "parallel" or rows > 1
    terms = training_state_terms(shape, w, nproc)
    terms = [Term(t.name, t.bytes, f"{stage}.{t.setting}" if stage != "seed" else "") for t in terms]
    fwd = ForwardShape(rows=rows, seq_len=seq_len, masked=masked)
    terms += training_activation_terms(shape, fwd, w, checkpointing, f"{stage}.max_length")
    notes = [
        f"{rows} x {seq_len} tokens per forward, gradient checkpointing {'on' if checkpointing else 'off'}"
    ]
    return PhasePlan(
        stage, "SFT step" + (f" (FSDP over {nproc} GPUs)" if nproc > 1 else ""), nproc, terms, notes
    )


def _local_rl_plans(stage: str, sc: RLStageConfig, ctx: PlanContext, shape: ModelShape) -> list[PhasePlan]:
    w = compute_dtype_bytes(ctx)
    prompt = prompt_bound(ctx, sc)
    state = training_state_terms(shape, w)
    gen_rows = (sc.gen_batch_prompts or sc.prompts_per_step) * sc.group_size
    rollout = PhasePlan(
        stage,
        "rollouts (torch engine)",
        1,
        state + engine_terms(shape, gen_rows, prompt, sc.max_new_tokens, w, stage),
        [f"{gen_rows} sequences of up to {prompt} + {sc.max_new_tokens} tokens"],
    )
    response = sc.max_new_tokens + 1
    mini = math.ceil(sc.prompts_per_step * sc.group_size / sc.mini_batches)
    rows = min(sc.micro_batch_size or mini, mini)
    fwd = ForwardShape(
        rows=rows,
        seq_len=response + prompt + reread_tokens(ctx.merge_semantics, sc, response),
        masked=True,
        scored=rows * (sc.max_new_tokens + 1),
    )
    update = PhasePlan(
        stage,
        "policy update",
        1,
        state + training_activation_terms(shape, fwd, w, False, f"{stage}.max_new_tokens"),
        [f"micro-batches of {rows} rollouts ({stage}.micro_batch_size)"],
    )
    return [rollout, update]


# The parts of a verl actor's fp32 state, sharded by FSDP: parameters (4 bytes each), their gradients (4) and
# AdamW's two moments (8).
VERL_ACTOR_STATE = frozenset({"params", "grads", "optimizer"})
_STATE_BYTES = {"params": 4, "grads": 4, "optimizer": 8}
_STATE_NAMES = {
    "params": ("sharded fp32 weights", "param_offload: true"),
    "grads": ("sharded fp32 gradients", "param_offload: true"),
    "optimizer": ("sharded AdamW state", "optimizer_offload: true"),
}


def verl_train_mode_loads(param_offload: bool, optimizer_offload: bool) -> frozenset[str]:
    """What verl 0.9.1's train-mode context switch moves onto the GPU when the actor update starts
    (``workers/engine/base.py: BaseEngineCtx._context_switch`` -> ``FSDPEngine.to``): the model with its
    gradients when parameters are offloaded, the optimizer state when it is (tests drive verl's own code)."""
    loads = {"params", "grads"} if param_offload else set()
    return frozenset(loads | ({"optimizer"} if optimizer_offload else set()))


def verl_update_resident(param_offload: bool, optimizer_offload: bool) -> frozenset[str]:
    """The fp32 state resident during the update: what the switch loads plus what was never offloaded, i.e.
    all of it (offload frees the GPU for the rollout, not for the update)."""
    never_offloaded = verl_train_mode_loads(not param_offload, not optimizer_offload)
    return verl_train_mode_loads(param_offload, optimizer_offload) | never_offloaded


def verl_state_terms(params: int, ranks: int, parts: frozenset[str], knob: str | None = None) -> list[Term]:
    """One term per resident part of the actor's fp32 state, FSDP-sharded over ``ranks``; with ``knob``
    (``<stage>.verl``) each names the offload setting that frees it (outside the update; during the update
    no setting does)."""
    return [
        Term(
            _STATE_NAMES[part][0],
            _STATE_BYTES[part] * params // ranks,
            f"{knob}.{_STATE_NAMES[part][1]}" if knob else "",
        )
        for part in ("params", "grads", "optimizer")
        if part in parts
    ]


def _verl_batch_fix(stage: str, v: VerlSettings, seq: int) -> str:
    """The setting that shrinks a verl micro-batch's activations and logits and can still move: the tokens
    or rows per micro-batch while above one sequence, else the response length (the recipe changes)."""
    knob = f"{stage}.verl"
    if v.use_dynamic_bsz and v.max_token_len_per_gpu > seq:
        return f"lower {knob}.max_token_len_per_gpu"
    if not v.use_dynamic_bsz and v.micro_batch_size_per_gpu > 1:
        return f"lower {knob}.micro_batch_size_per_gpu"
    return f"lower {stage}.max_new_tokens (the responses trained on; {knob}.micro_batch_size_per_gpu is at 1)"


def _verl_plans(stage: str, sc: RLStageConfig, ctx: PlanContext, shape: ModelShape) -> list[PhasePlan]:
    v, gpu = sc.verl, ctx.gpu
    n = v.nnodes * v.n_gpus_per_node
    p = shape.params
    # the NPR actor under reread runs on laid-out rows: up to one response longer than verl packed them
    seq = v.max_prompt_length + sc.max_new_tokens + reread_tokens(ctx.merge_semantics, sc, sc.max_new_tokens)
    knob = f"{stage}.verl"
    # actor update (FSDP over every GPU): verl's train-mode switch loads what is offloaded for the whole
    # update, so every part of the fp32 state is resident then (``verl_update_resident``)
    state = verl_state_terms(p, n, verl_update_resident(v.param_offload, v.optimizer_offload))
    state.append(
        Term(
            "gathered bf16 layers and embeddings", 2 * 2 * shape.layer_params + 2 * shape.embedding_params, ""
        )
    )
    tokens = (
        v.max_token_len_per_gpu if v.use_dynamic_bsz else v.micro_batch_size_per_gpu * seq // v.ulysses_sp
    )
    rows = max(1, tokens // seq) if v.use_dynamic_bsz else v.micro_batch_size_per_gpu
    seq_len = min(seq, tokens)
    masked = not v.use_remove_padding
    fwd = ForwardShape(rows=rows, seq_len=seq_len, masked=masked)
    acts = [
        t
        for t in training_activation_terms(shape, fwd, 2, v.gradient_checkpointing, f"{stage}.max_new_tokens")
        if not t.name.startswith("logits")
    ]
    fix = _verl_batch_fix(stage, v, seq)
    acts = [
        Term(
            t.name,
            t.bytes,
            fix if v.gradient_checkpointing else f"{knob}.gradient_checkpointing: true or {fix}",
        )
        for t in acts
    ]
    # verl's stock actor: the micro-batch's bf16 logits and an fp32 working copy for log-probs/entropy
    logits = Term("logits (T x V, bf16 + fp32)", rows * seq_len * shape.vocab * 6, fix)
    actor = PhasePlan(stage, f"verl actor update (FSDP over {n} GPUs)", n, state + acts + [logits])
    # rollout: SGLang takes gpu_memory_utilization of each GPU for weights + KV pool (actor state offloaded)
    tp = v.rollout_tp
    weights = 2 * p // tp
    pool = int(gpu.memory_gib * GIB * v.gpu_memory_utilization) - weights
    kv_per_token = shape.kv_bytes_per_token(2) // min(tp, shape.kv_heads)
    pool_tokens = max(0, pool) // kv_per_token
    # outside the update the actor keeps on the GPU only what is not offloaded
    kept = verl_state_terms(
        p, n, VERL_ACTOR_STATE - verl_train_mode_loads(v.param_offload, v.optimizer_offload), knob
    )
    rollout = PhasePlan(
        stage,
        f"verl rollout (SGLang, TP {tp})",
        n,
        [
            Term(
                f"SGLang static memory ({v.gpu_memory_utilization:.0%} of the GPU)",
                int(gpu.memory_gib * GIB * v.gpu_memory_utilization),
                f"{knob}.gpu_memory_utilization",
            ),
            *kept,
        ],
        [f"KV pool {max(0, pool) / GIB:.1f} GiB = {pool_tokens} tokens per TP group"],
        requirement=None
        if pool_tokens >= seq
        else (
            f"the SGLang KV pool holds {pool_tokens} tokens per TP group, less than one sequence of "
            f"{seq} ({knob}.max_prompt_length + {stage}.max_new_tokens): raise {knob}.gpu_memory_utilization "
            f"or {knob}.rollout_tp"
        ),
    )
    return [actor, rollout]


def sglang_spec(generation: GenerationConfig) -> dict[str, Any]:
    """The SGLang server spec a decode stage launches (engine-controller: ``generation.server_spec``)."""
    path = Path(getattr(generation, "server_spec", DEFAULT_SGLANG_SPEC))
    return yaml.safe_load(path.read_text()) if path.exists() else {}


def _decode_plans(stage: str, section: DecodeStageConfig, ctx: PlanContext, shape: ModelShape) -> list[PhasePlan]:
    gen, gpu = section.generation, ctx.gpu
    w = compute_dtype_bytes(ctx)
    prompt = prompt_bound(ctx)
    knob = f"{stage}.generation"
    if gen.backend == "sglang":
        # the stage's server_args override the spec's keys (components.engine.serving), the plan's too
        spec = {**sglang_spec(gen), **dict(getattr(gen, "server_args", {}) or {})}
        tp, dp = int(spec.get("tp_size", 1)), int(spec.get("dp_size", 1))
        fraction = float(spec.get("mem_fraction_static", 0.85))
        context = int(spec.get("context_length", prompt + gen.max_new_tokens))
        weights = 2 * shape.params // tp
        pool = int(gpu.memory_gib * GIB * fraction) - weights
        pool_tokens = max(0, pool) // (shape.kv_bytes_per_token(2) // min(tp, shape.kv_heads))
        return [
            PhasePlan(
                stage,
                f"SGLang server (TP {tp} x DP {dp})",
                tp * dp,
                [
                    Term(
                        f"SGLang static memory ({fraction:.0%})",
                        int(gpu.memory_gib * GIB * fraction),
                        "mem_fraction_static",
                    )
                ],
                [f"KV pool {max(0, pool) / GIB:.1f} GiB = {pool_tokens} tokens per replica"],
                requirement=None
                if pool_tokens >= context
                else (
                    f"the SGLang KV pool holds {pool_tokens} tokens, less than one {context}-token context: "
                    "raise mem_fraction_static or tp_size in the server spec"
                ),
            )
        ]
    rows = gen.batch_size
    terms = [Term(f"{'bf16' if w < 4 else 'fp32'} weights", shape.params * w, "")]
    terms += engine_terms(shape, rows, prompt, gen.max_new_tokens, w, knob)
    return [
        PhasePlan(stage, "decode (torch engine)", 1, terms, [f"{rows} sequences at once ({knob}.batch_size)"])
    ]


def plan_stage(
    stage: str, cfg: PlanConfig, model_dir: str | Path | None = None, gpu: GpuSpec | None = None
) -> list[PhasePlan]:
    """The memory plan of ``stage`` (empty when the stage uses no GPU: data stages, or a CPU profile's): its
    section and the profile's shared settings (``plan_context``, against ``gpu`` when given) read once."""
    ctx = plan_context(cfg, gpu)
    shape = model_shape(ctx.models, model_dir)
    section = cfg.section(stage)
    if isinstance(section, SeedConfig):
        trains = ctx.models.base_model == "tiny" and section.enabled and section.steps > 0
        return [_sft_plan(stage, section, ctx, shape)] if trains and uses_gpu(ctx) else []
    if isinstance(section, SFTStageConfig):
        return [_sft_plan(stage, section, ctx, shape)] if uses_gpu(ctx) else []
    if isinstance(section, RLStageConfig):
        if section.backend == "verl":
            # verl on the CPU platform (tiny) holds no device memory to plan
            return [] if section.verl.device == "cpu" else _verl_plans(stage, section, ctx, shape)
        return _local_rl_plans(stage, section, ctx, shape) if uses_gpu(ctx) else []
    if isinstance(section, DecodeStageConfig):
        gen = section.generation
        use = gen.backend == "sglang" or uses_gpu(ctx)
        return _decode_plans(stage, section, ctx, shape) if use else []
    return []


def gpus_for(stage: str, cfg: PlanConfig) -> int:
    """GPUs the stage's own job needs (what the gpu pool is asked for): 0 for data stages, a CPU profile's
    stages, a hub seed (it only materialises the model), a verl stage on the CPU platform and a verl stage
    attached to a running Ray cluster (the cluster has the GPUs); a verl stage that starts its own Ray head
    needs its node's GPUs."""
    section = cfg.section(stage)
    if isinstance(section, RLStageConfig) and section.backend == "verl":
        v = section.verl
        return 0 if v.ray_address or v.device == "cpu" else v.n_gpus_per_node
    plans = plan_stage(stage, cfg)
    return max((p.gpus for p in plans), default=0)


def uses_gpu(ctx: PlanContext) -> bool:
    """Whether the profile's local torch work runs on CUDA (``run.device``; ``auto`` counts as CUDA)."""
    return ctx.device in ("cuda", "auto")


# The share of a GPU's usable memory (total minus ``reserved_gib``) a profile's plan leaves free before
# `npr config check` passes it: the plans are estimates (tests/unit/training/test_memory.py measures them
# on CPU), so a plan within 10% of the device is refused there as a guess too close to call.
MIN_HEADROOM = 0.10


def problems(plans: list[PhasePlan], capacity: int, gpu_name: str, headroom: float = 0.0) -> list[str]:
    """One sentence per phase that does not fit ``capacity`` bytes less ``headroom`` of it, or misses its
    requirement; the fix named is the largest term's setting that can still move."""
    out = []
    limit = int(capacity * (1 - headroom))
    for plan in plans:
        if plan.total_bytes > limit:
            big = max((t for t in plan.terms if t.setting), key=lambda t: t.bytes, default=plan.largest())
            room = f" less {headroom:.0%} headroom = {limit / GIB:.1f} GiB" if headroom else ""
            out.append(
                f"{plan.stage} ({plan.phase}) needs {plan.describe()}, but one {gpu_name} offers "
                f"{capacity / GIB:.1f} GiB{room}: the largest part that a setting shrinks is {big.name} "
                f"({big.bytes / GIB:.1f} GiB); to fit, change {big.setting or 'the GPU type (orchestration.gpu)'}"
            )
        if plan.requirement:
            out.append(f"{plan.stage} ({plan.phase}): {plan.requirement}")
    return out


@dataclass(frozen=True)
class DeviceReport:
    """What the machine a stage runs on reports of its GPUs: device 0's name and total memory, and how many
    devices the stage's process sees."""

    name: str
    total_bytes: int
    count: int


def _read_nvidia_smi() -> DeviceReport | None:
    """The GPUs through ``nvidia-smi`` (no CUDA context in this process, which stays alive beside verl's
    and SGLang's workers for the whole stage); None where it is missing or fails."""
    exe = shutil.which("nvidia-smi")
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--query-gpu=name,memory.total", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=NVIDIA_SMI_TIMEOUT_S,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line]
    if not rows:
        return None
    name, mib = rows[0]
    return DeviceReport(name.strip(), int(float(mib)) * 2**20, len(rows))


NVIDIA_SMI_TIMEOUT_S = 30


def read_device() -> DeviceReport | None:
    """The GPUs this process would use: ``nvidia-smi``'s report, else torch's (CUDA), else None (no GPU)."""
    report = _read_nvidia_smi()
    if report is not None or not torch.cuda.is_available():
        return report
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return DeviceReport(props.name, props.total_memory, torch.cuda.device_count())


# How far below the declared memory a device may report before it is not the declared GPU (drivers and ECC
# settings move the total by a few hundred MiB; a MIG slice or a smaller card is off by far more).
DEVICE_MEMORY_TOLERANCE_GIB = 1.0


def device_mismatch(report: DeviceReport, gpu: GpuSpec, gpus_needed: int) -> str | None:
    """Why the device is not what the profile declares (``orchestration.gpu``), or None: its name must
    contain the declared one as a word (``H100`` in ``NVIDIA H100 80GB HBM3``), its memory be no less
    than declared, and there be as many devices as the stage's job needs."""
    named = re.search(rf"(?<![A-Za-z0-9]){re.escape(gpu.name)}(?![A-Za-z0-9])", report.name, re.IGNORECASE)
    found = []
    if not named:
        found.append(f"the device is a {report.name}, the profile declares {gpu.name}")
    gib = report.total_bytes / GIB
    if gib < gpu.memory_gib - DEVICE_MEMORY_TOLERANCE_GIB:
        found.append(f"the device has {gib:.1f} GiB, the profile declares {gpu.memory_gib:.1f} GiB")
    if report.count < gpus_needed:
        found.append(f"{report.count} device(s) visible, the stage's job needs {gpus_needed}")
    if not found:
        return None
    return (
        "; ".join(found)
        + ": run a profile declaring this GPU (orchestration.gpu; `npr config check --gpu KIND` plans one)"
    )


def check_stage(
    stage: str,
    cfg: PlanConfig,
    model_dir: str | Path | None = None,
    device: DeviceReport | None = None,
) -> list[PhasePlan]:
    """Raise ``MemoryPlanError`` (naming the setting) when ``stage`` cannot fit; returns its plan.

    ``device``: the GPU the stage got (at stage start): the plan is made against its real memory, and a
    device that is not the declared ``orchestration.gpu`` is refused; else the declared GPU.
    """
    gpu = cfg.orchestration.gpu
    if device is not None:
        mismatch = device_mismatch(device, gpu, gpus_for(stage, cfg))
        if mismatch:
            raise MemoryPlanError(f"{stage}: {mismatch}")
        gpu = gpu.model_copy(update={"name": device.name, "memory_gib": device.total_bytes / GIB})
    plans = plan_stage(stage, cfg, model_dir, gpu)
    found = problems(plans, capacity_bytes(gpu), gpu.name)
    if found:
        raise MemoryPlanError("; ".join(found))
    return plans


def init_model_dir(section: BaseModel | None, io: Any) -> Path | None:
    """The model directory a stage starts from (its section's ``<init_from>/model``), when it has one and it
    exists."""
    init = getattr(section, "init_from", None)
    if init is None:
        return None
    path = io.inputs.get(f"{init}/model")
    return path if path is not None and Path(path).is_dir() else None


def check_before_run(
    stage: str, cfg: PlanConfig, io: Any, read: Callable[[], DeviceReport | None] = read_device
) -> None:
    """What a stage calls before any work (``components.stages.run_stage``): its plan against the GPU the
    machine reports (``read``), for every stage that uses one (local CUDA work, verl, SGLang). With no GPU
    visible, local work runs on the CPU (no plan), and a verl or SGLang stage, whose GPUs are then a Ray
    cluster's or a server's elsewhere, is planned against the declared ``orchestration.gpu``."""
    section = cfg.section(stage)
    external = _uses_verl(section) or _serves_with_sglang(section)
    if not external and not uses_gpu(plan_context(cfg)):
        return  # CPU work: no device memory to plan (the tiny profile)
    if not plan_stage(stage, cfg):
        return  # a stage with no GPU work (a data stage, a hub seed, verl on the CPU platform)
    device = read()
    if device is None and not external:
        return  # a CUDA profile's local stage on a machine without a GPU runs on the CPU
    check_stage(stage, cfg, init_model_dir(section, io), device)
