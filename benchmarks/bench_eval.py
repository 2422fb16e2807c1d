"""How often each nightly gate cries wolf, and how often it catches a real regression, side by side.

Simulates a benchmark of P problems x k samples whose problems differ in difficulty (per-problem success
probabilities drawn from a Beta around the baseline accuracy, so samples of a problem are correlated, as in
real evals). For each of R replicate nights it draws outcomes and asks three gates for a verdict:

- ``rtol``: fail when the point estimate is below baseline x (1 - tolerance) (a fixed-tolerance gate);
- ``wilson``: this project's gate, Wilson upper bound at n = P x k (``components.evaluation.gate``);
- ``bootstrap``: this project's gate, bootstrap over problems.

Scenarios: no change (every FAIL is a false alarm) and a real relative drop. Printed: FAIL rates and the
ratio of false alarms of ``rtol`` over each statistical gate.

Run: ``.venv/bin/python benchmarks/bench_eval.py [--problems 30] [--k 8] [--replicates 200] [--drop 0.25]``;
``--smoke`` (benchmarks/_smoke.py): 6 problems x 2 samples, 3 nights per scenario, 100 bootstrap samples.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402
from components.evaluation.config import NightlyConfig  # noqa: E402
from components.evaluation.gate import Baseline, BaselineBenchmark, gate_checkpoint  # noqa: E402
from components.evaluation.metrics import RECORD_FIELDS, avg_at_n, mean_pass_at_k  # noqa: E402

SETTINGS = {"sampling": {}, "prompt_hash": "h", "engine_version": {"backend": "torch"}}


def simulate_night(
    problem_p: list[float], k: int, rng: random.Random
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """One night's per-benchmark metrics and per-sample records from per-problem success probabilities."""
    correct = [[rng.random() < p for _ in range(k)] for p in problem_p]
    records = []
    for i, samples in enumerate(correct):
        for j, c in enumerate(samples):
            rec = dict.fromkeys(RECORD_FIELDS)
            rec.update(problem_id=f"p{i}", sample_idx=j, correct=c)
            records.append(rec)
    metrics = {
        "n_problems": len(problem_p),
        "n_samples": k,
        "k": k,
        "accuracy": avg_at_n(correct),
        "pass@k": mean_pass_at_k(correct, k),
        "format_valid_rate": 1.0,
        "parallel_rate": 1.0,
    }
    return metrics, records


def problem_probabilities(n: int, mean: float, concentration: float, rng: random.Random) -> list[float]:
    """Per-problem success probabilities ~ Beta(mean * c, (1 - mean) * c): hard and easy problems."""
    return [rng.betavariate(mean * concentration, (1 - mean) * concentration) for _ in range(n)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--problems", type=int, default=30)
    ap.add_argument("--k", type=int, default=8)
    ap.add_argument("--accuracy", type=float, default=0.5)
    ap.add_argument("--concentration", type=float, default=2.0, help="Beta concentration (low = diverse)")
    ap.add_argument("--drop", type=float, default=0.25, help="relative accuracy drop of the regression")
    ap.add_argument("--tolerance", type=float, default=0.05)
    ap.add_argument("--replicates", type=int, default=200)
    ap.add_argument("--bootstrap-samples", type=int, default=500)
    ap.add_argument("--seed", type=int, default=0)
    args = parse_args(ap, None, problems=6, k=2, replicates=3, bootstrap_samples=100)

    rng = random.Random(args.seed)
    base_p = problem_probabilities(args.problems, args.accuracy, args.concentration, rng)
    true_acc = sum(base_p) / len(base_p)
    # The regression: every problem gets harder by the same relative amount.
    dropped_p = [p * (1 - args.drop) for p in base_p]
    baseline = Baseline(
        tag="bench",
        profile="bench",
        checkpoint="c",
        mode="sequential",
        prompt_style="parallel",
        checkpoint_hash="h",
        prompt_hash="h",
        engine_version={"backend": "torch"},
        sampling={},
        created_at="-",
        benchmarks={
            "b": BaselineBenchmark(
                n_problems=args.problems,
                n_samples=args.k,
                k=args.k,
                metrics={"accuracy": true_acc, "pass@k": 1.0},
            )
        },
    )
    gates = {
        "wilson": NightlyConfig(tolerance=args.tolerance, method="wilson", gate_metrics=["accuracy"]),
        "bootstrap": NightlyConfig(
            tolerance=args.tolerance,
            method="bootstrap",
            bootstrap_samples=args.bootstrap_samples,
            gate_metrics=["accuracy"],
        ),
    }
    floorless = {"format_valid_floor": 0.0, "parallel_rate_floor": 0.0}
    gates = {name: cfg.model_copy(update=floorless) for name, cfg in gates.items()}
    threshold = true_acc * (1 - args.tolerance)

    print(
        f"{args.problems} problems x {args.k} samples, baseline accuracy {true_acc:.3f} "
        f"(problem difficulty Beta, concentration {args.concentration}), tolerance {args.tolerance:.0%}, "
        f"regression = {args.drop:.0%} relative drop, {args.replicates} nights per scenario"
    )
    print(f"{'scenario':<12} {'rtol':>8} {'wilson':>8} {'bootstrap':>10}   (fraction of nights that FAIL)")
    rates: dict[str, dict[str, float]] = {}
    start = time.perf_counter()
    for scenario, probs in (("no change", base_p), ("regression", dropped_p)):
        fails = {"rtol": 0, "wilson": 0, "bootstrap": 0}
        for r in range(args.replicates):
            metrics, records = simulate_night(probs, args.k, rng)
            fails["rtol"] += metrics["accuracy"] < threshold
            for name, cfg in gates.items():
                current = {
                    "mode": "sequential",
                    "prompt_style": "parallel",
                    "checkpoint_hash": "h",
                    "benchmarks": {"b": metrics},
                }
                result = gate_checkpoint(current, SETTINGS, baseline, cfg, records={"b": records}, seed=r)
                fails[name] += result.verdict == "fail"
        rates[scenario] = {name: n / args.replicates for name, n in fails.items()}
        row = rates[scenario]
        print(f"{scenario:<12} {row['rtol']:>8.3f} {row['wilson']:>8.3f} {row['bootstrap']:>10.3f}")
    wall = time.perf_counter() - start

    noise = rates["no change"]
    for name in ("wilson", "bootstrap"):
        if noise[name]:
            print(f"false alarms, rtol / {name}: {noise['rtol'] / noise[name]:.1f}x")
        else:
            print(f"false alarms, rtol / {name}: {noise['rtol']:.3f} vs none in {args.replicates} nights")
    print(
        "detection, wilson / rtol: "
        f"{rates['regression']['wilson'] / max(rates['regression']['rtol'], 1e-9):.2f}; "
        f"bootstrap / rtol: {rates['regression']['bootstrap'] / max(rates['regression']['rtol'], 1e-9):.2f}"
    )
    print(f"({wall:.1f} s for {2 * args.replicates} simulated nights)")


if __name__ == "__main__":
    main()
