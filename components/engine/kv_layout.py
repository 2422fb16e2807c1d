"""Who may see which KV entry in one flattened, shared-prefix cache (the stack-ml.md §2 recipe).

All sequences of a batch live in one ``DynamicCache``; each decode step appends Q slots to every row (one
per active stream of that row, padded to the widest row). Every slot has an owner:

- ``SHARED`` (-1): the prompt and every token of the main stream, and a branch's tokens once merged;
  visible to every later query of the row;
- ``j >= 0``: a token of branch j of the open block; visible only to branch j's own later queries;
- ``PAD`` (-2): left padding and unused query slots; visible to no real query.

Branches therefore share the prefix KV (no per-branch copy) and never see each other; at the merge their
slots are relabelled ``SHARED`` so the ``<takeaway>`` and everything after it sees all of them. The mask's
last dimension always equals cache length + Q (eager attention adds it without slicing).
"""

from __future__ import annotations

import torch

SHARED = -1
PAD = -2


class SlotOwners:
    """Owner labels of every cached slot, ``(B, S)`` long, kept in step with the cache."""

    def __init__(self, owners: torch.Tensor) -> None:
        self.owners = owners

    @classmethod
    def for_prefill(cls, real: torch.Tensor) -> SlotOwners:
        """``real``: ``(B, P)`` bool, True for prompt tokens, False for left padding."""
        return cls(torch.where(real, SHARED, PAD).long())

    def prefill_mask(self, dtype: torch.dtype) -> torch.Tensor:
        """Additive ``(B, 1, P, P)`` mask: causal over real prompt tokens, padding invisible."""
        b, p = self.owners.shape
        causal = torch.ones(p, p, dtype=torch.bool).tril()
        real_k = self.owners != PAD
        allowed = causal[None] & real_k[:, None, :]
        # A padding query sees itself only so its softmax row is well defined; its output is never read.
        allowed |= torch.eye(p, dtype=torch.bool)[None] & ~real_k[:, :, None]
        return to_additive(allowed[:, None], dtype)

    def append(self, query_owners: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Register Q new slots per row (one per query) and return the step's additive mask.

        Args:
            query_owners: ``(B, Q)`` long, the owner of each query (its new slot gets the same owner).

        Returns:
            ``(B, 1, Q, S + Q)`` additive mask (0 = may attend, finfo.min = may not).
        """
        self.owners = torch.cat([self.owners, query_owners], dim=1)
        k = self.owners[:, None, :]
        q = query_owners[:, :, None]
        allowed = (k == SHARED) | ((k == q) & (q != PAD))
        pad_q = q == PAD
        if bool(pad_q.any()):  # never in sequential mode: every live row feeds one real token
            # Padding queries see their own slot only (keeps softmax finite; output ignored).
            n_past = self.owners.shape[1] - query_owners.shape[1]
            own = torch.zeros_like(allowed)
            own[:, :, n_past:] = torch.eye(query_owners.shape[1], dtype=torch.bool)[None]
            allowed = torch.where(pad_q, own, allowed)
        return to_additive(allowed[:, None], dtype)

    def merge_branches(self, row: int) -> None:
        """Make every branch slot of ``row`` shared (called when its block merges)."""
        r = self.owners[row]
        self.owners[row] = torch.where(r >= 0, SHARED, r)

    def select_rows(self, keep: torch.Tensor) -> None:
        self.owners = self.owners[keep]


def to_additive(allowed: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Bool mask (True = may attend) -> additive float mask; finfo.min, never -inf (eager NaN pitfall)."""
    return torch.where(allowed, 0.0, torch.finfo(dtype).min).to(dtype)
