"""Measured memory of a block of torch work: CUDA's allocator statistics, or live tensor bytes on the CPU.

The planner (``components.training.memory``) is tested against what this measures on the tiny model, and
the device smoke script prints both side by side. On CUDA the numbers are the caching allocator's
``max_memory_allocated`` (bytes held by live tensors at the peak). The CPU has no such counter, so
``LiveTensorBytes`` follows every storage an operator creates while it is active (a ``TorchDispatchMode``;
a storage is released when its last tensor dies) and records the peak of their total: the same quantity,
counted per tensor. Tensors that existed before the block (weights, say) are not counted.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


@dataclass
class MemoryReading:
    """Bytes allocated by a block: at its peak, still held at its end, and its largest single tensor."""

    peak_bytes: int = 0
    end_bytes: int = 0
    largest_bytes: int = 0
    largest: str = ""
    device: str = "cpu"
    extra: dict[str, Any] = field(default_factory=dict)


class LiveTensorBytes(TorchDispatchMode):
    """Peak bytes of storages created on ``device_type`` while active (see the module docstring)."""

    def __init__(self, device_type: str = "cpu", record_shapes: bool = False) -> None:
        super().__init__()
        self.device_type = device_type
        self.record_shapes = record_shapes
        self.shapes: list[tuple[tuple[int, ...], int]] = []  # (shape, bytes) of every new storage
        self.live: dict[int, int] = {}
        self.current = 0
        self.reading = MemoryReading(device=device_type)

    def _release(self, key: int) -> None:
        self.current -= self.live.pop(key, 0)

    def _track(self, tensor: torch.Tensor, op: Any) -> None:
        storage = tensor.untyped_storage()
        key, size = storage.data_ptr(), storage.nbytes()
        if size == 0 or key in self.live:
            return
        self.live[key] = size
        self.current += size
        if self.record_shapes:
            self.shapes.append((tuple(tensor.shape), size))
        if size > self.reading.largest_bytes:
            self.reading.largest_bytes = size
            self.reading.largest = f"{op}: {tuple(tensor.shape)} {tensor.dtype}"
        self.reading.peak_bytes = max(self.reading.peak_bytes, self.current)
        weakref.finalize(storage, self._release, key)

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        # an output that shares an input's storage (a view, an in-place or out= op) is no new memory;
        # counting it would count pre-existing weights seen through a transpose
        inputs = {
            t.untyped_storage().data_ptr()
            for t in tree_flatten((args, kwargs))[0]
            if isinstance(t, torch.Tensor) and t.device.type == self.device_type
        }
        for value in tree_flatten(out)[0]:
            if (
                isinstance(value, torch.Tensor)
                and value.device.type == self.device_type
                and value.untyped_storage().data_ptr() not in inputs
            ):
                self._track(value, func)
        return out

    def __exit__(self, *exc: Any) -> Any:
        self.reading.end_bytes = self.current
        return super().__exit__(*exc)


@contextmanager
def measure(device: torch.device | str, record_shapes: bool = False) -> Iterator[MemoryReading]:
    """Measure the block's allocations on ``device`` (CUDA allocator stats there, live tensors on CPU;
    ``record_shapes``: the CPU reading's ``extra["shapes"]`` lists every new storage's shape and bytes)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        base = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        reading = MemoryReading(device=str(device))
        yield reading
        torch.cuda.synchronize(device)
        reading.peak_bytes = torch.cuda.max_memory_allocated(device) - base
        reading.end_bytes = torch.cuda.memory_allocated(device) - base
        return
    mode = LiveTensorBytes(device.type, record_shapes)
    mode.reading.extra["shapes"] = mode.shapes
    with mode:
        yield mode.reading
