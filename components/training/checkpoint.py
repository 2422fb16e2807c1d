"""Training checkpoints in a stage's work dir, and resuming from the newest one after a crash.

A checkpoint is a directory ``<work_dir>/checkpoint-<step:08d>/`` holding

- ``model.safetensors``: the weights (``safetensors.torch.save_model``, which stores tied tensors once);
- ``optimizer.pt`` and ``scheduler.pt``: their ``state_dict``s (loaded with ``weights_only=True``); for a bf16
  model the optimizer's state holds the fp32 master weights (``components.training.precision``), so a resumed
  run continues from the exact fp32 values, not from their bf16 rounding;
- ``rng.pt``: torch CPU (and CUDA, when present) generator states; ``state.json``: step, the Python
  ``random`` state and whatever the trainer adds (metrics history, sample counts).

Each directory is written through ``components.artifacts.atomic_dir``, so a crash mid-save leaves the
previous checkpoint as the newest complete one; only ``keep_last`` checkpoints are kept.

Under FSDP (``components.training.distributed``, ``ctx.active``) saving and loading are collective: the
unsharded weights and optimizer state are gathered to rank 0, which alone writes (same files; the
optimizer state is keyed by parameter name, ``state.json`` says ``"optimizer_keys": "fqn"``); on resume
rank 0 reads and broadcasts into the shards, so the number of processes may change between runs.
"""

from __future__ import annotations

import json
import random
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model

from components.artifacts import atomic_dir
from components.training.distributed import DistContext, full_state, load_full_state

CHECKPOINT_RE = re.compile(r"^checkpoint-(\d{8})$")
FILES = ("model.safetensors", "optimizer.pt", "scheduler.pt", "rng.pt", "state.json")


@dataclass
class TrainingState:
    """What a resumed run needs besides weights/optimizer/scheduler: the step and trainer bookkeeping."""

    step: int
    extra: dict[str, Any] = field(default_factory=dict)


def checkpoint_dir(work_dir: Path, step: int) -> Path:
    return Path(work_dir) / f"checkpoint-{step:08d}"


def checkpoint_step(path: Path) -> int:
    """The training step a checkpoint directory holds (from its name)."""
    match = CHECKPOINT_RE.match(Path(path).name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint directory (checkpoint-<step:08d>)")
    return int(match.group(1))


def list_checkpoints(work_dir: Path) -> list[Path]:
    """Complete checkpoints in ``work_dir``, oldest first (incomplete temp dirs are ignored)."""
    work_dir = Path(work_dir)
    if not work_dir.is_dir():
        return []
    found = [p for p in work_dir.iterdir() if p.is_dir() and CHECKPOINT_RE.match(p.name)]
    complete = [p for p in found if all((p / name).exists() for name in FILES)]
    return sorted(complete, key=lambda p: int(CHECKPOINT_RE.match(p.name).group(1)))


def latest_checkpoint(work_dir: Path) -> Path | None:
    found = list_checkpoints(work_dir)
    return found[-1] if found else None


def save_checkpoint(
    work_dir: Path,
    state: TrainingState,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    keep_last: int = 2,
    ctx: DistContext | None = None,
) -> Path:
    """Write a complete checkpoint for ``state.step`` and prune older ones beyond ``keep_last``.

    With an active ``ctx`` every rank must call it (the state is gathered); only rank 0 writes.
    """
    dest = checkpoint_dir(work_dir, state.step)
    sharded = ctx is not None and ctx.active
    if sharded:
        model_state, optim_state = full_state(model, optimizer)
        if not ctx.is_main:
            return dest
    with atomic_dir(dest) as tmp:
        if sharded:
            save_file(_untied(model, model_state), str(tmp / "model.safetensors"))
            torch.save(optim_state, tmp / "optimizer.pt")
        else:
            save_model(model, str(tmp / "model.safetensors"))
            torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        torch.save(scheduler.state_dict(), tmp / "scheduler.pt")
        rng = {"torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng, tmp / "rng.pt")
        payload = {
            "step": state.step,
            "python_random": _python_state(),
            "extra": state.extra,
            "optimizer_keys": "fqn" if sharded else "index",
        }
        (tmp / "state.json").write_text(json.dumps(payload, indent=1, sort_keys=True, default=str))
    for old in list_checkpoints(work_dir)[: -max(1, keep_last)]:
        shutil.rmtree(old, ignore_errors=True)
    return dest


def load_checkpoint(
    path: Path,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    ctx: DistContext | None = None,
) -> TrainingState:
    """Restore weights, optimizer, scheduler and RNG states in place; returns the saved TrainingState.

    With an active ``ctx`` every rank must call it: rank 0 reads, the states are broadcast into the shards.
    """
    path = Path(path)
    on_disk = ctx is None or not ctx.active or ctx.is_main
    missing = [name for name in FILES if on_disk and not (path / name).exists()]
    if missing:
        raise FileNotFoundError(f"checkpoint {path} is incomplete: missing {missing}")
    sharded = ctx is not None and ctx.active
    # under FSDP only rank 0 reads files (other ranks may not share its disk); the rest is broadcast
    payload = json.loads((path / "state.json").read_text()) if not sharded or ctx.is_main else None
    if sharded:
        payload = ctx.broadcast(payload)
    keys = payload.get("optimizer_keys", "index")
    if (keys == "fqn") != sharded:
        written = "an FSDP (torchrun) run" if keys == "fqn" else "a single-process run"
        raise ValueError(
            f"checkpoint {path} was written by {written}; resume it the same way "
            f"(this process is {'FSDP' if sharded else 'single-process'})"
        )
    if sharded:
        model_state, optim_state = {}, {}
        if ctx.is_main:
            model_state = _tied(model, load_file(str(path / "model.safetensors")))
            optim_state = torch.load(path / "optimizer.pt", map_location="cpu", weights_only=True)
        load_full_state(model, optimizer, model_state, optim_state)
    else:
        device = next(model.parameters()).device
        _check_same_precision(path, model)
        missing_keys, unexpected = load_model(
            model, str(path / "model.safetensors"), strict=True, device=str(device)
        )
        if missing_keys or unexpected:
            raise ValueError(
                f"checkpoint {path} does not match the model: missing {missing_keys}, unexpected {unexpected}"
            )
        optimizer.load_state_dict(torch.load(path / "optimizer.pt", map_location=device, weights_only=True))
    sched_state = torch.load(path / "scheduler.pt", weights_only=True) if on_disk else None
    scheduler.load_state_dict(ctx.broadcast(sched_state) if sharded else sched_state)
    rng = torch.load(path / "rng.pt", weights_only=True) if on_disk else None
    if sharded:
        rng = ctx.broadcast(rng)
    torch.set_rng_state(rng["torch"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])
    random.setstate(_python_state_from_json(payload["python_random"]))
    return TrainingState(step=int(payload["step"]), extra=payload.get("extra", {}))


def _check_same_precision(path: Path, model: torch.nn.Module) -> None:
    """A resume continues in the precision it was written in: loading bf16 weights into an fp32 model (or
    the reverse) would silently round them or leave the optimizer without its fp32 master weights."""
    names = {"F32": torch.float32, "BF16": torch.bfloat16, "F16": torch.float16, "F64": torch.float64}
    with safe_open(str(path / "model.safetensors"), framework="pt") as f:
        saved = {k: names.get(f.get_slice(k).get_dtype()) for k in f.keys()}  # noqa: SIM118
    for name, param in model.named_parameters():
        if name in saved and saved[name] is not None and saved[name] != param.dtype:
            raise ValueError(
                f"checkpoint {path} holds {name} in {saved[name]} but the model is in {param.dtype}: "
                "resume with the run.dtype it was written with"
            )


def _tied_head(model: torch.nn.Module) -> bool:
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False))


def _untied(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The state without the tied output head (safetensors stores a shared tensor once, as save_model does)."""
    out = {k: v.contiguous() for k, v in state.items()}
    if _tied_head(model) and "lm_head.weight" in out:
        out.pop("lm_head.weight")
    return out


def _tied(model: torch.nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if _tied_head(model) and "lm_head.weight" not in state:
        state = {**state, "lm_head.weight": state["model.embed_tokens.weight"]}
    return state


def _python_state() -> list[Any]:
    version, internal, gauss = random.getstate()
    return [version, list(internal), gauss]


def _python_state_from_json(data: list[Any]) -> tuple[Any, ...]:
    version, internal, gauss = data
    return (version, tuple(internal), gauss)
