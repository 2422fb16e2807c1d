"""The NPR actor's correction metrics come out of verl's reduction the same whatever the world size.

verl reduces a loss metric over a rank's micro-batches (by its aggregation) and then averages the data-parallel
ranks (``Metric.aggregate_dp``). The same batch split over one rank and over two must report the same
non-finite count and post-merge fraction; before the shares were made global, two ranks reported half the
count (seen in a 2-rank ``papo_rl`` job against a 1-rank one on the same rollouts: 10 against 20).
"""

from __future__ import annotations

import pytest
import torch
from verl.utils.metric import Metric

from components.training.papo import post_merge_is_weights
from components.training.verl.plugins.engine import _aggregation_of, _shares_of_the_mini_batch

COUNT = "rollout_corr/nonfinite_rollout_logp"
FRACTION = "rollout_corr/post_merge_token_frac"


def _batch() -> list[dict[str, torch.Tensor]]:
    """Four responses of different lengths, some tokens after a merge, some rollout log-probs non-finite."""
    gen = torch.Generator().manual_seed(0)
    rows = []
    for length, merged_from, nonfinite in ((6, 3, 1), (4, 4, 0), (7, 2, 2), (5, 1, 1)):
        lp = -torch.rand(1, length, generator=gen)
        rollout = lp + 0.01 * torch.randn(1, length, generator=gen)
        rollout[0, :nonfinite] = float("-inf")
        merged = torch.zeros(1, length, dtype=torch.bool)
        merged[0, merged_from:] = True
        rows.append({"lp": lp, "rollout": rollout, "mask": torch.ones(1, length), "merged": merged})
    return rows


def _micro_metrics(rows: list[dict[str, torch.Tensor]], dp_size: int, batch_tokens: int) -> dict[str, Metric]:
    """The correction metrics of one micro-batch of ``rows`` (padded to one width), as the engine adds them."""
    width = max(r["lp"].shape[1] for r in rows)

    def pad(key: str, fill: float) -> torch.Tensor:
        return torch.cat(
            [torch.nn.functional.pad(r[key].float(), (0, width - r[key].shape[1]), value=fill) for r in rows]
        )

    merged = pad("merged", 0.0).bool()
    _, metrics = post_merge_is_weights(pad("lp", 0.0), pad("rollout", 0.0), pad("mask", 0.0), merged, 2.0)
    shares = _shares_of_the_mini_batch(
        metrics, int(merged.sum()), {"dp_size": dp_size, "batch_num_tokens": batch_tokens}
    )
    return {k: Metric(_aggregation_of(k), v) for k, v in shares.items()}


def _reduced(ranks: list[list[list[dict[str, torch.Tensor]]]], batch_tokens: int) -> dict[str, float]:
    """verl's reduction of the metrics of ``ranks`` (each a list of micro-batches of rows)."""
    per_rank = []
    for micro_batches in ranks:
        collected: dict[str, Metric] = {}
        for rows in micro_batches:
            for key, metric in _micro_metrics(rows, len(ranks), batch_tokens).items():
                collected.setdefault(key, metric.init_list()).extend(metric)
        per_rank.append(collected)
    return {key: float(Metric.aggregate_dp([r[key] for r in per_rank])) for key in per_rank[0]}


def test_count_and_fraction_are_the_batchs_on_one_rank_and_on_two():
    rows = _batch()
    tokens = sum(int(r["mask"].sum()) for r in rows)
    merged = sum(int(r["merged"].sum()) for r in rows)
    nonfinite = sum(int((~torch.isfinite(r["rollout"])).sum()) for r in rows)
    one = _reduced([[rows[:3], rows[3:]]], tokens)
    two = _reduced([[rows[:1], rows[1:2]], [rows[2:3], rows[3:]]], tokens)
    for reduced in (one, two):
        assert reduced[COUNT] == nonfinite == 4
        assert reduced[FRACTION] == pytest.approx(merged / tokens, rel=1e-12)
    # the per-token means stay means of micro-batch means (no global denominator): defined, not equal
    assert {k for k in one if k not in (COUNT, FRACTION)} == {k for k in two if k not in (COUNT, FRACTION)}
