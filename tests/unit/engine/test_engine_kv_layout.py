"""The owner mask of the shared-prefix cache."""

from __future__ import annotations

import torch

from components.engine.kv_layout import PAD, SHARED, SlotOwners


def test_prefill_mask_is_causal_and_hides_left_padding() -> None:
    owners = SlotOwners.for_prefill(torch.tensor([[False, True, True]]))
    allowed = owners.prefill_mask(torch.float32)[0, 0] == 0
    assert allowed.tolist() == [[True, False, False], [False, True, False], [False, True, True]]


def test_branches_see_the_shared_prefix_and_themselves_only_until_merged() -> None:
    owners = SlotOwners(torch.tensor([[SHARED, SHARED]]))
    allowed = owners.append(torch.tensor([[0, 1, PAD]]), torch.float32)[0, 0] == 0
    assert allowed.shape == (3, 5)  # last dim = cache length + q_len
    assert allowed.tolist() == [
        [True, True, True, False, False],
        [True, True, False, True, False],
        [False, False, False, False, True],  # a padding query sees only its own slot
    ]
    owners.merge_branches(0)
    allowed = owners.append(torch.tensor([[SHARED]]), torch.float32)[0, 0] == 0
    assert allowed.tolist() == [[True, True, True, True, False, True]]


def test_additive_mask_uses_finfo_min_not_inf() -> None:
    owners = SlotOwners(torch.tensor([[PAD]]))
    mask = owners.append(torch.tensor([[SHARED]]), torch.bfloat16)
    assert mask.dtype == torch.bfloat16
    assert mask[0, 0, 0, 0].item() == torch.finfo(torch.bfloat16).min and torch.isfinite(mask).all()
