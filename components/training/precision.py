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
import functools
import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch

from components.settings import RunConfig

LOW_PRECISION = (torch.bfloat16, torch.float16)
MASTER_KEY = "master_weights"
log = logging.getLogger(__name__)


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


# What ``run.autocast`` may say: bf16 compute, the weights' own dtype (None), or ``auto``: bf16 where the device
# computes it natively, the weights' own dtype elsewhere (``resolve_autocast``).
AUTO = "auto"
# oneDNN ISAs (ONEDNN_MAX_CPU_ISA) that include native bf16 dot products; a cap below these makes oneDNN
# emulate bf16 whatever the silicon has (how benchmarks/bench_precision.py reproduces an AVX2 core).
_ONEDNN_BF16_ISAS = frozenset(
    {"AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "AVX10_1_512",
     "AVX10_1_512_AMX", "AVX10_1_512_AMX_FP16", "AVX10_2_512", "AVX10_2_512_AMX_2", "ALL", "DEFAULT"}
)


@dataclass(frozen=True)
class PrecisionChoice:
    """What ``run.autocast`` resolved to on one device: the compute dtype of the trainers' forward (None =
    the weights' own dtype) and why, in words a person reads in the run's log, provenance and report."""

    setting: str | None
    dtype: str | None
    reason: str

    def as_dict(self, weights_dtype: str) -> dict[str, str | None]:
        """For a record: the setting, the compute dtype (``weights_dtype`` where no autocast) and why."""
        return {"autocast": self.setting, "compute_dtype": self.dtype or weights_dtype, "reason": self.reason}


def native_bf16(device_type: str) -> tuple[bool, str]:
    """Whether ``device_type`` computes bf16 matmuls natively (True) or emulates them, and the evidence.

    Why it matters: on x86 cores without AVX512-BF16 or AMX, torch falls back to emulated bf16 kernels: a
    512x512 matmul took 205-215 ms in bf16 against 4 ms in fp32 on a 2-core AVX2 EPYC (50x), so a bf16
    autocast there turns a 20-minute run into hours (issue 43). On CPU the silicon's flags are not enough:
    ``ATEN_CPU_CAPABILITY`` and ``ONEDNN_MAX_CPU_ISA`` can cap torch below them (how the AVX2 kind is
    reproduced on any machine), so the capability torch actually dispatches to is read too.
    """
    if device_type == "cuda":
        if not torch.cuda.is_available():
            return False, "no CUDA device is available"
        name = torch.cuda.get_device_name()
        if torch.cuda.is_bf16_supported(including_emulation=False):
            return True, f"{name} computes bf16 natively"
        return False, f"{name} has no native bf16"
    if device_type != "cpu":
        return False, f"no native-bf16 check for device type {device_type!r}"
    capability = torch.backends.cpu.get_cpu_capability()
    flags = [name for name, has in (("AVX512-BF16", torch.cpu._is_avx512_bf16_supported()),
                                    ("AMX", torch.cpu._is_amx_tile_supported())) if has]
    if not flags:
        return False, f"this CPU reports neither AVX512-BF16 nor AMX (torch's capability {capability})"
    if not capability.startswith("AVX512"):
        return False, f"this CPU has {'+'.join(flags)} but torch dispatches to {capability} (ATEN_CPU_CAPABILITY)"
    onednn_cap = os.environ.get("ONEDNN_MAX_CPU_ISA", "").strip().upper()
    if onednn_cap and onednn_cap not in _ONEDNN_BF16_ISAS:
        return False, f"this CPU has {'+'.join(flags)} but ONEDNN_MAX_CPU_ISA={onednn_cap} caps oneDNN below it"
    return True, f"this CPU reports {'+'.join(flags)} (torch's capability {capability})"


@functools.cache
def _resolve(setting: str | None, device_type: str) -> PrecisionChoice:
    if setting is None:
        return PrecisionChoice(None, None, "run.autocast is null: the weights' own dtype throughout")
    if setting not in (AUTO, "bfloat16"):
        raise PrecisionError(f"run.autocast {setting!r}: only bfloat16, auto (or null) is supported")
    if setting == "bfloat16":
        return PrecisionChoice(setting, "bfloat16", "run.autocast is bfloat16 (set explicitly)")
    native, evidence = native_bf16(device_type)
    if native:
        choice = PrecisionChoice(setting, "bfloat16", f"auto: bfloat16, {evidence}")
    else:
        choice = PrecisionChoice(
            setting, None, f"auto: no autocast, compute in the weights' own dtype: {evidence}, so bf16 would be emulated"
        )
    # once per process and device (cached); `npr run` prints it once for the whole run
    log.debug("precision on %s: %s", device_type, choice.reason)
    return choice


def resolve_autocast(setting: str | None, device: torch.device | str) -> PrecisionChoice:
    """``run.autocast`` on ``device``: an explicit value wins; ``auto`` is bfloat16 only where the device
    computes bf16 natively (``native_bf16``), else the weights' own dtype. Decided once per process and
    device (the answer cannot change while it runs); logged the first time."""
    return _resolve(setting, torch.device(device).type)


def run_precision(run: RunConfig) -> PrecisionChoice:
    """``run.autocast`` on the device ``run.device`` names (``auto``: CUDA when present). Unlike loading a
    model it does not raise for a CUDA device that is missing: a stage that loads no model (a cpu-pool stage
    of a GPU profile) still records what its training would compute in."""
    cuda = run.device == "cuda" or (run.device == "auto" and torch.cuda.is_available())
    return resolve_autocast(run.autocast, "cuda" if cuda else "cpu")


def compute_autocast(dtype: str | None, device: torch.device | str) -> contextlib.AbstractContextManager:
    """``torch.autocast`` to ``dtype`` on ``device``'s type around a trainer's forward, or a no-op (None, or
    ``auto`` on a device without native bf16: ``resolve_autocast``).

    The weights, their gradients and the AdamW state keep the model's dtype; matmuls and attention run in
    ``dtype``. Why: on CPU cores with AVX512-BF16 an SFT step of the tiny model ran 1.37x (parallel mask) /
    1.53x (causal) faster than fp32, with the step's loss within 2e-5 relative (benchmarks/bench_sft.py,
    one thread); on cores without it bf16 is emulated and many times slower (``native_bf16``).
    """
    dtype = resolve_autocast(dtype, device).dtype
    if dtype is None:
        return contextlib.nullcontext()
    device_type = torch.device(device).type
    if not torch.amp.is_autocast_available(device_type):
        # ``meta`` (shape-only tensors, the device-placement tests): there is no arithmetic to lower
        return contextlib.nullcontext()
    return torch.autocast(device_type, dtype=getattr(torch, dtype))
