"""SFT examples: records -> (prompt, response) token ids -> padded batches with masks, positions, targets.

Every sample is ``render_prompt(problem)`` (the exact prompt the engine and evaluation use) followed by the
response and the end-of-turn token. The prompt and the response are tokenised separately, as the engine
sees them (prompt ids, then generated ids), so no BPE merge crosses the boundary.

Loss targets are given by *parents*: token ``t`` is predicted from the logits at ``parent[t]``, the last
position before ``t`` that ``t`` may attend to. In a causal sequence that is ``t - 1``. In a parallel
layout it is what the engine does when it forks and merges: the first token of every step is predicted
from the fork anchor (``</guideline>``), not from the end of the previous sibling step, which that step
cannot see; the merge token (``<takeaway>``) is predicted from the last token before it. This makes the
loss of a trace equal to the sum of the losses of its branches run in isolation (tested).

Nothing is dropped silently: ``prepare_examples`` returns the kept examples and one ``Rejection`` (record
index, id, reason, detail) for every record it could not use.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from components.prompts import PromptConfig, render_prompt
from components.structure import (
    MergeSemantics,
    StructureError,
    TagIds,
    lay_out,
    normalize_layout_result,
    parallel_segments,
    prediction_sources,
)

Mode = Literal["parallel", "sequential"]
END_OF_TURN = "<|im_end|>"


@dataclass(frozen=True)
class SFTExample:
    """One training sequence: ``input_ids = prompt ids + response ids + end-of-turn``; loss after ``n_prompt``."""

    input_ids: tuple[int, ...]
    n_prompt: int
    index: int = -1  # position of the source record in its input (for reports)

    @property
    def n_response(self) -> int:
        return len(self.input_ids) - self.n_prompt


@dataclass(frozen=True)
class Rejection:
    """A record that did not become a training example, and why."""

    index: int
    record_id: str | None
    reason: str
    detail: str = ""


@dataclass
class PreparedData:
    examples: list[SFTExample]
    rejections: list[Rejection] = field(default_factory=list)
    n_records: int = 0
    n_normalized: int = 0

    def summary(self) -> dict[str, Any]:
        """Counts that reconcile: ``n_records == n_examples + n_rejected``."""
        return {
            "n_records": self.n_records,
            "n_examples": len(self.examples),
            "n_rejected": len(self.rejections),
            "n_normalized": self.n_normalized,
            "rejected_by_reason": dict(sorted(Counter(r.reason for r in self.rejections).items())),
        }


@dataclass
class SFTBatch:
    """A padded batch (right padding).

    Shapes: ``input_ids`` long[B, L]; ``attention_mask`` long[B, L] (sequential: padding mask, the model
    adds causality) or bool[B, 1, L, L] (parallel: True = may attend); ``position_ids`` long[B, L] or None;
    ``parents`` long[B, L] (position whose logits predict each token); ``loss_mask`` bool[B, L] (True on
    response tokens, end-of-turn included); ``lengths`` long[B] (tokens of each row before its padding).
    """

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    position_ids: torch.Tensor | None
    parents: torch.Tensor
    loss_mask: torch.Tensor
    lengths: torch.Tensor

    @property
    def n_loss_tokens(self) -> int:
        return int(self.loss_mask.sum())

    @property
    def n_tokens(self) -> int:
        """Non-pad tokens (prompt + response)."""
        return int(self.lengths.sum())


def end_of_turn_id(tokenizer: Any) -> int:
    """``<|im_end|>`` when the tokenizer has it (Qwen chat models), else the EOS token."""
    token_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
    if isinstance(token_id, int) and token_id != tokenizer.unk_token_id and token_id is not None:
        return token_id
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has neither <|im_end|> nor an EOS token to end the assistant turn")
    return int(tokenizer.eos_token_id)


def encode_example(tokenizer: Any, prompt: str, response: str, index: int = -1) -> SFTExample:
    """Tokenise prompt and response separately and append the end-of-turn token."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    response_ids = tokenizer.encode(response, add_special_tokens=False)
    return SFTExample(tuple(prompt_ids + response_ids + [end_of_turn_id(tokenizer)]), len(prompt_ids), index)


def prepare_examples(
    records: Sequence[dict[str, Any]],
    tokenizer: Any,
    prompts_cfg: PromptConfig,
    *,
    mode: Mode,
    prompt_style: str,
    schema_name: str,
    max_length: int,
) -> PreparedData:
    """Accepted-trajectory records ``{problem, response, ...}`` -> examples, with every rejection recorded.

    Responses are normalised to the engine's canonical layout first (``n_normalized`` counts the ones the
    normaliser changed). Reasons: ``missing_field``, ``over_length`` (> ``max_length`` tokens), and, in
    parallel mode, ``structure:<code>`` (the mask builder raised ``StructureError``).
    """
    tags = TagIds.from_tokenizer(tokenizer, schema_name) if mode == "parallel" else None
    prepared = PreparedData(examples=[], n_records=len(records))
    for index, record in enumerate(records):
        record_id = record.get("problem_id") or record.get("id")
        problem, response = record.get("problem"), record.get("response")
        if not isinstance(problem, str) or not isinstance(response, str) or not problem.strip():
            prepared.rejections.append(
                Rejection(index, record_id, "missing_field", "needs 'problem' and 'response'")
            )
            continue
        # An invalid trace comes back unchanged; parallel mode then rejects it below with the parser's code.
        layout = normalize_layout_result(response, schema_name)
        response = layout.text
        prepared.n_normalized += int(layout.normalized and layout.removed_chars > 0)
        prompt = render_prompt(tokenizer, problem, prompts_cfg, prompt_style)
        example = encode_example(tokenizer, prompt, response, index)
        if len(example.input_ids) > max_length:
            detail = f"{len(example.input_ids)} tokens > max_length {max_length}"
            prepared.rejections.append(Rejection(index, record_id, "over_length", detail))
            continue
        if tags is not None:
            try:
                check_parallel_structure(example, tags)
            except StructureError as err:
                prepared.rejections.append(Rejection(index, record_id, f"structure:{err.code}", str(err)))
                continue
        prepared.examples.append(example)
    return prepared


def check_parallel_structure(example: SFTExample, tags: Any) -> None:
    """Raise ``StructureError`` when the response cannot be given a parallel mask (O(L), no dense mask)."""
    parallel_segments(example.input_ids, tags, start=example.n_prompt)


def causal_parents(length: int) -> torch.Tensor:
    """``parent[t] = t - 1`` (``parent[0] = 0``; position 0 is always a prompt token). Shape long[L]."""
    return (torch.arange(length) - 1).clamp_min(0)


def parents_from_mask(mask: torch.Tensor) -> torch.Tensor:
    """long[B, L]: the position whose logits predict each token (``components.structure.prediction_sources``)."""
    return prediction_sources(mask)


def collate(
    examples: Sequence[SFTExample],
    mode: Mode,
    pad_id: int,
    tags: Any = None,
    merge: MergeSemantics = "isolated",
) -> SFTBatch:
    """Right-pad ``examples`` into an ``SFTBatch`` (parallel mode builds the 4D bool mask and positions
    under the merge semantics ``merge``; under ``reread`` the rows hold loss-free re-read copies, so a
    row's laid-out length can exceed its example's)."""
    if not examples:
        raise ValueError("collate needs at least one example")
    if mode == "parallel":
        return _collate_parallel(examples, pad_id, tags, merge)
    length = max(len(e.input_ids) for e in examples)
    batch = len(examples)
    lengths = torch.tensor([len(e.input_ids) for e in examples], dtype=torch.long)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)
    loss_mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, example in enumerate(examples):
        input_ids[row, : len(example.input_ids)] = torch.tensor(example.input_ids)
        loss_mask[row, example.n_prompt : len(example.input_ids)] = True
    if mode == "sequential":
        attention_mask = torch.zeros(batch, length, dtype=torch.long)
        for row, example in enumerate(examples):
            attention_mask[row, : len(example.input_ids)] = 1
        parents = causal_parents(length).expand(batch, length).clone()
        return SFTBatch(input_ids, attention_mask, None, parents, loss_mask, lengths)
    raise ValueError(f"unknown collation mode {mode!r}")


def _collate_parallel(
    examples: Sequence[SFTExample], pad_id: int, tags: Any, merge: MergeSemantics
) -> SFTBatch:
    if tags is None:
        raise ValueError("parallel collation needs the schema's TagIds")
    laid = lay_out(
        [torch.tensor(e.input_ids) for e in examples],
        tags,
        starts=[e.n_prompt for e in examples],
        merge=merge,
        pad_id=pad_id,
    )
    batch, length = laid.input_ids.shape
    loss_mask = torch.zeros(batch, length, dtype=torch.bool)
    for row, example in enumerate(examples):
        # the response's own tokens, wherever the layout put them (never a re-read copy)
        loss_mask[row, laid.index[row, example.n_prompt : len(example.input_ids)]] = True
    lengths = laid.segments.lengths.clone()
    mask = laid.segments.dense_mask()
    return SFTBatch(laid.input_ids, mask, laid.position_ids, parents_from_mask(mask), loss_mask, lengths)
