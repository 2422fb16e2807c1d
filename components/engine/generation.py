"""The one result type every engine backend returns."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from components.structure.merge import MergeSemantics


@dataclass
class BlockRecord:
    """One forked parallel block: where it starts in the response and how long each branch ran.

    ``start`` is the response index of the first branch's ``<step>``; ``branch_tokens[j]`` counts branch j's
    tokens from its ``<step>`` through its ``</step>`` (or to where it was cut off).
    """

    start: int
    depth: int
    labels: list[str]
    branch_tokens: list[int]
    merged: bool

    @property
    def n_branches(self) -> int:
        return len(self.branch_tokens)

    @property
    def saved_tokens(self) -> int:
        """Tokens a sequential decoder would spend on top of this block's critical path."""
        return sum(self.branch_tokens) - max(self.branch_tokens, default=0)


# The merge semantics (components.structure.merge) each way of continuing after a block samples exactly:
# the shared KV serves the branches as generated (isolated); a re-prefill reads them again as text (reread).
EXACT_SEMANTICS: dict[str, MergeSemantics] = {"shared_kv": "isolated", "reprefill": "reread"}


def exact_semantics(merge_mode: str) -> MergeSemantics:
    """The merge semantics a ``merge_mode`` samples exactly (``ValueError`` for an unknown mode)."""
    if merge_mode not in EXACT_SEMANTICS:
        raise ValueError(f"unknown merge_mode {merge_mode!r}: choose one of {', '.join(EXACT_SEMANTICS)}")
    return EXACT_SEMANTICS[merge_mode]


@dataclass
class Generation:
    """One sampled response.

    ``token_ids`` is the response in the canonical flattened layout (branches of a block one after another,
    in plan order), WITHOUT the stop token; ``logprobs[i]`` is ``log_softmax(model logits)[token_ids[i]]``
    computed from the token that precedes ``token_ids[i]`` in that flat layout, with the parallel mask and
    positions: exactly what a trainer recomputes teacher-forced with
    ``components.structure.parallel_attention_inputs``. It is the model's raw distribution, before
    temperature, top-p/top-k and repetition penalty. ``position_ids`` are the positions the engine used.
    ``forced[i]`` marks tokens the engine injected (``<step>`` + label at a fork, ``<takeaway>`` at a merge,
    a ``</step>`` closing a branch at ``max_step_tokens``, a forced response prefix).

    ``merge_mode`` says how the backend continued after a merged block: ``shared_kv`` (the torch engine:
    the branches' own KV, seen through the parallel mask at the canonical positions: exact) or
    ``reprefill`` (a server without a parallel mask: the branches re-read as one sequential text, so every
    token after the first merge was sampled from a slightly different context than the trainer's;
    ``components.structure.post_merge_mask`` marks them, and a trainer corrects them with a truncated
    importance weight).
    ``position_ids`` are always the canonical (trainer's) positions.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    text: str
    logprobs: list[float]
    position_ids: list[int]
    forced: list[bool]
    finish_reason: str
    stop_token_id: int | None = None
    stop_logprob: float | None = None
    blocks: list[BlockRecord] = field(default_factory=list)
    fork_refusals: list[str] = field(default_factory=list)
    wall_time_s: float = 0.0
    backend: str = "torch"
    merge_mode: str = "shared_kv"

    @property
    def parallel_taken(self) -> bool:
        """True when at least one block was really decoded as concurrent branches."""
        return any(b.n_branches >= 1 for b in self.blocks)

    @property
    def total_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def critical_path_tokens(self) -> int:
        """Tokens on the longest dependency chain: the decode steps an ideal parallel engine needs."""
        return self.total_tokens - sum(b.saved_tokens for b in self.blocks)

    @property
    def merge_semantics(self) -> MergeSemantics:
        """The merge semantics this response was sampled in exactly (``exact_semantics(merge_mode)``)."""
        return exact_semantics(self.merge_mode)

    @property
    def branches_per_block(self) -> list[int]:
        return [b.n_branches for b in self.blocks]

    def structure(self) -> dict[str, Any]:
        """The JSON-ready structure summary stored in trajectory records."""
        return {
            "parallel_taken": self.parallel_taken,
            "branches_per_block": self.branches_per_block,
            "blocks": [asdict(b) for b in self.blocks],
            "fork_refusals": list(self.fork_refusals),
            "total_tokens": self.total_tokens,
            "critical_path_tokens": self.critical_path_tokens,
            "merge_mode": self.merge_mode,
            "merge_semantics": self.merge_semantics,
        }
