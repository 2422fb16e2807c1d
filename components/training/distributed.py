"""Multi-process SFT with FSDP (torch's ``fully_shard``), launched by ``torchrun``; a no-op in one process.

``torchrun --nproc_per_node=N --no-python npr stage parallel_warmup`` (what ``npr stage`` runs itself as when
the stage's ``nproc_per_node`` > 1) sets ``WORLD_SIZE``/``RANK``; ``DistContext.from_env`` then joins the process
group (NCCL on CUDA, gloo on CPU, so the same path is tested on CPU) and ``shard_model`` shards every
decoder layer and the root module, which holds the (possibly tied) embeddings.

Data parallelism in the SFT recipe: every rank builds the same step (the step source is a pure function of
the step number) and takes examples ``rank::world_size`` of it; the loss is the token mean over the whole
step on all ranks, so one N-rank step equals one single-process step (tested).

Checkpoints stay in the single-process format: the full (unsharded) model and optimizer state is gathered
to rank 0, which writes it; on resume rank 0 reads it and it is broadcast into the shards. An FSDP run can
therefore resume with a different number of processes (a single-process checkpoint keys its optimizer
state by index and is refused with a clear error), and its final weights load anywhere.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from components.training.precision import LOW_PRECISION
from components.training.token_logprobs import register_fsdp_method


@dataclass(frozen=True)
class DistContext:
    """Where this process stands in a ``torchrun`` job (world_size 1 = a plain single process)."""

    world_size: int = 1
    rank: int = 0

    @property
    def active(self) -> bool:
        return self.world_size > 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @classmethod
    def from_env(cls, device: torch.device | str = "cpu") -> DistContext:
        """Join the process group ``torchrun`` describes in the environment, if any."""
        world = int(os.environ.get("WORLD_SIZE", "1"))
        if world <= 1:
            return cls()
        if not dist.is_initialized():
            cuda = torch.device(device).type == "cuda"
            if cuda:  # one GPU per process, before anything is allocated on the default one
                torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
            dist.init_process_group("nccl" if cuda else "gloo")
        return cls(world_size=dist.get_world_size(), rank=dist.get_rank())

    def shard(self, examples: list[Any]) -> list[Any]:
        """This rank's share of a step's examples (every rank sees the same list)."""
        return examples[self.rank :: self.world_size] if self.active else examples

    def broadcast(self, obj: Any) -> Any:
        """Rank 0's ``obj`` on every rank (picklable objects; the object itself in one process)."""
        if not self.active:
            return obj
        box = [obj if self.is_main else None]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def all_sum(self, value: float) -> float:
        """Sum of ``value`` over all ranks (the value itself in one process)."""
        if not self.active:
            return value
        t = torch.tensor([float(value)], dtype=torch.float64)
        if dist.get_backend() == "nccl":
            t = t.cuda()
        dist.all_reduce(t)
        return float(t.item())


def is_main_process() -> bool:
    """False in the non-zero ranks of a torchrun job (read from the environment; no process group needed)."""
    return int(os.environ.get("RANK", "0")) == 0


def torchrun_argv(nproc_per_node: int, argv: list[str]) -> list[str] | None:
    """The command that reruns ``argv`` (an ``npr`` invocation) under torchrun with ``nproc_per_node``
    processes, or None when no relaunch is needed (one process, or already inside a torchrun job)."""
    if nproc_per_node <= 1 or "WORLD_SIZE" in os.environ:
        return None
    return ["torchrun", "--standalone", f"--nproc_per_node={nproc_per_node}", "--no-python", *argv]


def shard_model(model: torch.nn.Module, ctx: DistContext) -> torch.nn.Module:
    """FSDP-shard ``model`` in place: each decoder layer, then the root (embeddings, norm, head).

    A bf16 model is sharded as fp32 master weights with bf16 compute (FSDP's ``MixedPrecisionPolicy``:
    parameters gathered in bf16, gradients reduced in fp32), so the optimizer steps fp32 shards; the
    compute dtype is kept in ``model.npr_compute_dtype`` and ``full_model_state`` returns weights in it.
    """
    if not ctx.active:
        return model
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard  # lazy: fsdp

    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None:
        raise ValueError(f"{type(model).__name__} has no .model.layers to shard (expected a HF decoder LM)")
    compute = next(model.parameters()).dtype
    kwargs: dict[str, Any] = {}
    if compute in LOW_PRECISION:
        model.to(torch.float32)
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)
    model.npr_compute_dtype = compute
    for layer in layers:
        fully_shard(layer, **kwargs)
    fully_shard(model, **kwargs)
    register_fsdp_method(model)  # the trainers' chunked scorer runs inside the root's forward hooks
    return model


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions  # lazy: fsdp

    return StateDictOptions(full_state_dict=True, cpu_offload=True, **kwargs)


def full_model_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Unsharded model state dict on rank 0 (empty elsewhere); collective call. For saving the final model,
    in the model's compute dtype (bf16 for a mixed-precision run, whose shards are fp32 masters).

    A tied output head is left out, as ``save_pretrained`` leaves it out of an unsharded model (gathered,
    the two names hold separate copies, which it would otherwise write twice).
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict  # lazy: fsdp

    state = get_model_state_dict(model, options=_options())
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False):
        state.pop("lm_head.weight", None)
    compute = getattr(model, "npr_compute_dtype", None)
    if compute is not None:  # fp32 masters of a bf16 run: the model is written in its compute dtype
        state = {k: v.to(compute) if v.is_floating_point() else v for k, v in state.items()}
    return state


def full_state(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> tuple[dict, dict]:
    """Unsharded model and optimizer state dicts on rank 0 (empty dicts elsewhere); collective call."""
    from torch.distributed.checkpoint.state_dict import (  # lazy: fsdp
        get_model_state_dict,
        get_optimizer_state_dict,
    )

    return (
        get_model_state_dict(model, options=_options()),
        get_optimizer_state_dict(model, optimizer, options=_options()),
    )


def load_full_state(
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer | None,
    model_state: dict,
    optim_state: dict | None,
) -> None:
    """Broadcast rank 0's unsharded states into the shards; collective call (other ranks pass ``{}``)."""
    from torch.distributed.checkpoint.state_dict import (  # lazy: fsdp
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    set_model_state_dict(model, model_state, options=_options(broadcast_from_rank0=True))
    if optimizer is not None:
        set_optimizer_state_dict(
            model, optimizer, optim_state or {}, options=_options(broadcast_from_rank0=True)
        )
