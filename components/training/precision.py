"""Mixed precision for the local trainers: bf16 weights for compute, fp32 master weights, gradients and AdamW.

Why: AdamW stepping bf16 parameters rounds every update to bf16's 8-bit mantissa. At the qwen3-4b
profile's RL lr of 1e-7 an Adam update is ~1e-7 in absolute size, ~1e-5 of a typical weight, far below
half a bf16 ulp (~2e-3 relative): measured on CPU, 10 such steps changed 0.12% of the bf16 weights. The
standard remedy (Megatron's and DeepSpeed's bf16 optimizers, FSDP's mixed-precision policy) is to keep
an fp32 master copy of every low-precision parameter, accumulate gradients into fp32, step the optimizer
on the masters and copy them, rounded, back into the model.

- One process (``MasterWeightAdamW``): the model stays in bf16 (so the engine decodes, and the forward
  computes, with exactly the weights being trained); the optimizer holds fp32 masters; a post-accumulate
  hook on each bf16 parameter adds its gradient into the master's fp32 ``.grad`` and frees the bf16 one, so
  micro-batches accumulate in fp32 and no bf16 gradient outlives its backward.
- FSDP (``components.training.distributed.shard_model``): the sharded parameters are fp32 and
  ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)`` gathers them in bf16 for compute.
- fp32 models (the tiny profile): a plain ``torch.optim.AdamW``, so numbers are those of before.
- ``compute_autocast`` (``run.autocast``): fp32 weights, bf16 compute. Only the trainers' forward runs
  under it (the backward follows the dtypes it recorded); the optimizer step and clipping stay in fp32.

Per parameter on the device: 2 (bf16 weight) + 4 (master) + 4 (fp32 grad) + 8 (two fp32 moments) bytes;
``components.training.memory`` counts it the same way. float16 weights are refused: they need loss scaling,
which this recipe does not do (use bfloat16).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable
from typing import Any

import torch

LOW_PRECISION = (torch.bfloat16, torch.float16)
MASTER_KEY = "master_weights"


class PrecisionError(ValueError):
    """A training setup the mixed-precision recipe cannot train correctly (names the setting)."""


class MasterWeightAdamW(torch.optim.AdamW):
    """AdamW over fp32 master copies of a model's low-precision parameters.

    ``param_groups`` are groups of the *model's* parameters (as for ``torch.optim.AdamW``); the optimizer's
    own groups hold their fp32 masters, so LR schedulers and ``state_dict`` see fp32 tensors. After
    ``step()`` every model parameter holds its master rounded to the model's dtype. ``state_dict()`` carries
    the masters (``"master_weights"``), so a checkpoint resumes with the bits a bf16 copy cannot hold.
    """

    def __init__(self, param_groups: list[dict[str, Any]], **defaults: Any) -> None:
        self.model_params: list[torch.Tensor] = []
        self.master_params: list[torch.Tensor] = []
        master_groups = []
        for group in param_groups:
            masters = []
            for p in group["params"]:
                master = p.detach().to(torch.float32).clone()
                self.model_params.append(p)
                self.master_params.append(master)
                masters.append(master)
            master_groups.append({**group, "params": masters})
        super().__init__(master_groups, **defaults)
        self._hooks = [
            p.register_post_accumulate_grad_hook(self._accumulate_hook(m))
            for p, m in zip(self.model_params, self.master_params, strict=True)
        ]

    @staticmethod
    def _accumulate_hook(master: torch.Tensor):
        def hook(param: torch.Tensor) -> None:
            grad = param.grad
            if grad is None:
                return
            if master.grad is None:
                master.grad = grad.to(torch.float32)
            else:
                master.grad.add_(grad.to(torch.float32))
            param.grad = None  # the fp32 master gradient is the only one kept

        return hook

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:  # type: ignore[override]
        loss = super().step(closure)
        self.copy_masters_to_model()
        return loss

    @torch.no_grad()
    def copy_masters_to_model(self) -> None:
        for p, m in zip(self.model_params, self.master_params, strict=True):
            p.copy_(m)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state[MASTER_KEY] = list(self.master_params)
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        state_dict = dict(state_dict)
        masters = state_dict.pop(MASTER_KEY, None)
        if masters is None:
            raise PrecisionError(
                "this optimizer state has no fp32 master weights: it was written by a full-precision run "
                "(run.dtype float32); resume it with the same run.dtype"
            )
        if len(masters) != len(self.master_params):
            raise PrecisionError(
                f"{len(masters)} master weights in the state for {len(self.master_params)} parameters"
            )
        super().load_state_dict(state_dict)
        with torch.no_grad():
            for mine, saved in zip(self.master_params, masters, strict=True):
                if mine.shape != saved.shape:
                    raise PrecisionError(
                        f"master weight of shape {tuple(saved.shape)} for {tuple(mine.shape)}"
                    )
                mine.copy_(saved)
        self.copy_masters_to_model()

    def remove_hooks(self) -> None:
        """Detach from the model (its parameters keep their own ``.grad`` again)."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []


def uses_master_weights(model: torch.nn.Module) -> bool:
    """True when some trainable parameter is in a low-precision dtype (so it needs fp32 masters)."""
    return any(p.requires_grad and p.dtype in LOW_PRECISION for p in model.parameters())


def build_adamw(
    model: torch.nn.Module,
    param_groups: list[dict[str, Any]] | None = None,
    *,
    lr: float,
    betas: tuple[float, float],
    weight_decay: float = 0.0,
) -> torch.optim.AdamW:
    """AdamW for ``model``: over fp32 masters when its weights are bf16, a plain AdamW when they are fp32.

    ``param_groups`` default to one group of every trainable parameter with ``weight_decay``.
    """
    groups = param_groups or [{"params": [p for p in model.parameters() if p.requires_grad]}]
    if any(p.dtype == torch.float16 for g in groups for p in g["params"]):
        raise PrecisionError(
            "float16 weights need loss scaling, which the local trainers do not do: set run.dtype to "
            "bfloat16 (or float32)"
        )
    if uses_master_weights(model):
        return MasterWeightAdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)
    return torch.optim.AdamW(groups, lr=lr, betas=betas, weight_decay=weight_decay)


def stepped_parameters(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> Iterable[torch.Tensor]:
    """The tensors whose ``.grad`` the optimizer steps (what gradient clipping must see): the fp32 masters
    under ``MasterWeightAdamW``, else the model's parameters (in the model's order, as before)."""
    if isinstance(optimizer, MasterWeightAdamW):
        return optimizer.master_params
    return model.parameters()


def compute_autocast(dtype: str | None, device: torch.device | str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type around a trainer's forward, or a no-op (None).

    The weights, their gradients and the AdamW state keep the model's dtype; matmuls and attention run in
    ``dtype``. Why: on CPU cores with AVX512-BF16 an SFT step of the tiny model ran 1.37x (parallel mask) /
    1.53x (causal) faster than fp32, with the step's loss within 2e-5 relative (benchmarks/bench_sft.py,
    one thread).
    """
    if dtype is None:
        return contextlib.nullcontext()
    if dtype not in ("bfloat16",):
        raise PrecisionError(f"run.autocast {dtype!r}: only bfloat16 (or null) is supported")
    device_type = torch.device(device).type
    if not torch.amp.is_autocast_available(device_type):
        # ``meta`` (shape-only tensors, the device-placement tests): there is no arithmetic to lower
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=getattr(torch, dtype))
