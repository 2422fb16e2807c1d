"""The one SFT recipe: NPR-Beta (parallel), SR-Beta (sequential) and the tiny seed model all train here.

What a step does:
- ``settings.grad_accum`` micro-batches of ``settings.batch_size`` examples, deterministic in the step
  number (so a resumed run sees exactly the batches the crashed run would have seen); with
  ``length_splits > 1`` the step's examples are sorted by length and each micro-batch's worth runs as that
  many passes (the same gradient, less padding: 4 splits made a tiny seed step ~17% faster);
- parallel mode: a 4D bool mask and parallel position ids from ``components.structure`` (bool goes straight
  to sdpa; eager gets ``to_additive_mask``); sequential mode: a padding mask and plain causal attention;
- loss = mean negative log-likelihood over the response tokens of the whole accumulated step (each token
  predicted from its parent position, see ``sft_data``), AdamW, grad-norm clipping, a warmup + cosine /
  constant / linear schedule with ``min_lr`` (transformers' schedule functions);
- a checkpoint (weights, optimizer, scheduler, step, RNG, and the run's logged history, token and wall-time
  totals and the step source's counters) every ``save_every`` steps in the stage's work dir; a rerun resumes
  from the newest one and reports what an uninterrupted run reports; metrics go to a JSON file after every
  logged step.

On GPU the same code runs unchanged with ``run.device: cuda`` (or ``auto``) and ``run.dtype: bfloat16``:
the model is loaded in bf16 with sdpa, which takes the bool mask directly (flash kernels do not accept an
arbitrary mask, so sdpa picks its memory-efficient kernel). The loss is computed in float32 from the
logits. Several GPUs: FSDP through ``torchrun`` (``nproc_per_node`` in the stage's config makes
``npr stage`` relaunch itself; ``components.training.distributed``): every rank builds the same step, trains
on its share, the loss stays the token mean of the whole step, and checkpoints are gathered to rank 0 in the
single-process format. Two CPU ranks reproduce one process's weights to 1e-5 (tested, gloo backend).
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from contextlib import nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from transformers import (
    get_constant_schedule_with_warmup,
    get_cosine_with_min_lr_schedule_with_warmup,
    get_polynomial_decay_schedule_with_warmup,
)

from components.artifacts import write_json
from components.progress import track
from components.structure import MergeSemantics, to_additive_mask
from components.training.batching import length_sorted_splits
from components.training.checkpoint import TrainingState, latest_checkpoint, load_checkpoint, save_checkpoint
from components.training.config import SFTStageConfig
from components.training.distributed import DistContext, shard_model
from components.training.precision import build_adamw, compute_autocast, stepped_parameters
from components.training.sft_data import Mode, SFTBatch, SFTExample, collate
from components.training.token_logprobs import token_log_probs

Scheduler = Literal["cosine", "constant", "linear"]
# Examples of one optimizer step (batch_size * grad_accum of them), a pure function of the step number.
# A source that counts something across steps (the seed's skipped held-out problems) may also define
# ``state_dict() -> dict`` and ``load_state_dict(dict)``: the state is saved with every checkpoint.
StepSource = Callable[[int], Sequence[SFTExample]]
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class SFTSettings:
    """Everything the recipe needs, resolved from a stage config (``from_stage_config`` / the seed stage)."""

    mode: Mode
    total_steps: int
    batch_size: int
    lr: float
    min_lr: float = 0.0
    warmup_steps: int = 0
    scheduler: Scheduler = "cosine"
    weight_decay: float = 0.0
    adam_betas: tuple[float, float] = (0.9, 0.95)
    grad_accum: int = 1
    grad_clip: float = 1.0
    save_every: int = 1000
    seed: int = 0
    log_every: int = 10
    keep_checkpoints: int = 2
    # Passes per micro-batch over length-sorted slices of the step: the same gradient, less padding
    # (components.training.batching); 1 = each micro-batch in one pass, in the step's order.
    length_splits: int = 1
    # Recompute decoder-layer activations in the backward instead of keeping them (same gradient).
    gradient_checkpointing: bool = False
    # run.autocast: the forward's compute dtype over fp32 weights (components.training.precision)
    autocast: str | None = None
    # What post-merge tokens see of the branches in parallel mode (components.structure.merge)
    merge: MergeSemantics = "isolated"

    @property
    def examples_per_step(self) -> int:
        return self.batch_size * self.grad_accum

    @classmethod
    def from_stage_config(
        cls,
        cfg: SFTStageConfig,
        n_examples: int,
        autocast: str | None = None,
        merge: MergeSemantics = "isolated",
    ) -> SFTSettings:
        """Settings of a ``parallel_warmup``/``sequential_warmup`` section for ``n_examples`` examples
        (``autocast``: the run's ``run.autocast``; ``merge``: the pipeline's ``merge_semantics``).

        ``total_steps = max_steps`` when set, else ``ceil(epochs * n_examples / (batch_size * grad_accum))``;
        ``warmup_steps = round(warmup_ratio * total_steps)``.
        """
        if n_examples < 1:
            raise ValueError("SFT needs at least one example")
        per_step = cfg.batch_size * cfg.grad_accum
        total = cfg.max_steps or math.ceil(cfg.epochs * n_examples / per_step)
        return cls(
            mode=cfg.mode,
            total_steps=total,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            min_lr=cfg.min_lr,
            warmup_steps=round(cfg.warmup_ratio * total),
            scheduler=cfg.scheduler,
            weight_decay=cfg.weight_decay,
            adam_betas=tuple(cfg.adam_betas),
            grad_accum=cfg.grad_accum,
            grad_clip=cfg.grad_clip,
            save_every=cfg.save_every,
            seed=cfg.seed,
            length_splits=cfg.length_splits,
            gradient_checkpointing=cfg.gradient_checkpointing,
            autocast=autocast,
            merge=merge,
        )


@dataclass
class SFTResult:
    """Outcome of ``train_sft``: where it started (resume) and ended, and the logged history."""

    start_step: int
    final_step: int
    history: list[dict[str, float]] = field(default_factory=list)
    train_tokens: int = 0
    # training time of the whole run: the processes before a resume included (restored from checkpoints)
    wall_time_s: float = 0.0

    def summary(self) -> dict[str, Any]:
        last = self.history[-1] if self.history else {}
        return {
            "resumed_from_step": self.start_step,
            "steps": self.final_step,
            "final_loss": last.get("loss"),
            "final_lr": last.get("lr"),
            "train_loss_tokens": self.train_tokens,
            "train_wall_time_s": round(self.wall_time_s, 3),
        }


class EpochSource:
    """Deterministic shuffled epochs over a fixed example list: step k gets examples ``[k*n, (k+1)*n)`` of
    the concatenation of per-epoch permutations (epoch e shuffled with seed ``(seed, e)``)."""

    def __init__(self, examples: Sequence[SFTExample], per_step: int, seed: int) -> None:
        if not examples:
            raise ValueError("EpochSource needs at least one example")
        self.examples = list(examples)
        self.per_step = per_step
        self.seed = seed
        self._orders: dict[int, list[int]] = {}

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            gen = torch.Generator().manual_seed(self.seed * 100_003 + epoch)
            self._orders[epoch] = torch.randperm(len(self.examples), generator=gen).tolist()
        return self._orders[epoch]

    def __call__(self, step: int) -> list[SFTExample]:
        n = len(self.examples)
        flat = range(step * self.per_step, (step + 1) * self.per_step)
        return [self.examples[self._order(i // n)[i % n]] for i in flat]


def build_optimizer(model: torch.nn.Module, settings: SFTSettings) -> torch.optim.AdamW:
    """AdamW; weight decay on matrices only (norm gains and biases are not decayed, as is standard).

    A bf16 model gets fp32 master weights and moments (``components.training.precision``)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": settings.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    return build_adamw(model, groups, lr=settings.lr, betas=settings.adam_betas)


def build_scheduler(
    optimizer: torch.optim.Optimizer, settings: SFTSettings
) -> torch.optim.lr_scheduler.LambdaLR:
    """Linear warmup to ``lr``, then cosine to ``min_lr`` / constant / linear to ``min_lr``."""
    warmup, total = settings.warmup_steps, max(settings.total_steps, 1)
    if settings.scheduler == "cosine":
        return get_cosine_with_min_lr_schedule_with_warmup(optimizer, warmup, total, min_lr=settings.min_lr)
    if settings.scheduler == "constant":
        return get_constant_schedule_with_warmup(optimizer, warmup)
    if settings.scheduler == "linear":
        return get_polynomial_decay_schedule_with_warmup(
            optimizer, warmup, total, lr_end=settings.min_lr, power=1.0
        )
    raise ValueError(f"unknown scheduler {settings.scheduler!r}")


def token_nll(model: torch.nn.Module, batch: SFTBatch) -> tuple[torch.Tensor, int]:
    """Summed negative log-likelihood of the batch's response tokens, and their count.

    Token ``t`` is scored with the logits at ``batch.parents[:, t]``:
    ``nll_t = logsumexp(logits[parent]) - logits[parent, input_ids[t]]`` (float32), computed chunk by chunk
    over the loss tokens (``components.training.token_logprobs``: no ``(B, L, V)`` logits tensor).

    Returns:
        (scalar tensor with grad, number of loss tokens)
    """
    device = next(model.parameters()).device
    mask = batch.attention_mask.to(device)
    if mask.dim() == 4 and model.config._attn_implementation == "eager":
        mask = to_additive_mask(mask, next(model.parameters()).dtype)
    input_ids = batch.input_ids.to(device)
    position_ids = batch.position_ids.to(device) if batch.position_ids is not None else None
    loss_mask = batch.loss_mask.to(device)
    log_prob, _ = token_log_probs(
        model, input_ids, mask, position_ids, batch.parents.to(device), input_ids, loss_mask
    )
    return -(log_prob * loss_mask).sum(), int(batch.loss_mask.sum())


def train_sft(
    model: torch.nn.Module,
    source: StepSource,
    settings: SFTSettings,
    work_dir: Path,
    *,
    pad_id: int,
    tags: Any = None,
    metrics_path: Path | None = None,
    on_step: Callable[[int, dict[str, float]], None] | None = None,
    show_progress: bool = True,
    ctx: DistContext | None = None,
) -> SFTResult:
    """Run (or resume) SFT of ``model`` in place for ``settings.total_steps`` optimizer steps.

    Resumes from the newest checkpoint in ``work_dir`` when there is one. ``on_step(step, record)`` is
    called after every optimizer step (1-based step). ``tags`` (TagIds) is required in parallel mode.
    With an active ``ctx`` (a ``torchrun`` job) the model is FSDP-sharded in place, each rank trains on its
    share of every step, and only rank 0 writes files, shows progress and calls ``on_step``.
    """
    if settings.mode == "parallel" and tags is None:
        raise ValueError("parallel SFT needs the schema's TagIds")
    ctx = ctx or DistContext()
    if settings.examples_per_step % ctx.world_size:
        raise ValueError(
            f"{settings.examples_per_step} examples per step do not split over {ctx.world_size} processes"
        )
    work_dir = Path(work_dir)
    if ctx.is_main:
        work_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(settings.seed)
    if settings.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    shard_model(model, ctx)  # before the optimizer: FSDP replaces the parameters with sharded ones
    model.train()
    optimizer = build_optimizer(model, settings)
    scheduler = build_scheduler(optimizer, settings)
    history: list[dict[str, float]] = []
    step, train_tokens, wall_before = 0, 0, 0.0
    resume = ctx.broadcast(latest_checkpoint(work_dir) if ctx.is_main else None)
    if resume is not None:
        state = load_checkpoint(resume, model, optimizer, scheduler, ctx)
        step, history = state.step, list(state.extra.get("history", []))
        train_tokens = int(state.extra.get("train_tokens", 0))
        wall_before = float(state.extra.get("train_wall_time_s", 0.0))
        if "source" in state.extra and hasattr(source, "load_state_dict"):
            source.load_state_dict(state.extra["source"])
        if ctx.is_main:
            done = step >= settings.total_steps
            what = "already trained to" if done else "resuming from"
            log.info("SFT %s: %s step %d of %d (%s)", settings.mode, what, step, settings.total_steps, resume)
            if metrics_path is not None:  # drop steps a crashed run logged after this checkpoint
                write_json(metrics_path, {"settings": asdict(settings), "history": history})
    result = SFTResult(start_step=step, final_step=step, history=history, train_tokens=train_tokens)
    start = time.perf_counter()
    # a live bar at a terminal, a dozen plain lines in a log (components.progress); rank 0 only
    shown = show_progress and ctx.is_main
    with track(f"SFT {settings.mode}", total=settings.total_steps) if shown else nullcontext() as task:
        if task is not None:
            task.advance(step)  # resumed steps
        while step < settings.total_steps:
            t0 = time.perf_counter()
            record = _train_step(model, optimizer, scheduler, source(step), settings, pad_id, tags, ctx)
            step += 1
            result.train_tokens += int(record["loss_tokens"])
            record.update(step=step, step_time_s=time.perf_counter() - t0)
            if step % settings.log_every == 0 or step == settings.total_steps or step == 1:
                history.append(record)
                if metrics_path is not None and ctx.is_main:
                    write_json(metrics_path, {"settings": asdict(settings), "history": history})
            if step % settings.save_every == 0 or step == settings.total_steps:
                extra: dict[str, Any] = {
                    "history": history,
                    "train_tokens": result.train_tokens,
                    "train_wall_time_s": wall_before + time.perf_counter() - start,
                }
                if hasattr(source, "state_dict"):
                    extra["source"] = source.state_dict()
                save_checkpoint(
                    work_dir,
                    TrainingState(step, extra),
                    model,
                    optimizer,
                    scheduler,
                    keep_last=settings.keep_checkpoints,
                    ctx=ctx,
                )
            if task is not None:
                task.advance(1, loss=record["loss"])
            if on_step is not None and ctx.is_main:
                on_step(step, record)
    result.final_step = step
    result.wall_time_s = wall_before + time.perf_counter() - start
    model.eval()
    return result


def _train_step(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    examples: Sequence[SFTExample],
    settings: SFTSettings,
    pad_id: int,
    tags: Any,
    ctx: DistContext | None = None,
) -> dict[str, float]:
    ctx = ctx or DistContext()
    if len(examples) != settings.examples_per_step:
        raise ValueError(
            f"step source returned {len(examples)} examples, expected {settings.examples_per_step}"
        )
    local = ctx.shard(list(examples))  # equal shares, so every rank runs the same number of forwards
    per_micro = max(1, settings.batch_size // ctx.world_size)
    if settings.length_splits > 1:
        n_micro = math.ceil(len(local) / per_micro) * settings.length_splits
        micro = length_sorted_splits(local, [len(e.input_ids) for e in local], n_micro)
    else:
        micro = [local[i : i + per_micro] for i in range(0, len(local), per_micro)]
    batches = [collate(chunk, settings.mode, pad_id, tags, settings.merge) for chunk in micro]
    # Token-mean over the whole accumulated step (all ranks): each micro-batch's sum is divided by the
    # step's total. FSDP averages gradients over ranks, so the loss is scaled back up by the world size.
    n_total = int(ctx.all_sum(sum(b.n_loss_tokens for b in batches)))
    loss_sum = 0.0
    device = next(model.parameters()).device
    for batch in batches:
        with compute_autocast(settings.autocast, device):
            nll, _ = token_nll(model, batch)
        (nll * ctx.world_size / n_total).backward()
        loss_sum += float(nll.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(stepped_parameters(model, optimizer), settings.grad_clip)
    if hasattr(grad_norm, "full_tensor"):  # a DTensor under FSDP
        grad_norm = grad_norm.full_tensor()
    lr = optimizer.param_groups[0]["lr"]
    optimizer.step()
    scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return {
        "loss": ctx.all_sum(loss_sum) / n_total,
        "lr": lr,
        "grad_norm": float(grad_norm),
        "loss_tokens": n_total,
        "tokens": int(ctx.all_sum(sum(b.n_tokens for b in batches))),
        "padded_tokens": int(ctx.all_sum(sum(b.input_ids.numel() for b in batches))),
    }
