"""Evaluation metrics: pure functions of per-sample outcomes (no model, no I/O).

Conventions (npr-reference.md §1.10 notes that upstream's "avg@8" is ambiguous; ours is explicit):

- ``avg@n``: each problem gets ``n`` samples; its score is the fraction correct; the benchmark score is the
  mean over problems. This is the Table-2 ``accuracy``.
- ``pass@k``: the unbiased estimator ``1 - C(n-c, k) / C(n, k)`` per problem (Chen et al. 2021), averaged
  over problems. With ``k = 1`` it equals avg@n.
- ``best@k``: the exact expected maximum of a per-sample score over a uniformly random k-subset of the n
  samples. On 0/1 scores it equals pass@k, so the report applies it to the format score, where it differs.
- ``parallel_rate``: fraction of responses with at least one valid block of >= 2 plans; ``parallel_rate_any``
  counts blocks with >= 1 plan (upstream never computes either).
- Speedups: ``ideal`` is Amdahl's bound of the traces (total / critical-path tokens, summed over the set);
  ``achieved`` is tokens/s of parallel decoding over tokens/s of sequential decoding of the same prompts.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

# Fields of one per-sample evaluation record (written by the runner, read back by the summary and the gate).
RECORD_FIELDS = (
    "checkpoint",
    "benchmark",
    "mode",
    "problem_id",
    "sample_idx",
    "problem",
    "answers",
    "prompt",
    "response",
    "answer_pred",
    "correct",
    "format_score",
    "valid",
    "n_tokens",
    "critical_path_tokens",
    "is_parallel",
    "is_parallel_any",
    "branches_per_block",
    "parallel_taken",
    "finish_reason",
)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k of one problem with ``c`` correct among ``n`` samples.

    ``1 - C(n-c, k) / C(n, k)`` evaluated as ``1 - prod_{i=n-c+1..n} (1 - k/i)``, which never forms the huge
    binomials (stable for n in the thousands).
    """
    if n < 1:
        raise ValueError(f"pass@k needs at least one sample, got n={n}")
    if not 0 <= c <= n:
        raise ValueError(f"correct count c={c} must lie in [0, n={n}]")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in [1, n={n}] (cannot estimate pass@k from fewer than k samples)")
    if n - c < k:
        return 1.0
    prod = 1.0
    for i in range(n - c + 1, n + 1):
        prod *= 1.0 - k / i
    return 1.0 - prod


def best_at_k(scores: Sequence[float], k: int) -> float:
    """Exact expected max of ``scores`` over a uniformly random subset of size ``k`` (no replacement).

    With the scores sorted ascending, the i-th smallest (1-based) is the max of a k-subset in
    ``C(i-1, k-1)`` of the ``C(n, k)`` subsets. The weights are formed as ratios so nothing overflows.
    """
    n = len(scores)
    if n == 0:
        raise ValueError("best@k needs at least one score")
    if not 1 <= k <= n:
        raise ValueError(f"k={k} must lie in [1, n={n}]")
    ordered = sorted(float(s) for s in scores)
    total = 0.0
    for i, score in enumerate(ordered, start=1):
        if i < k:
            continue
        # C(i-1, k-1) / C(n, k) computed in log space: exact enough and overflow-free for any n.
        log_w = (
            math.lgamma(i)
            - math.lgamma(k)
            - math.lgamma(i - k + 1)
            - (math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1))
        )
        total += score * math.exp(log_w)
    return total


def avg_at_n(correct_by_problem: Sequence[Sequence[bool]]) -> float:
    """Mean over problems of the fraction of that problem's samples that are correct."""
    if not correct_by_problem:
        raise ValueError("avg@n needs at least one problem")
    per_problem = []
    for i, samples in enumerate(correct_by_problem):
        if not samples:
            raise ValueError(f"problem #{i} has no samples")
        per_problem.append(sum(bool(s) for s in samples) / len(samples))
    return sum(per_problem) / len(per_problem)


def mean_pass_at_k(correct_by_problem: Sequence[Sequence[bool]], k: int) -> float:
    """Unbiased pass@k averaged over problems."""
    if not correct_by_problem:
        raise ValueError("pass@k needs at least one problem")
    values = [pass_at_k(len(s), sum(bool(x) for x in s), k) for s in correct_by_problem]
    return sum(values) / len(values)


def rate(flags: Sequence[bool]) -> float:
    """Fraction of true flags (format-valid rate, parallel rate, ...)."""
    if not flags:
        raise ValueError("a rate needs at least one item")
    return sum(bool(f) for f in flags) / len(flags)


def mean(values: Sequence[float]) -> float:
    if not values:
        raise ValueError("a mean needs at least one value")
    return float(sum(values)) / len(values)


def mean_branches_per_block(branches_per_response: Sequence[Sequence[int]]) -> float:
    """Mean number of branches over every block of every response; 0.0 when no response has a block."""
    blocks = [b for response in branches_per_response for b in response]
    return float(sum(blocks)) / len(blocks) if blocks else 0.0


def tokens_per_second(total_tokens: int, wall_s: float) -> float:
    if wall_s <= 0:
        raise ValueError(f"wall time must be positive, got {wall_s}")
    return total_tokens / wall_s


def ideal_speedup(total_tokens: Sequence[int], critical_path_tokens: Sequence[int]) -> float:
    """Amdahl bound of a set of traces: sum of all tokens / sum of critical-path tokens.

    Summing before dividing weights long traces by their cost, which is what the wall clock sees.
    """
    if len(total_tokens) != len(critical_path_tokens):
        raise ValueError("total and critical-path token lists differ in length")
    for t, c in zip(total_tokens, critical_path_tokens, strict=True):
        if c < 0 or c > t:
            raise ValueError(f"critical-path tokens {c} must lie in [0, total tokens {t}]")
    crit = sum(critical_path_tokens)
    if crit == 0:
        raise ValueError("no critical-path tokens: nothing was generated")
    return sum(total_tokens) / crit


def achieved_speedup(parallel_tokens_per_s: float, sequential_tokens_per_s: float) -> float:
    if parallel_tokens_per_s < 0 or sequential_tokens_per_s <= 0:
        raise ValueError(
            f"throughputs must be positive (parallel {parallel_tokens_per_s}, sequential {sequential_tokens_per_s})"
        )
    return parallel_tokens_per_s / sequential_tokens_per_s


def group_by_problem(records: Sequence[Mapping[str, Any]], field: str) -> list[list[Any]]:
    """Values of ``field`` grouped by ``problem_id``, problems in first-seen order."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for rec in records:
        groups[str(rec["problem_id"])].append(rec[field])
    return list(groups.values())


def per_problem_accuracy(records: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each problem's fraction of correct samples (the unit a bootstrap over problems resamples)."""
    return [sum(bool(c) for c in g) / len(g) for g in group_by_problem(records, "correct")]


def per_problem_pass_at_k(records: Sequence[Mapping[str, Any]], k: int) -> list[float]:
    return [pass_at_k(len(g), sum(bool(c) for c in g), k) for g in group_by_problem(records, "correct")]


def summarize_records(records: Sequence[Mapping[str, Any]], k: int, wall_s: float) -> dict[str, float | int]:
    """Metrics of one (checkpoint, benchmark) from its per-sample records and the decode wall time."""
    if not records:
        raise ValueError("no records to summarize")
    missing = [f for f in RECORD_FIELDS if f not in records[0]]
    if missing:
        raise ValueError(f"records lack fields {missing}")
    correct = group_by_problem(records, "correct")
    sizes = {len(g) for g in correct}
    if len(sizes) != 1:
        raise ValueError(
            f"problems have different sample counts {sorted(sizes)}; avg@n needs the same n for all"
        )
    n_tokens = [int(r["n_tokens"]) for r in records]
    crit = [int(r["critical_path_tokens"]) for r in records]
    return {
        "n_problems": len(correct),
        "n_samples": sizes.pop(),
        "k": k,
        "accuracy": avg_at_n(correct),
        "pass@k": mean_pass_at_k(correct, k),
        "best_format_score@k": mean([best_at_k(g, k) for g in group_by_problem(records, "format_score")]),
        "mean_format_score": mean([float(r["format_score"]) for r in records]),
        "format_valid_rate": rate([r["valid"] for r in records]),
        "correct_and_valid_rate": rate([bool(r["correct"]) and bool(r["valid"]) for r in records]),
        "parallel_rate": rate([r["is_parallel"] for r in records]),
        "parallel_rate_any": rate([r["is_parallel_any"] for r in records]),
        "parallel_taken_rate": rate([r["parallel_taken"] for r in records]),
        "mean_branches_per_block": mean_branches_per_block([r["branches_per_block"] for r in records]),
        "mean_tokens": mean(n_tokens),
        "mean_critical_path_tokens": mean(crit),
        "total_tokens": sum(n_tokens),
        "total_critical_path_tokens": sum(crit),
        "truncation_rate": rate([r["finish_reason"] == "length" for r in records]),
        # All-empty responses have no work to parallelise: their ideal speedup is 1 by definition.
        "ideal_speedup": ideal_speedup(n_tokens, crit) if sum(crit) else 1.0,
        "tokens_per_s": tokens_per_second(sum(n_tokens), wall_s),
        "wall_s": wall_s,
    }
