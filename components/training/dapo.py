"""DAPO (NPR Stage 1 and the sequential baseline) from verl's own pieces, plus the two recipe parts the
local trainer needs outside verl: dynamic sampling and the overlong penalty buffer.

- Loss: verl's registered ``vanilla`` policy loss (decoupled clip ``clip_ratio_low`` / ``clip_ratio_high``,
  dual-clip ``clip_ratio_c``), token-mean aggregation.
- Advantage: verl's registered ``grpo`` estimator (group mean and group std).
- Dynamic sampling (``algorithm.filter_groups`` in verl): a group of responses to one prompt whose rewards
  are all equal carries no gradient under a group baseline, so it is dropped and replaced from further
  generation batches, up to ``max_gen_batches`` (<= 0: no cap); then training proceeds with what there is.
  Groups of one response are kept, as verl's replay buffer keeps them.
- Overlong penalty: verl's DAPO reward manager formula ``min(-(L - (L_max - buf)) / buf * factor, 0)``.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np
import torch

G = TypeVar("G")


def overlong_penalty(
    response_lengths: torch.Tensor, max_response_length: int, buffer_len: int, penalty_factor: float
) -> torch.Tensor:
    """Soft overlong punishment of DAPO, as verl's ``DAPORewardManager`` adds it to the score.

    Args:
        response_lengths: ``(bs,)`` number of response tokens of each sample.
        max_response_length: the generation budget ``L_max``.
        buffer_len: length of the buffer before ``L_max`` in which the penalty ramps; 0 disables it.
        penalty_factor: penalty at ``L_max`` (the ramp reaches ``-penalty_factor`` there).

    Returns:
        ``(bs,)`` float penalties, ``<= 0``.
    """
    lengths = response_lengths.to(torch.float32)
    if buffer_len <= 0:
        return torch.zeros_like(lengths)
    if buffer_len > max_response_length:
        raise ValueError(
            f"overlong buffer ({buffer_len}) is longer than max_response_length ({max_response_length})"
        )
    exceed = lengths - (max_response_length - buffer_len)
    return torch.clamp(-exceed / buffer_len * penalty_factor, max=0.0)


def mixed_group_mask(scores: Sequence[float], index: Sequence[object]) -> np.ndarray:
    """``(bs,)`` bool: True for responses whose group has distinct scores (or only one response).

    A group whose scores are all equal (std 0) is filtered, exactly verl's ``filter_groups`` rule.
    """
    if len(scores) != len(index):
        raise ValueError(f"{len(scores)} scores for {len(index)} group ids")
    by_group: dict[object, list[float]] = {}
    for uid, score in zip(index, scores, strict=True):
        by_group.setdefault(uid, []).append(float(score))
    keep_group = {uid: len(vals) == 1 or float(np.std(vals)) > 0.0 for uid, vals in by_group.items()}
    return np.array([keep_group[uid] for uid in index], dtype=bool)


@dataclass
class DynamicSamplingStats:
    """What dynamic sampling generated, kept and dropped (and why) for one training step."""

    num_gen_batches: int = 0
    groups_generated: int = 0
    groups_kept: int = 0
    groups_filtered: int = 0
    groups_surplus: int = 0  # mixed groups beyond the target, generated but not trained on
    filtered_by_score: Counter = field(default_factory=Counter)  # shared score -> groups dropped
    reached_target: bool = False

    def as_metrics(self, prefix: str = "dynamic_sampling") -> dict[str, float]:
        out = {
            f"{prefix}/num_gen_batches": float(self.num_gen_batches),
            f"{prefix}/groups_generated": float(self.groups_generated),
            f"{prefix}/groups_kept": float(self.groups_kept),
            f"{prefix}/groups_filtered": float(self.groups_filtered),
            f"{prefix}/groups_surplus": float(self.groups_surplus),
            f"{prefix}/reached_target": float(self.reached_target),
        }
        for score, n in sorted(self.filtered_by_score.items()):
            out[f"{prefix}/filtered_all_{score:g}"] = float(n)
        return out


@dataclass
class DynamicSampler(Generic[G]):
    """Fill a training batch with mixed-reward groups by generating more batches when needed.

    Args:
        generate: called with the 0-based generation-batch number; returns freshly generated, scored groups.
        scores_of: the per-response scores of a group.
        target_groups: groups wanted in the training batch.
        max_gen_batches: cap on generation batches per step; ``<= 0`` means no cap (verl's convention).
        enabled: when False, the first generation batch is used as is (no filtering).
    """

    generate: Callable[[int], list[G]]
    scores_of: Callable[[G], Sequence[float]]
    target_groups: int
    max_gen_batches: int = 0
    enabled: bool = True

    def collect(self) -> tuple[list[G], DynamicSamplingStats]:
        """The groups to train on (at most ``target_groups``) and the step's sampling statistics."""
        stats = DynamicSamplingStats()
        kept: list[G] = []
        while True:
            groups = self.generate(stats.num_gen_batches)
            stats.num_gen_batches += 1
            stats.groups_generated += len(groups)
            if not self.enabled:
                kept = list(groups)
                stats.reached_target = len(kept) >= self.target_groups
                break
            for group in groups:
                scores = list(self.scores_of(group))
                if len(scores) > 1 and float(np.std(scores)) == 0.0:
                    stats.groups_filtered += 1
                    stats.filtered_by_score[float(scores[0])] += 1
                else:
                    kept.append(group)
            if len(kept) >= self.target_groups:
                stats.reached_target = True
                break
            if 0 < self.max_gen_batches <= stats.num_gen_batches:
                break
            if not groups:
                raise RuntimeError("the generator returned no groups; dynamic sampling cannot make progress")
        stats.groups_surplus = max(0, len(kept) - self.target_groups)
        kept = kept[: self.target_groups]
        stats.groups_kept = len(kept)
        return kept, stats
