"""Rollouts as training tensors, and the policy forward that scores them (one call for the whole batch).

Layout: each row is ``prompt + response`` right-padded to the batch's longest row. Response-aligned tensors
(``(bs, R)``, verl's layout) are indexed through ``response_index``; their log-probs come from the chunked
scorer (``components.training.token_logprobs``), never from a ``(bs, R, V)`` logits tensor.

Sequential visibility (NPR-Zero, SR) uses a 2D padding mask and ordinary positions. Parallel visibility
(PAPO) uses the canonical builder ``components.structure.lay_out`` under the trainer's merge semantics: one
4D bool mask ``(bs, 1, L, L)`` with each row's own sibling-step blocking, and its position ids, so the whole
batch goes through the model in a single forward (the public NPR actor loops over samples one by one).
Under ``reread`` a row also holds loss-free re-read copies of branches 2..k after each merged block;
``response_index`` skips them.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch

from components.structure import (
    MergeSemantics,
    StructureError,
    TagIds,
    lay_out,
    parallel_segments,
    parse_ids,
    prediction_sources,
    to_additive_mask,
)
from components.training.batching import length_sorted_splits
from components.training.token_logprobs import DEFAULT_CHUNK_TOKENS, token_log_probs


@dataclass
class Rollout:
    """One sampled response to one prompt, with what grading said about it."""

    group_id: str
    problem_id: str
    answer: str
    prompt_ids: list[int]
    response_ids: list[int]  # the engine's response plus its stop token when it stopped on one
    text: str
    finish_reason: str
    parallel_taken: bool
    reward: float = 0.0
    correct: bool = False
    valid: bool = False
    format_score: float = 0.0
    extra: dict[str, Any] = field(default_factory=dict)
    # where a parallel engine forked: the response index of each forked block's first ``<step>``
    # (``BlockRecord.start`` of ``Generation.blocks``); None for a sequential engine, whose rollouts are
    # trained with sequential visibility and never laid out as blocks
    forked_at: tuple[int, ...] | None = None

    @property
    def truncated(self) -> bool:
        return self.finish_reason == "length"


@dataclass
class PolicyBatch:
    """Padded tensors of a list of rollouts.

    Shapes: ``input_ids``/``position_ids`` ``(bs, L)``; ``attention_mask`` ``(bs, L)`` long (sequential) or
    ``(bs, 1, L, L)`` bool (parallel, True = may attend); ``response_index``/``response_mask`` ``(bs, R)``.
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor
    response_index: torch.Tensor
    response_mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.input_ids.shape[0])

    @property
    def parallel(self) -> bool:
        return self.attention_mask.dim() == 4

    @property
    def device(self) -> torch.device:
        return self.input_ids.device

    def to(self, device: torch.device | str) -> PolicyBatch:
        """The same batch with every tensor on ``device`` (itself when already there)."""
        if self.input_ids.device == torch.device(device):
            return self
        return PolicyBatch(
            *(t.to(device) for t in (self.input_ids, self.attention_mask, self.position_ids)),
            self.response_index.to(device),
            self.response_mask.to(device),
        )


# A parallel engine's rollout with two or more steps in a block the engine did not fork (``plan_fork`` refused it: more
# plans than max_branches, the token budget, ...; the main stream then goes on and the model may write the
# steps itself). Those steps were sampled seeing each other at sequential positions; the parallel layout
# hides sibling steps from each other and restarts their positions, so training on it would score tokens
# under a context they were never sampled in (off-policy by up to the whole block).
UNFORKED_STEPS = "unforked_steps"


def structural_violation(rollout: Rollout, tags: TagIds) -> StructureError | None:
    """The canonical mask builder's error for this rollout's response, or None if it accepts it. Its
    ``code`` is one of a fixed set (``components.structure.score.PENALTIES``, ``malformed``, or
    ``UNFORKED_STEPS`` for a parallel engine's rollout, ``forked_at`` set, with a block of two or more steps
    the engine did not fork): what metric names may carry; its message (reason and token offset) is free text
    for the stage's records."""
    ids = rollout.prompt_ids + rollout.response_ids
    start = len(rollout.prompt_ids)
    try:
        parallel_segments(ids, tags, start=start)
    except StructureError as err:
        return err
    if rollout.forked_at is None:
        return None
    blocks = parse_ids(ids, tags, start=start, check_content=False).all_blocks()
    # response indices of the blocks whose layout is not the sequential text: one step reads as it was written
    written = [blk.steps[0].span.start - start for blk in blocks if blk.branches >= 2]
    unforked = [at for at in written if at not in set(rollout.forked_at)]
    if unforked:
        return StructureError(
            f"{len(unforked)} of {len(written)} blocks' steps were written in the main stream, not forked by "
            "the engine (a refused fork)",
            unforked[0] + start,
            UNFORKED_STEPS,
        )
    return None


def structural_rejection(rollout: Rollout, tags: TagIds) -> str | None:
    """The category (``structural_violation``'s ``code``, a fixed set) of why this rollout is rejected, or
    None if it is accepted: what the local trainer and verl's agent loop both name their
    ``rollout/rejected/<code>`` counts after (free text with token offsets would make a metric per trace)."""
    err = structural_violation(rollout, tags)
    return None if err is None else err.code


def response_mask_of(rollouts: list[Rollout]) -> torch.Tensor:
    """``(bs, R)`` float mask of the response tokens, ``R`` = the longest response (a PolicyBatch's layout)."""
    mask = torch.zeros(len(rollouts), max(len(r.response_ids) for r in rollouts), dtype=torch.float32)
    for b, r in enumerate(rollouts):
        mask[b, : len(r.response_ids)] = 1.0
    return mask


def build_policy_batch(
    rollouts: list[Rollout], pad_id: int, tags: TagIds | None = None, merge: MergeSemantics = "isolated"
) -> PolicyBatch:
    """Pad rollouts into a ``PolicyBatch``; with ``tags`` the attention is the parallel 4D mask under the
    merge semantics ``merge`` (``components.structure.merge``).

    Raises ValueError for an empty list or a rollout without response tokens, and StructureError (from the
    canonical builder) when ``tags`` is given and a response is malformed: filter first.
    """
    if not rollouts:
        raise ValueError("cannot build a policy batch from no rollouts")
    if any(not r.response_ids for r in rollouts):
        raise ValueError("every rollout needs at least one response token")
    seqs = [r.prompt_ids + r.response_ids for r in rollouts]
    starts = [len(r.prompt_ids) for r in rollouts]
    bs, length = len(seqs), max(len(s) for s in seqs)
    resp_len = max(len(r.response_ids) for r in rollouts)
    response_mask = response_mask_of(rollouts)
    if tags is not None:
        laid = lay_out(seqs, tags, starts=starts, merge=merge, pad_id=pad_id)
        response_index = torch.zeros(bs, resp_len, dtype=torch.long)
        for b, (start, r) in enumerate(zip(starts, rollouts, strict=True)):
            n = len(r.response_ids)
            response_index[b, :n] = laid.index[b, start : start + n]
            # padding columns point at the row's last real token; they are masked out of every loss
            response_index[b, n:] = laid.index[b, start + n - 1]
        return PolicyBatch(
            laid.input_ids, laid.segments.dense_mask(), laid.position_ids, response_index, response_mask
        )

    input_ids = torch.full((bs, length), pad_id, dtype=torch.long)
    for b, s in enumerate(seqs):
        input_ids[b, : len(s)] = torch.tensor(s, dtype=torch.long)
    response_index = torch.zeros(bs, resp_len, dtype=torch.long)
    for b, seq in enumerate(seqs):
        # padding columns point at the row's last real token; they are masked out of every loss
        response_index[b] = torch.clamp(torch.arange(resp_len) + starts[b], max=len(seq) - 1)
    attention_mask = torch.zeros(bs, length, dtype=torch.long)
    for b, s in enumerate(seqs):
        attention_mask[b, : len(s)] = 1
    position_ids = torch.arange(length).unsqueeze(0).expand(bs, -1).clone()
    return PolicyBatch(input_ids, attention_mask, position_ids, response_index, response_mask)


def length_sorted_micro_batches(
    rollouts: list[Rollout], indices: list[int], size: int | None
) -> list[list[int]]:
    """``indices`` (into ``rollouts``) as micro-batches of at most ``size`` rollouts of similar prompt +
    response length (``components.training.batching``); ``size=None``: one micro-batch, in the given order."""
    if size is not None and size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {size}")
    n_splits = 1 if size is None else math.ceil(len(indices) / size)
    lengths = [len(rollouts[i].prompt_ids) + len(rollouts[i].response_ids) for i in indices]
    return length_sorted_splits(list(indices), lengths, n_splits)


def _model_mask(model: Any, mask: torch.Tensor) -> torch.Tensor:
    if mask.dim() != 4:
        return mask
    # eager attention adds the mask to the scores: a bool mask there is silently wrong (stack-ml.md §2)
    if getattr(model.config, "_attn_implementation", "sdpa") == "eager":
        return to_additive_mask(mask, next(model.parameters()).dtype)
    return mask


def response_log_probs(
    model: Any,
    batch: PolicyBatch,
    temperature: float = 1.0,
    with_entropy: bool = False,
    chunk_tokens: int = DEFAULT_CHUNK_TOKENS,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Log-probabilities of the response tokens under ``model`` in one forward call.

    The vocabulary projection runs over ``chunk_tokens`` response tokens at a time
    (``components.training.token_logprobs``): no ``(bs, R, V)`` fp32 tensor is ever built.

    Args:
        model: a causal LM taking ``input_ids``, ``attention_mask`` (2D or 4D), ``position_ids``.
        batch: the padded rollouts (moved to the model's device here when they are elsewhere).
        temperature: logits are divided by it, as verl's actor does with the rollout temperature.
        with_entropy: also return the per-token entropy (detached).

    Returns:
        ``log_prob`` ``(bs, R)`` float32 on the model's device (zero on padding; carries the gradient) and
        ``entropy`` ``(bs, R)`` or None.
    """
    batch = batch.to(next(model.parameters()).device)
    if batch.parallel:
        # parallel layout: a token is predicted from the last earlier position it can see (a step's first
        # token from where the engine forked it), the same rule as SFT and the engine's recorded logprobs
        source_index = prediction_sources(batch.attention_mask).gather(1, batch.response_index)
    else:
        source_index = (batch.response_index - 1).clamp(min=0)  # causal: token j is predicted at j - 1
    return token_log_probs(
        model,
        batch.input_ids,
        _model_mask(model, batch.attention_mask),
        batch.position_ids,
        source_index,
        batch.input_ids.gather(1, batch.response_index),
        batch.response_mask,
        temperature=temperature,
        with_entropy=with_entropy,
        chunk_tokens=chunk_tokens,
    )
