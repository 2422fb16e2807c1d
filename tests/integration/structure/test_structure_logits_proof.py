"""The logits proof: under the parallel mask and positions, every step token of a block gets exactly the
logits it would get if its step were the only continuation of the prefix, run as an ordinary sequence.

A randomly initialised tiny Qwen3 is built from a config (no download). Both attention implementations
are checked; eager needs the additive mask, and a bool mask under eager is shown to be wrong (the trap).
"""

from __future__ import annotations

import pytest
import torch
from transformers import Qwen3Config, Qwen3ForCausalLM

from components.structure import (
    MULTIVERSE,
    NPR,
    TagIds,
    batch_parallel_attention_inputs,
    parallel_attention_inputs,
    parse_ids,
    to_additive_mask,
)

VOCAB = 64
TEXT_VOCAB = 40  # ids below this are text; tags live above
TOL = 1e-4


@pytest.fixture(scope="module")
def model() -> Qwen3ForCausalLM:
    torch.manual_seed(0)
    config = Qwen3Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=256,
        rope_theta=10000.0,
    )
    return Qwen3ForCausalLM(config).eval()


def _tags(schema) -> TagIds:  # noqa: ANN001
    return TagIds(schema, {t: TEXT_VOCAB + i for i, t in enumerate(schema.tags)})


def _text(n: int, gen: torch.Generator) -> list[int]:
    return torch.randint(0, TEXT_VOCAB, (n,), generator=gen).tolist()


def _npr_sequence(tags: TagIds, gen: torch.Generator, step_lengths: list[int]) -> tuple[list[int], int]:
    t = tags.ids
    prompt = _text(7, gen)
    ids = prompt + [t["<guideline>"]]
    for _ in step_lengths:
        ids += [t["<plan>"], *_text(3, gen), t["</plan>"]]
    ids.append(t["</guideline>"])
    for n in step_lengths:  # canonical layout: steps back to back
        ids += [t["<step>"], *_text(n, gen), t["</step>"]]
    ids += [t["<takeaway>"], *_text(2, gen), t["</takeaway>"], *_text(3, gen)]
    return ids, len(prompt)


def _logits(model: Qwen3ForCausalLM, impl: str, ids: list[int], mask=None, pos=None) -> torch.Tensor:  # noqa: ANN001
    model.set_attn_implementation(impl)
    with torch.no_grad():
        out = model(
            input_ids=torch.tensor([ids]),
            attention_mask=None if mask is None else mask[None, None],
            position_ids=None if pos is None else pos[None],
            use_cache=False,
        )
    return out.logits[0]


def _parallel_mask(mask: torch.Tensor, kind: str) -> torch.Tensor:
    return to_additive_mask(mask, torch.float32) if kind == "additive" else mask


@pytest.mark.parametrize(("impl", "kind"), [("eager", "additive"), ("sdpa", "additive"), ("sdpa", "bool")])
def test_step_logits_equal_isolated_runs(model: Qwen3ForCausalLM, impl: str, kind: str) -> None:
    tags = _tags(NPR)
    ids, start = _npr_sequence(tags, torch.Generator().manual_seed(1), step_lengths=[3, 6, 4])
    mask, pos = parallel_attention_inputs(ids, tags, start)
    logits = _logits(model, impl, ids, _parallel_mask(mask, kind), pos)
    (block,) = parse_ids(ids, tags, start=start).blocks
    assert len(block.steps) == 3
    prefix = ids[: block.anchor + 1]
    for step in block.steps:
        a, b = step.span
        alone = _logits(model, impl, prefix + ids[a:b])[len(prefix) :]
        diff = (logits[a:b] - alone).abs().max().item()
        assert diff <= TOL, f"{impl}/{kind}: step at {a} differs by {diff}"
    # The steps really do differ from a plain causal run (the mask matters for this model and data).
    plain = _logits(model, impl, ids)
    last = block.steps[-1].span
    assert (plain[last.start : last.end] - logits[last.start : last.end]).abs().max().item() > 1e-3


def test_bool_mask_under_eager_is_wrong(model: Qwen3ForCausalLM) -> None:
    """The trap: eager adds the mask to the scores, so True/False becomes +1/0 and nothing is masked."""
    tags = _tags(NPR)
    ids, start = _npr_sequence(tags, torch.Generator().manual_seed(1), step_lengths=[3, 6, 4])
    mask, pos = parallel_attention_inputs(ids, tags, start)
    right = _logits(model, "eager", ids, to_additive_mask(mask, torch.float32), pos)
    wrong = _logits(model, "eager", ids, mask, pos)
    assert (right - wrong).abs().max().item() > 1e-2


def test_nested_multiverse_paths_equal_isolated_runs(model: Qwen3ForCausalLM) -> None:
    tags = _tags(MULTIVERSE)
    t, gen = tags.ids, torch.Generator().manual_seed(2)

    def goal(n: int) -> list[int]:
        out = [t["<Goal>"]]
        for _ in range(n):
            out += [t["<Outline>"], *_text(2, gen), t["</Outline>"]]
        return [*out, t["</Goal>"]]

    inner = [t["<Parallel>"], *goal(2)]
    inner_paths = [[t["<Path>"], *_text(n, gen), t["</Path>"]] for n in (2, 5)]
    inner_tail = [t["<Conclusion>"], *_text(2, gen), t["</Conclusion>"], t["</Parallel>"]]
    outer_path1 = [
        t["<Path>"],
        *_text(3, gen),
        *inner,
        *inner_paths[0],
        *inner_paths[1],
        *inner_tail,
        *_text(2, gen),
        t["</Path>"],
    ]
    outer_path2 = [t["<Path>"], *_text(4, gen), t["</Path>"]]
    prefix = _text(5, gen) + [t["<Parallel>"], *goal(2)]
    ids = (
        prefix
        + outer_path1
        + outer_path2
        + [t["<Conclusion>"], *_text(2, gen), t["</Conclusion>"], t["</Parallel>"]]
    )
    mask, pos = parallel_attention_inputs(ids, tags)
    for impl in ("eager", "sdpa"):
        logits = _logits(model, impl, ids, to_additive_mask(mask), pos)
        # Inner paths see: prefix, the outer path up to the inner </Goal>, and themselves.
        inner_prefix = prefix + outer_path1[: 4 + len(inner)]
        at = len(inner_prefix)
        for path in inner_paths:
            alone = _logits(model, impl, inner_prefix + path)[len(inner_prefix) :]
            assert (logits[at : at + len(path)] - alone).abs().max().item() <= TOL
            at += len(path)
        # The second outer path sees the prefix and itself only.
        at = len(prefix) + len(outer_path1)
        alone = _logits(model, impl, prefix + outer_path2)[len(prefix) :]
        assert (logits[at : at + len(outer_path2)] - alone).abs().max().item() <= TOL


def test_padded_batch_matches_single_runs(model: Qwen3ForCausalLM) -> None:
    tags = _tags(NPR)
    gen = torch.Generator().manual_seed(3)
    seqs = [_npr_sequence(tags, gen, [3, 6, 4]), _npr_sequence(tags, gen, [2, 2])]
    ids = [s for s, _ in seqs]
    mask, pos = batch_parallel_attention_inputs(ids, tags, starts=[s for _, s in seqs])
    length = mask.shape[-1]
    batch_ids = torch.zeros(len(ids), length, dtype=torch.long)
    for b, row in enumerate(ids):
        batch_ids[b, : len(row)] = torch.tensor(row)
    for impl in ("eager", "sdpa"):
        model.set_attn_implementation(impl)
        with torch.no_grad():
            logits = model(
                input_ids=batch_ids, attention_mask=to_additive_mask(mask), position_ids=pos
            ).logits
        assert torch.isfinite(logits).all()  # pad rows attend to themselves: no empty row, no NaN
        for b, (row, start) in enumerate(seqs):
            m1, p1 = parallel_attention_inputs(row, tags, start)
            single = _logits(model, impl, row, to_additive_mask(m1), p1)
            assert (logits[b, : len(row)] - single).abs().max().item() <= TOL
