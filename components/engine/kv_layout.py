"""Who may see which KV entry in one flattened, shared-prefix cache (the stack-ml.md §2 recipe).

All sequences of a batch live in one cache; each decode step appends Q slots to every row (one per
token fed for that row, padded to the widest row). Every slot has an owner:

- ``SHARED`` (-1): the prompt and every token of the main stream, and a branch's tokens once merged;
  visible to every later query of the row;
- ``j >= 0``: a token of branch j of the open block; visible only to branch j's own later queries;
- ``PAD`` (-2): left padding, unused query slots, and (re-prefill merge) branch slots replaced by their
  re-read copies; visible to no real query.

Branches therefore share the prefix KV (no per-branch copy) and never see each other; at the merge their
slots are relabelled ``SHARED`` so the ``<takeaway>`` and everything after it sees all of them. Within one
step a query sees the step's new slots up to its own (causal), so several tokens of one stream can be fed
at once (a re-prefill). The mask's last dimension always equals cache length + Q (eager attention adds it
without slicing).

The owner labels live on the model's device in a buffer that doubles when full (like the KV cache), so a
decode step neither copies the labels of the whole cache nor ships a mask from host memory.
"""

from __future__ import annotations

import torch

SHARED = -1
PAD = -2


class SlotOwners:
    """Owner labels of every cached slot, ``(B, S)`` long, kept in step with the cache."""

    def __init__(self, owners: torch.Tensor) -> None:
        self._buf = owners.clone()
        self.length = int(owners.shape[1])

    @property
    def owners(self) -> torch.Tensor:
        """``(B, S)`` view of the labels of the filled slots."""
        return self._buf[:, : self.length]

    @classmethod
    def for_prefill(cls, real: torch.Tensor) -> SlotOwners:
        """``real``: ``(B, P)`` bool, True for prompt tokens, False for left padding."""
        return cls(torch.where(real, SHARED, PAD).long())

    def prefill_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive ``(B, 1, P, P)`` mask: causal over real prompt tokens, padding invisible."""
        owners = self.owners
        b, p = owners.shape
        causal = torch.ones(p, p, dtype=torch.bool, device=owners.device).tril()
        real_k = owners != PAD
        allowed = causal[None] & real_k[:, None, :]
        # A padding query sees itself only so its softmax row is well defined; its output is never read.
        allowed |= torch.eye(p, dtype=torch.bool, device=owners.device)[None] & ~real_k[:, :, None]
        return to_additive(allowed[:, None], dtype)

    def append(self, query_owners: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Register Q new slots per row (one per query) and return the step's additive mask.

        Args:
            query_owners: ``(B, Q)`` long, the owner of each query (its new slot gets the same owner).

        Returns:
            ``(B, 1, Q, S + Q)`` additive mask (0 = may attend, finfo.min = may not).
        """
        query_owners = query_owners.to(self._buf.device)
        n_past = self.length
        q_len = int(query_owners.shape[1])
        self._reserve(n_past + q_len)
        self._buf[:, n_past : n_past + q_len] = query_owners
        self.length = n_past + q_len
        k = self.owners[:, None, :]
        q = query_owners[:, :, None]
        allowed = (k == SHARED) | ((k == q) & (q != PAD))
        if q_len > 1:
            # within the step a query sees the new slots up to its own only (several tokens of one stream)
            later = torch.ones(q_len, q_len, dtype=torch.bool, device=allowed.device).triu(1)
            allowed[:, :, n_past:] &= ~later
        pad_q = q == PAD
        if bool(pad_q.any()):  # never in sequential mode: every live row feeds one real token
            # Padding queries see their own slot only (keeps softmax finite; output ignored).
            own = torch.zeros_like(allowed)
            own[:, :, n_past:] = torch.eye(q_len, dtype=torch.bool, device=allowed.device)[None]
            allowed = torch.where(pad_q, own, allowed)
        return to_additive(allowed[:, None], dtype)

    def merge_branches(self, row: int) -> None:
        """Make every branch slot of ``row`` shared (called when its block merges)."""
        r = self._buf[row, : self.length]
        self._buf[row, : self.length] = torch.where(r >= 0, SHARED, r)

    def hide_branches(self, row: int) -> None:
        """Make every branch slot of ``row`` invisible (a re-prefill merge feeds copies of them instead)."""
        r = self._buf[row, : self.length]
        self._buf[row, : self.length] = torch.where(r >= 0, PAD, r)

    def select_rows(self, keep: torch.Tensor) -> None:
        self._buf = self._buf[keep.to(self._buf.device)]

    @property
    def capacity(self) -> int:
        return int(self._buf.shape[1])

    def _reserve(self, n: int) -> None:
        if n <= self._buf.shape[1]:
            return
        grown = self._buf.new_full((self._buf.shape[0], max(n, 2 * self._buf.shape[1])), PAD)
        grown[:, : self.length] = self._buf[:, : self.length]
        self._buf = grown


def to_additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = may attend) -> additive float mask; finfo.min, never -inf (eager NaN pitfall)."""
    out = torch.zeros(allowed.shape, dtype=dtype, device=allowed.device)
    return out.masked_fill_(~allowed, torch.finfo(dtype).min)
