"""Plot data (JSON rows ``dvc plots show`` reads) and PNG plots (matplotlib, Agg) of an evaluation.

Input everywhere is the evaluation's metrics dict (``runner.evaluate_checkpoints``): ``checkpoints`` ->
``{mode, benchmarks: {name: metrics}, average_accuracy, throughput}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.artifacts import write_json

ACCURACY_JSON = "accuracy.json"
SPEEDUP_JSON = "speedup.json"
ACCURACY_PNG = "accuracy.png"
SPEEDUP_PNG = "speedup.png"


def accuracy_rows(eval_metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per checkpoint: ``accuracy`` (mean over benchmarks) and ``accuracy/<benchmark>`` each."""
    rows = []
    for name, ckpt in eval_metrics["checkpoints"].items():
        row: dict[str, Any] = {"checkpoint": name, "mode": ckpt["mode"], "accuracy": ckpt["average_accuracy"]}
        for bench, m in ckpt["benchmarks"].items():
            row[f"accuracy/{bench}"] = m["accuracy"]
        rows.append(row)
    return rows


def speedup_rows(eval_metrics: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per checkpoint whose speedup was measured (parallel checkpoints with measure_speedup on)."""
    rows = []
    for name, ckpt in eval_metrics["checkpoints"].items():
        tp = ckpt["throughput"]
        if "achieved_speedup" not in tp:
            continue
        rows.append(
            {
                "checkpoint": name,
                "achieved_speedup": tp["achieved_speedup"],
                # the ideal of the traces the speedup decode timed (what achieved is compared with)
                "ideal_speedup": tp.get("speedup_ideal", tp["ideal_speedup"]),
                "tokens_per_s": tp["tokens_per_s"],
                "sequential_tokens_per_s": tp["sequential_tokens_per_s"],
            }
        )
    return rows


def write_plot_data(eval_metrics: Mapping[str, Any], plots_dir: Path) -> dict[str, Path]:
    """Write ``accuracy.json`` and ``speedup.json`` (lists of rows; x: checkpoint) into ``plots_dir``."""
    plots_dir = Path(plots_dir)
    paths = {"accuracy": plots_dir / ACCURACY_JSON, "speedup": plots_dir / SPEEDUP_JSON}
    write_json(paths["accuracy"], accuracy_rows(eval_metrics))
    write_json(paths["speedup"], speedup_rows(eval_metrics))
    return paths


def render_pngs(eval_metrics: Mapping[str, Any], out_dir: Path) -> dict[str, Path]:
    """Accuracy per benchmark per checkpoint (grouped bars) and achieved vs ideal speedup (paired bars)."""
    import matplotlib  # lazy: matplotlib

    matplotlib.use("Agg")  # headless: never needs a display
    import matplotlib.pyplot as plt  # lazy: matplotlib

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    checkpoints = list(eval_metrics["checkpoints"])
    benches: list[str] = []
    for ckpt in eval_metrics["checkpoints"].values():
        benches.extend(b for b in ckpt["benchmarks"] if b not in benches)
    paths = {}

    fig, ax = plt.subplots(figsize=(max(6.0, 1.1 * len(benches) + 2), 4))
    width = 0.8 / max(1, len(checkpoints))
    for i, name in enumerate(checkpoints):
        bench_metrics = eval_metrics["checkpoints"][name]["benchmarks"]
        xs = [j + i * width for j, b in enumerate(benches) if b in bench_metrics]
        ys = [bench_metrics[b]["accuracy"] for b in benches if b in bench_metrics]
        ax.bar(xs, ys, width=width, label=name)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(benches))], benches, rotation=30, ha="right")
    ax.set_ylabel("accuracy (avg@n)")
    ax.set_ylim(0, 1)
    ax.set_title("Accuracy per benchmark")
    ax.legend(fontsize="small", ncols=2)
    fig.tight_layout()
    paths["accuracy"] = out_dir / ACCURACY_PNG
    fig.savefig(paths["accuracy"], dpi=110)
    plt.close(fig)

    rows = speedup_rows(eval_metrics)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.4 * len(rows) + 2), 4))
    if rows:
        xs = range(len(rows))
        ax.bar([x - 0.2 for x in xs], [r["achieved_speedup"] for r in rows], width=0.4, label="achieved")
        ax.bar([x + 0.2 for x in xs], [r["ideal_speedup"] for r in rows], width=0.4, label="ideal (Amdahl)")
        ax.set_xticks(list(xs), [r["checkpoint"] for r in rows])
        ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
        ax.legend(fontsize="small")
    else:
        ax.text(0.5, 0.5, "no parallel checkpoint measured", ha="center", va="center", transform=ax.transAxes)
    ax.set_ylabel("speedup over sequential decoding (tokens/s)")
    ax.set_title("Parallel decoding speedup: achieved vs ideal")
    fig.tight_layout()
    paths["speedup"] = out_dir / SPEEDUP_PNG
    fig.savefig(paths["speedup"], dpi=110)
    plt.close(fig)
    return paths
