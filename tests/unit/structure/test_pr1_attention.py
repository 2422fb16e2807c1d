"""Parallel-R1 "Unseen" and "Seen": the mask and positions every consumer builds equal the references.

Unseen (npr-reference.md §3.4, the paper's intent): causal, except that the paths of a block (each from
``<Path>`` through ``</Path>``) cannot see each other; ``<Parallel>`` keeps its position p, every path restarts
at p + 1, ``</Parallel>`` sits at p + longest + 1 and what follows continues from there. ``reference_unseen``
below is that rule written out on its own, token by token; the structure module
(``parallel_attention_inputs``) must equal it on generated traces, and the SFT collator and the RL batch
builder must equal the structure module (so also the reference). Seen is plain causal with ``arange``
positions, which is what the sequential modes build.

Where we differ from the public code: it leaves tokens between ``</Path>`` and the next ``<Path>`` at position
0; in our canonical layout a block has no such tokens (the normaliser removes whitespace there, and text
there is a format violation), so the question does not arise.
"""

from __future__ import annotations

import random

import pytest
import torch

from components.structure import PARALLEL_R1, TagIds, parallel_attention_inputs
from components.training.rl_batch import Rollout, build_policy_batch
from components.training.sft_data import SFTExample, collate
from tests.unit.structure.conftest import tag_ids_for

TEXT = list(range(1, 50))  # text token ids (tags sit at 1000+)


def _tags() -> TagIds:
    return tag_ids_for(PARALLEL_R1)


def random_trace(rng: random.Random, tags: TagIds) -> tuple[list[int], int]:
    """prompt + response ids of a well-formed Parallel-R1 trace: blocks of 2-4 paths, text between them."""
    t = tags.ids
    prompt = [rng.choice(TEXT) for _ in range(rng.randint(1, 5))]
    response: list[int] = []
    for _ in range(rng.randint(1, 3)):
        response += [rng.choice(TEXT) for _ in range(rng.randint(0, 4))]
        response.append(t["<Parallel>"])
        for _ in range(rng.randint(2, 4)):
            response += [t["<Path>"], *[rng.choice(TEXT) for _ in range(rng.randint(1, 7))], t["</Path>"]]
        response += [t["</Parallel>"], t["<Summary>"], *[rng.choice(TEXT) for _ in range(rng.randint(1, 4))]]
        response.append(t["</Summary>"])
    response += [rng.choice(TEXT) for _ in range(rng.randint(0, 4))]
    return prompt + response, len(prompt)


def reference_unseen(ids: list[int], tags: TagIds) -> tuple[torch.Tensor, torch.Tensor]:
    """Parallel-R1's Unseen mask and positions, computed directly from the rule (module docstring)."""
    t = tags.ids
    n = len(ids)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    pos = []
    cur = -1
    anchor, longest, path_start, paths = None, 0, None, []
    for i, tok in enumerate(ids):
        if tok == t["<Path>"] and anchor is not None:
            cur, path_start = anchor, i
        if tok == t["</Parallel>"] and anchor is not None:
            cur = anchor + longest
            for k, (a, b) in enumerate(paths):
                for c, d in paths[:k]:
                    mask[a:b, c:d] = False  # a later path cannot see an earlier one (nor the reverse: causal)
            anchor, paths = None, []
        cur += 1
        pos.append(cur)
        if tok == t["<Parallel>"]:
            anchor, longest = cur, 0
        if tok == t["</Path>"] and path_start is not None:
            longest = max(longest, cur - anchor)
            paths.append((path_start, i + 1))
            path_start = None
    return mask, torch.tensor(pos)


def test_the_structure_module_is_the_reference() -> None:
    tags = _tags()
    rng = random.Random(0)
    for _ in range(200):
        ids, start = random_trace(rng, tags)
        mask, pos = parallel_attention_inputs(ids, tags, start=start)
        ref_mask, ref_pos = reference_unseen(ids, tags)
        assert torch.equal(pos, ref_pos)
        assert torch.equal(mask, ref_mask)


def test_a_worked_example() -> None:
    tags = _tags()
    t = tags.ids
    # Q | <Parallel> <Path> a </Path> <Path> b b b </Path> </Parallel> <Summary> s </Summary> x
    ids = [1, t["<Parallel>"], t["<Path>"], 2, t["</Path>"], t["<Path>"], 3, 3, 3, t["</Path>"]]
    ids += [t["</Parallel>"], t["<Summary>"], 4, t["</Summary>"], 5]
    mask, pos = parallel_attention_inputs(ids, tags, start=1)
    # <Parallel> at 1; both paths restart at 2; </Parallel> at 1 + 5 + 1 (the longest path is 5 tokens)
    assert pos.tolist() == [0, 1, 2, 3, 4, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]
    assert not mask[5:10, 2:5].any() and mask[10, 2:10].all()  # path 2 cannot see path 1; the merge sees both


def test_sft_collation_builds_the_reference_unseen_and_causal_seen() -> None:
    tags = _tags()
    rng = random.Random(1)
    traces = [random_trace(rng, tags) for _ in range(6)]
    examples = [SFTExample(tuple(ids), start) for ids, start in traces]
    unseen = collate(examples, "parallel", pad_id=0, tags=tags)
    seen = collate(examples, "sequential", pad_id=0)
    assert seen.position_ids is None and seen.attention_mask.dim() == 2  # the model's own causal arange
    for row, (ids, start) in enumerate(traces):
        n = len(ids)
        ref_mask, ref_pos = reference_unseen(ids, tags)
        assert torch.equal(unseen.attention_mask[row, 0, :n, :n], ref_mask)
        assert torch.equal(unseen.position_ids[row, :n], ref_pos)
        # each path's first token is predicted from <Parallel> (where the engine forks it), not the sibling
        path_opens = [i for i in range(start, n) if ids[i] == tags.ids["<Path>"]]
        parallel_at = [i for i in range(start, n) if ids[i] == tags.ids["<Parallel>"]]
        for i in path_opens:
            assert int(unseen.parents[row, i]) == max(p for p in parallel_at if p < i)
        assert seen.parents[row, 1:n].tolist() == list(range(n - 1))
        assert seen.attention_mask[row, :n].all()


def test_rl_batches_build_the_reference_unseen_and_causal_seen() -> None:
    tags = _tags()
    rng = random.Random(2)
    rollouts = []
    for k in range(5):
        ids, start = random_trace(rng, tags)
        rollouts.append(Rollout(f"g{k}", f"p{k}", "1", ids[:start], ids[start:], "", "stop", True))
    unseen = build_policy_batch(rollouts, pad_id=0, tags=tags)
    seen = build_policy_batch(rollouts, pad_id=0)
    assert unseen.parallel and not seen.parallel
    for row, r in enumerate(rollouts):
        ids = r.prompt_ids + r.response_ids
        n = len(ids)
        ref_mask, ref_pos = reference_unseen(ids, tags)
        assert torch.equal(unseen.attention_mask[row, 0, :n, :n], ref_mask)
        assert torch.equal(unseen.position_ids[row, :n], ref_pos)
        assert seen.position_ids[row, :n].tolist() == list(range(n))


@pytest.mark.parametrize("paths", [2, 3])
def test_paths_of_one_block_are_mutually_invisible_whatever_their_number(paths: int) -> None:
    tags = _tags()
    t = tags.ids
    ids = [1, t["<Parallel>"]]
    spans = []
    for k in range(paths):
        spans.append((len(ids), len(ids) + 3))
        ids += [t["<Path>"], 10 + k, t["</Path>"]]
    ids += [t["</Parallel>"], t["<Summary>"], 7, t["</Summary>"]]
    mask, pos = parallel_attention_inputs(ids, tags, start=1)
    for a, b in spans:
        assert pos[a:b].tolist() == [2, 3, 4]
        for c, d in spans:
            if (c, d) != (a, b):
                assert not mask[a:b, c:d].any()
    assert int(pos[len(ids) - 4]) == 1 + 3 + 1
