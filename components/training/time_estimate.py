"""How long each GPU stage of a profile takes: tokens from the profile, tokens/s from the GPU kind.

The model (an estimate, with its inputs stated; ``npr config check`` prints it per stage):

- **tokens per stage, from the profile**, each sequence at its budget (an upper bound: every response runs
  to ``max_new_tokens``, every SFT row to ``max_length``): an RL stage's ``steps x prompts_per_step x
  group_size`` rollouts (one generation batch a step: DAPO's refills of a step are not counted) and its
  validations (``eval_n x eval_samples`` before training and every ``eval_every`` steps); distill's
  problems x ``k``; evaluate's checkpoints x benchmark problems (their registered sizes) x ``n_samples``;
  an SFT stage's rows x epochs (the warmups: the accepted trajectories, at most one per problem;
  data sets the profile does not size: ``time_model.data_rows`` of ``infra/gpus.yaml``).
- **training** (SFT steps; verl's old-log-prob forward and its update): model FLOPs per token, 2 x params
  + the causal attention (2 x layers x q-width x the mean context) a forward, x3 for forward + backward,
  +1 forward where gradient checkpointing recomputes, at ``train_mfu`` of the GPU's dense BF16 peak.
- **decode** (SGLang: verl's rollouts, distill, evaluate): each step of a server reads the weights once
  and every running sequence's KV; the sequences in flight are what its KV pool holds at full length (the
  planner's pool, ``components.training.memory``), capped by the requests in flight; a step takes the
  longer of the bytes at ``decode_bandwidth`` of the HBM bandwidth and the FLOPs at ``decode_mfu``.
- The peaks are the vendor datasheets' (``infra/gpus.yaml``); the utilisation factors are assumptions
  until a lent GPU measures them (benchmarks/smoke_gpu.py). Stage start-up, weight syncs, checkpoint saves
  and the CPU stages are not counted.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pydantic import BaseModel

from components.data.benchmarks import BENCHMARKS
from components.data.config import RejectFilterConfig, SampleOrzConfig
from components.engine.config import DecodeStageConfig, DistillConfig
from components.ops.config import GpuSpec
from components.ops.gpus import GpuKind, TimeModel
from components.training import memory
from components.training.config import PR1ColdStartConfig, RLStageConfig, SFTStageConfig
from components.training.memory import ModelShape, PlanConfig, PlanContext, SectionT

HOUR = 3600.0


@dataclass(frozen=True)
class Throughput:
    """One GPU kind under the time model: FLOP/s and bytes/s each phase reaches."""

    train_flops: float
    decode_flops: float
    decode_bytes: float

    @classmethod
    def of(cls, kind: GpuKind, model: TimeModel) -> Throughput:
        peak, bandwidth = kind.bf16_tflops * 1e12, kind.hbm_tb_s * 1e12
        return cls(peak * model.train_mfu, peak * model.decode_mfu, bandwidth * model.decode_bandwidth)


@dataclass(frozen=True)
class StageEstimate:
    """A stage's estimated wall time and what it was computed from."""

    stage: str
    seconds: float
    basis: str

    @property
    def hours(self) -> float:
        return self.seconds / HOUR


def forward_flops_per_token(shape: ModelShape, mean_context: float) -> float:
    """Model FLOPs of one token's forward: the matmuls over every parameter and the causal attention
    (scores and values: 2 x 2 x q-width per layer per token attended)."""
    return 2 * shape.params + 4 * shape.layers * shape.q_width * mean_context


def training_seconds(
    shape: ModelShape, tokens: float, seq_len: int, gpus: int, checkpointing: bool, tp: Throughput
) -> float:
    """Forward + backward (+ the recompute) over ``tokens`` in sequences of ``seq_len``, on ``gpus``."""
    passes = 3 + (1 if checkpointing else 0)
    return tokens * passes * forward_flops_per_token(shape, seq_len / 2) / (gpus * tp.train_flops)


def forward_seconds(shape: ModelShape, tokens: float, seq_len: int, gpus: int, tp: Throughput) -> float:
    """A forward only (verl's old log-probs) over ``tokens``."""
    return tokens * forward_flops_per_token(shape, seq_len / 2) / (gpus * tp.train_flops)


def decode_seconds(
    shape: ModelShape,
    sequences: int,
    prompt: int,
    new_tokens: int,
    gpus: int,
    tp_size: int,
    pool_tokens: int,
    in_flight: int | None,
    tp: Throughput,
) -> float:
    """``sequences`` decoded to ``new_tokens`` each on ``gpus`` GPUs as servers of ``tp_size`` GPUs, each with a
    KV pool of ``pool_tokens``; at most ``in_flight`` requests at once over all servers (None: no cap)."""
    servers = max(1, gpus // tp_size)
    per_server = math.ceil(sequences / servers)
    fits = max(1, pool_tokens // (prompt + new_tokens))
    batch = min(per_server, fits, math.ceil(in_flight / servers) if in_flight else per_server)
    context = prompt + new_tokens / 2  # the mean context over a sequence's decode
    step_bytes = 2 * shape.params + batch * context * shape.kv_bytes_per_token(2)
    step_flops = batch * forward_flops_per_token(shape, context)
    step = max(step_bytes / (tp_size * tp.decode_bytes), step_flops / (tp_size * tp.decode_flops))
    waves = math.ceil(per_server / batch)
    prefill = sequences * prompt * forward_flops_per_token(shape, prompt / 2) / (gpus * tp.decode_flops)
    return waves * new_tokens * step + prefill


def _pool_tokens(shape: ModelShape, gpu: GpuSpec, fraction: float, tp_size: int) -> int:
    """Tokens a server's KV pool holds (the memory planner's count)."""
    pool = int(gpu.memory_gib * memory.GIB * fraction) - 2 * shape.params // tp_size
    return max(0, pool) // (shape.kv_bytes_per_token(2) // min(tp_size, shape.kv_heads))


def _rl_estimate(
    stage: str, sc: RLStageConfig, ctx: PlanContext, shape: ModelShape, tp: Throughput
) -> tuple[float, str]:
    v, gpu = sc.verl, ctx.gpu
    gpus, prompt, new = v.nnodes * v.n_gpus_per_node, v.max_prompt_length, sc.max_new_tokens
    pool = _pool_tokens(shape, gpu, v.gpu_memory_utilization, v.rollout_tp)
    rollouts = sc.prompts_per_step * sc.group_size
    seq = prompt + new + memory.reread_tokens(ctx.merge_semantics, sc, new)
    step = decode_seconds(shape, rollouts, prompt, new, gpus, v.rollout_tp, pool, None, tp)
    step += forward_seconds(shape, rollouts * seq, seq, gpus, tp)
    step += training_seconds(shape, rollouts * seq, seq, gpus, v.gradient_checkpointing, tp)
    validations = sc.steps // sc.eval_every + (1 if sc.eval_before_train else 0)
    val = sc.eval_n * sc.eval_samples
    seconds = sc.steps * step + validations * decode_seconds(
        shape, val, prompt, new, gpus, v.rollout_tp, pool, None, tp
    )
    basis = f"{sc.steps} steps x {rollouts} rollouts of {prompt} + {new} tokens, {validations} validations x {val}"
    return seconds, basis


def _only(cfg: PlanConfig, kind: type[SectionT]) -> SectionT:
    """The config's one section of type ``kind`` (distill, reject_filter, sample_orz)."""
    (section,) = cfg.sections(kind).values()
    return section


def _distilled_problems(cfg: PlanConfig) -> int:
    """Problems distillation samples: its ``n_problems``, else every problem ``sample_orz`` draws."""
    return _only(cfg, DistillConfig).n_problems or _only(cfg, SampleOrzConfig).n


def _accepted_rows(cfg: PlanConfig) -> int:
    """Trajectories the warmups train on: reject_filter's accepted ones, at most ``max_accepted_per_problem``
    of each distilled problem (and ``distill.target_accepted`` when set)."""
    accepted = _distilled_problems(cfg) * _only(cfg, RejectFilterConfig).max_accepted_per_problem
    return min(accepted, _only(cfg, DistillConfig).target_accepted or accepted)


def _sft_rows(stage: str, sc: SFTStageConfig, accepted_rows: int, model: TimeModel) -> int | None:
    """Rows an SFT stage trains on: Parallel-R1's cold start its data set's (``data.n``, else the time
    model's count); the warmups ``accepted_rows`` (``_accepted_rows``)."""
    if isinstance(sc, PR1ColdStartConfig):
        return sc.data.n or model.data_rows.get(stage)
    return accepted_rows


def _sft_estimate(
    stage: str,
    sc: SFTStageConfig,
    ctx: PlanContext,
    shape: ModelShape,
    accepted_rows: int,
    model: TimeModel,
    tp: Throughput,
) -> tuple[float | None, str]:
    rows = _sft_rows(stage, sc, accepted_rows, model)
    if rows is None:
        return None, f"no row count for {stage} (time_model.data_rows in infra/gpus.yaml)"
    seq = sc.max_length + memory.reread_tokens(ctx.merge_semantics, sc, sc.max_length)
    passes = rows * sc.epochs
    if sc.max_steps is not None:
        passes = min(passes, sc.max_steps * sc.batch_size * sc.grad_accum)
    seconds = training_seconds(shape, passes * seq, seq, sc.nproc_per_node, sc.gradient_checkpointing, tp)
    return seconds, f"{passes} sequences of up to {seq} tokens on {sc.nproc_per_node} GPU(s)"


def _benchmark_rows(name: str, model: TimeModel) -> int | None:
    """A registered benchmark's pinned size, else the time model's count for it (None: unknown)."""
    spec = BENCHMARKS.get(name)
    return (spec.size if spec is not None else None) or model.data_rows.get(name)


def _server(section: DecodeStageConfig) -> tuple[int, int, float]:
    spec = {**memory.sglang_spec(section.generation), **dict(section.generation.server_args)}
    return (
        int(spec.get("tp_size", 1)),
        int(spec.get("dp_size", 1)),
        float(spec.get("mem_fraction_static", 0.85)),
    )


def _decode_estimate(
    stage: str,
    section: DecodeStageConfig,
    ctx: PlanContext,
    shape: ModelShape,
    distilled_problems: int,
    model: TimeModel,
    tp: Throughput,
) -> tuple[float | None, str]:
    gen = section.generation
    if gen.backend != "sglang":
        return None, "torch engine: not modelled"
    tp_size, dp, fraction = _server(section)
    pool = _pool_tokens(shape, ctx.gpu, fraction, tp_size)
    prompt = memory.prompt_bound(ctx)
    if not isinstance(section, DistillConfig):
        # evaluate: each checkpoint decodes every benchmark (its section type is evaluation's, a floor
        # above this one, so it is read by its fields)
        benchmarks, checkpoints = getattr(section, "benchmarks", []), getattr(section, "checkpoints", [])
        sizes = {b.name: _benchmark_rows(b.name, model) for b in benchmarks}
        unknown = sorted(name for name, size in sizes.items() if size is None)
        if unknown:
            return None, f"benchmarks of unknown size: {unknown} (time_model.data_rows in infra/gpus.yaml)"
        per = sum(
            min(sizes[b.name] or 0, b.max_problems or sizes[b.name] or 0) * b.n_samples for b in benchmarks
        )
        sequences = per * len(checkpoints)
        basis = f"{len(checkpoints)} checkpoints x {per} samples of {prompt} + {gen.max_new_tokens}"
    else:
        problems = distilled_problems
        sequences = problems * section.k
        basis = f"{problems} problems x {section.k} samples of {prompt} + {gen.max_new_tokens}"
    seconds = decode_seconds(
        shape, sequences, prompt, gen.max_new_tokens, tp_size * dp, tp_size, pool, gen.batch_size, tp
    )
    return seconds, basis


def estimate_stage(
    stage: str, cfg: PlanConfig, gpu: GpuSpec, kind: GpuKind, model: TimeModel
) -> StageEstimate | None:
    """The estimated wall time of ``stage`` on GPUs of ``kind`` (None: the stage uses no GPU): its section,
    the profile's shared planning settings and the recipe's row counts read once, handed to the estimate."""
    if not memory.plan_stage(stage, cfg, gpu=gpu):
        return None
    ctx = memory.plan_context(cfg, gpu)
    shape = memory.model_shape(ctx.models)
    tp = Throughput.of(kind, model)
    section: BaseModel | None = cfg.section(stage)
    if isinstance(section, RLStageConfig) and section.backend == "verl":
        seconds, basis = _rl_estimate(stage, section, ctx, shape, tp)
    elif isinstance(section, SFTStageConfig):
        seconds, basis = _sft_estimate(stage, section, ctx, shape, _accepted_rows(cfg), model, tp)
    elif isinstance(section, DecodeStageConfig):
        seconds, basis = _decode_estimate(stage, section, ctx, shape, _distilled_problems(cfg), model, tp)
    else:
        seconds, basis = None, "not modelled"
    return StageEstimate(stage, seconds if seconds is not None else math.nan, basis)
