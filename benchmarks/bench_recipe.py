"""The recipe table of a finished run: every checkpoint in the paper's order and the paper's claims with
paired bootstrap intervals over problems, recomputed from the evaluation's per-sample records.

Reads ``<artifacts>/evaluate/metrics.json`` (modes, pass@k, format-valid rates, the speedup decode) and
``<artifacts>/evaluate/records/<checkpoint>/<benchmark>-NNNNN.jsonl`` (one record per sample) without
re-running anything; ``--resamples`` and ``--confidence`` change the intervals only. Parallel-R1's
checkpoints are rows too, and NPR vs Parallel-R1 a comparison. Also prints the accuracy table of every
benchmark of the run and each stage's wall time from its metrics.json.

Run after ``make run``: ``.venv/bin/python benchmarks/bench_recipe.py [--artifacts artifacts]
[--benchmark tiny_test] [--resamples 2000] [--confidence 0.95]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.artifacts import read_shards  # noqa: E402
from components.dag import load_stages  # noqa: E402
from components.evaluation.recipe import recipe_markdown, recipe_summary  # noqa: E402
from components.evaluation.report import accuracy_table, benchmark_names  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument("--benchmark", default="tiny_test")
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    metrics_path = args.artifacts / "evaluate" / "metrics.json"
    if not metrics_path.exists():
        print(
            f"no finished evaluation at {metrics_path}: run `make run` (or `dvc repro`) first",
            file=sys.stderr,
        )
        return 2
    metrics = json.loads(metrics_path.read_text())
    records_dir = args.artifacts / "evaluate" / "records"
    records = {
        name: {args.benchmark: read_shards(records_dir / name, stem=args.benchmark)}
        for name in metrics["checkpoints"]
        if list((records_dir / name).glob(f"{args.benchmark}-*.jsonl"))
    }
    summary = recipe_summary(metrics, records, args.benchmark, args.confidence, args.resamples, args.seed)
    print(f"# Recipe on {args.benchmark}\n")
    print(recipe_markdown(summary))
    print(f"\n# Every benchmark of the run ({', '.join(benchmark_names(metrics))})\n")
    print(accuracy_table(metrics))
    print("\n# Stage wall times (each stage's metrics.json)\n")
    print("| stage | wall s |\n|---|---|")
    total = 0.0
    for stage in load_stages(ROOT / "dvc.yaml"):  # every stage of the DAG, in its order
        path = args.artifacts / stage / "metrics.json"
        if path.exists():
            wall = json.loads(path.read_text()).get("wall_time_s")
            if wall is not None:
                total += float(wall)
            print(f"| {stage} | {'–' if wall is None else f'{float(wall):.0f}'} |")
    print(f"| sum | {total:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
