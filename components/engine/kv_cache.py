"""The engine's KV cache: one preallocated buffer per layer, written in place.

transformers' ``DynamicLayer`` appends with ``torch.cat``, which copies the whole cache of every layer at
every decode step (quadratic in the response length; 17% of a tiny-model decode step at batch 256 on CPU).
``GrowingLayer`` keeps keys and values in a buffer with spare room, writes a step's Q new slots into it, and
doubles the buffer when it is full, so appending is amortised O(Q). What attention reads is the filled
prefix, a view; numbers are the same as ``DynamicCache`` (tests/unit/engine/test_kv_cache.py).
"""

from __future__ import annotations

from typing import Any

import torch
from transformers.cache_utils import Cache, DynamicLayer


class GrowingLayer(DynamicLayer):
    """One layer's ``(B, H_kv, S, D)`` keys and values in a buffer of ``capacity >= S`` slots."""

    def __init__(self, capacity_hint: int = 0) -> None:
        super().__init__()
        self.capacity_hint = capacity_hint
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self._keys = key_states.new_empty((b, h, self.capacity_hint, d))
        self._values = value_states.new_empty((b, h, self.capacity_hint, value_states.shape[-1]))
        self.length = 0
        self.is_initialized = True

    def update(
        self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self._keys.shape[-2]:
            capacity = max(end, 2 * self._keys.shape[-2])
            self._keys = _resized(self._keys, capacity, self.length)
            self._values = _resized(self._values, capacity, self.length)
        self._keys[:, :, self.length : end] = key_states
        self._values[:, :, self.length : end] = value_states
        self.length = end
        self._expose()
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length if self.is_initialized else 0

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.get_seq_length() > 0:
            self._keys = self._keys[indices]
            self._values = self._values[indices]
            self._expose()

    def _expose(self) -> None:
        self.keys = self._keys[:, :, : self.length]
        self.values = self._values[:, :, : self.length]


def _resized(buffer: torch.Tensor, capacity: int, filled: int) -> torch.Tensor:
    out = buffer.new_empty((*buffer.shape[:2], capacity, buffer.shape[-1]))
    out[:, :, :filled] = buffer[:, :, :filled]
    return out


def growing_cache(model: Any, capacity_hint: int) -> Cache:
    """A cache of ``GrowingLayer`` for every decoder layer of ``model``, each sized for ``capacity_hint`` slots."""
    n_layers = model.config.get_text_config().num_hidden_layers
    return Cache(layers=[GrowingLayer(capacity_hint) for _ in range(n_layers)])
