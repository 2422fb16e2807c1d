"""The evaluation report: one markdown file with a Table-2-shaped accuracy table, a Table-3-shaped throughput
table and per-benchmark detail, plus publishing it to Prefect (inside a flow run) and W&B.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from components.evaluation.recipe import recipe_markdown
from components.settings import ConfigError
from components.tracking import TrackedConfig, stage_run

log = logging.getLogger(__name__)


def _f(value: Any, digits: int = 3) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.{digits}f}"
    return str(value)


def _pct(value: Any) -> str:
    return "–" if value is None else f"{100 * float(value):.1f}"


def benchmark_names(eval_metrics: Mapping[str, Any], smoke: bool | None = None) -> list[str]:
    """Benchmarks in first-seen order; ``smoke`` True/False keeps only smoke / only main ones."""
    names: list[str] = []
    for ckpt in eval_metrics["checkpoints"].values():
        flagged = set(ckpt.get("smoke_benchmarks", []))
        names.extend(
            b for b in ckpt["benchmarks"] if b not in names and (smoke is None or (b in flagged) == smoke)
        )
    return names


def accuracy_table(eval_metrics: Mapping[str, Any], smoke: bool = False) -> str:
    """Rows: checkpoints; columns: benchmarks (avg@n, in %) and their average (Table 2 shape). With
    ``smoke`` the smoke samples instead, without an average (they are never averaged)."""
    benches = benchmark_names(eval_metrics, smoke=smoke)
    n_of = {}
    for ckpt in eval_metrics["checkpoints"].values():
        for b, m in ckpt["benchmarks"].items():
            n_of.setdefault(b, m["n_samples"])
    header = ["checkpoint", "mode", *(f"{b} (avg@{n_of[b]})" for b in benches)]
    if not smoke:
        header.append("average")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, ckpt in eval_metrics["checkpoints"].items():
        cells = [name, ckpt["mode"]]
        cells += [_pct(ckpt["benchmarks"].get(b, {}).get("accuracy")) for b in benches]
        if not smoke:
            cells.append(_pct(ckpt["average_accuracy"]))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def throughput_table(eval_metrics: Mapping[str, Any]) -> str:
    """Rows: checkpoints; tokens/s of the evaluation decode (its own mode), the ideal speedup of its traces,
    and, for parallel checkpoints, the speedup decode (Table 3): both modes' tokens/s, achieved vs ideal."""
    header = [
        "checkpoint",
        "mode",
        "tokens/s",
        "mean tokens",
        "ideal speedup",
        "speedup decode (problems x batch)",
        "parallel tokens/s",
        "sequential tokens/s",
        "achieved speedup",
        "ideal (its traces)",
        "achieved / ideal",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, ckpt in eval_metrics["checkpoints"].items():
        tp = ckpt["throughput"]
        sp = ckpt.get("speedup") or {}
        cells = [
            name,
            ckpt["mode"],
            _f(tp["tokens_per_s"], 1),
            _f(tp["mean_tokens"], 1),
            _f(tp["ideal_speedup"], 2),
            f"{sp['n_problems']} x {sp['batch_size']}" if sp else "–",
            _f(sp.get("parallel_tokens_per_s"), 1),
            _f(sp.get("sequential_tokens_per_s"), 1),
            _f(sp.get("achieved_speedup"), 2),
            _f(sp.get("ideal_speedup"), 2),
            _f(sp.get("efficiency"), 2),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def detail_table(eval_metrics: Mapping[str, Any]) -> str:
    """Per checkpoint x benchmark: pass@k, format and structure metrics."""
    header = [
        "checkpoint",
        "benchmark",
        "problems × n",
        "pass@k",
        "format valid",
        "parallel rate (≥2 plans)",
        "parallel rate (≥1 plan)",
        "branches / block",
        "mean tokens",
        "truncated",
    ]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, ckpt in eval_metrics["checkpoints"].items():
        for bench, m in ckpt["benchmarks"].items():
            cells = [
                name,
                bench,
                f"{m['n_problems']} × {m['n_samples']}",
                f"{_pct(m['pass@k'])} (k={m['k']})",
                _pct(m["format_valid_rate"]),
                _pct(m["parallel_rate"]),
                _pct(m["parallel_rate_any"]),
                _f(m["mean_branches_per_block"], 2),
                _f(m["mean_tokens"], 1),
                _pct(m["truncation_rate"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _merge_line(merge: Mapping[str, Any] | None) -> list[str]:
    """What the parallel checkpoints were trained to see after a merge, and whether the decode served it."""
    if not merge:
        return []
    how = (
        "exact: the decode samples what the policy was trained on"
        if merge["exact"]
        else "NOT exact: the decode re-reads merges the policy was trained to see isolated, so post-merge "
        'tokens come from another context (docs/architecture.md, "Merge semantics")'
    )
    return [f"Merge: semantics {merge['semantics']}, decoded with {merge['mode']} ({how})."]


def _precision_line(precision: Mapping[str, Any] | None) -> list[str]:
    """Which compute precision trained the checkpoints (``run.autocast`` as resolved; issue 43): bf16 and
    fp32 training give different numbers, and the seed spread shown is of the same precision."""
    if not precision:
        return []
    return [
        f"Training precision: {precision['compute_dtype']} compute (run.autocast={precision['autocast']}; "
        f"{precision['reason']})."
    ]


def _engine_settings_line(checkpoints: Mapping[str, Any]) -> list[str]:
    """The checkpoints decoded with their own engine settings (Parallel-R1's paths and token budget), so a
    reader sees that their samples had another budget than the sampling line's."""
    own = {
        name: ", ".join(f"{k}={v}" for k, v in sorted(c["engine_settings"].items()) if v is not None)
        for name, c in checkpoints.items()
        if c.get("engine_settings")
    }
    if not own:
        return []
    groups: dict[str, list[str]] = {}
    for name, text in own.items():
        groups.setdefault(text, []).append(name)
    return ["Own engine settings: " + "; ".join(f"{', '.join(n)}: {t}" for t, n in groups.items()) + "."]


def read_scale_note(path: str | None) -> str | None:
    """The profile's note on what its run can show (``evaluate.scale_note``), or None when unset; a named
    file that is missing or empty is a config error (the report would silently lose its caveats)."""
    if path is None:
        return None
    note = Path(path)
    if not note.is_file() or not note.read_text().strip():
        raise ConfigError(f"evaluate.scale_note: {path} is not a non-empty file (set it to null for no note)")
    return note.read_text()


def render_report(eval_metrics: Mapping[str, Any], title: str, images: Sequence[str] = ()) -> str:
    """The whole markdown report. ``images`` are file names relative to the report (the PNG plots)."""
    s = eval_metrics["settings"]
    sampling = ", ".join(f"{k}={v}" for k, v in s["sampling"].items())
    engine = ", ".join(f"{k} {v}" for k, v in s["engine_version"].items())
    parts = [
        f"# {title}",
        "",
        f"Sampling: {sampling}. Prompt hash `{s['prompt_hash']}`. Engine: {engine}.",
        *_merge_line(s.get("merge")),
        *_precision_line(s.get("training_precision")),
        *_engine_settings_line(eval_metrics["checkpoints"]),
        "Accuracy is avg@n: the fraction of the n samples of a problem that are correct, averaged over "
        "problems (in %). pass@k is the unbiased estimator. Parallel rate counts responses with at least one "
        "valid block of ≥ 2 plans (and ≥ 1 plan). Speedup compares tokens/s of the same checkpoint on the "
        "same prompts decoded in parallel vs sequential mode (the speedup decode, at its own batch size); "
        "ideal = total / critical-path tokens.",
        "",
    ]
    if s.get("scale_note"):
        parts += ["## What this run can show", "", s["scale_note"].strip(), ""]
    if eval_metrics.get("recipe"):
        parts += ["## Recipe (the paper's comparison)", "", recipe_markdown(eval_metrics["recipe"]), ""]
    parts += [
        "## Accuracy",
        "",
        accuracy_table(eval_metrics),
        "",
    ]
    if benchmark_names(eval_metrics, smoke=True):
        parts += [
            "## Smoke samples (not in any average)",
            "",
            "A few problems of each real benchmark, decoded to check the path runs end to end; the tiny "
            "model is not expected to solve them.",
            "",
            accuracy_table(eval_metrics, smoke=True),
            "",
        ]
    parts += [
        "## Throughput",
        "",
        throughput_table(eval_metrics),
        "",
        "## Detail",
        "",
        detail_table(eval_metrics),
        "",
    ]
    for image in images:
        parts += [f"![{Path(image).stem}]({image})", ""]
    return "\n".join(parts)


def in_prefect_run() -> bool:
    """True inside a Prefect flow or task run (where artifacts can be created)."""
    try:
        from prefect.context import FlowRunContext, TaskRunContext  # lazy: prefect
    except ImportError:  # prefect is a dependency; a trimmed install just skips publishing
        return False
    return FlowRunContext.get() is not None or TaskRunContext.get() is not None


def publish_prefect(markdown: str, key: str, description: str) -> bool:
    """Create a Prefect markdown artifact when running inside a flow run; returns whether it did."""
    if not in_prefect_run():
        return False
    from prefect.artifacts import create_markdown_artifact  # lazy: prefect

    # Prefect artifact keys allow lowercase letters, digits and dashes only.
    safe_key = "".join(ch if ch.isalnum() else "-" for ch in key.lower()).strip("-")
    create_markdown_artifact(markdown=markdown, key=safe_key, description=description)
    return True


def flat_metrics(eval_metrics: Mapping[str, Any]) -> dict[str, float]:
    """Scalars as ``<checkpoint>/<benchmark>/<metric>`` and ``<checkpoint>/throughput/<metric>`` keys; a
    smoke benchmark's as ``<checkpoint>/smoke/<benchmark>/<metric>``, apart from the main ones (the
    average and the throughput are over the main benchmarks only)."""
    out: dict[str, float] = {}
    for name, ckpt in eval_metrics["checkpoints"].items():
        out[f"{name}/average_accuracy"] = float(ckpt["average_accuracy"])
        for key, value in ckpt["throughput"].items():
            out[f"{name}/throughput/{key}"] = float(value)
        smoke = set(ckpt.get("smoke_benchmarks", ()))
        for bench, m in ckpt["benchmarks"].items():
            where = f"{name}/smoke/{bench}" if bench in smoke else f"{name}/{bench}"
            for key, value in m.items():
                if isinstance(value, int | float) and not isinstance(value, bool):
                    out[f"{where}/{key}"] = float(value)
    return out


def publish_wandb(
    cfg: TrackedConfig, job: str, run_dir: Path, eval_metrics: Mapping[str, Any], images: Mapping[str, Path]
) -> str | None:
    """Log the evaluation to W&B (``components.tracking``; offline unless a key is configured): every scalar
    in the run summary, the Table-2 table as a W&B table, the plots as images. Returns the run id."""
    import wandb  # lazy: wandb

    benches = benchmark_names(eval_metrics, smoke=False)
    table = wandb.Table(columns=["checkpoint", "mode", *benches, "average"])
    for name, ckpt in eval_metrics["checkpoints"].items():
        accs = [ckpt["benchmarks"].get(b, {}).get("accuracy") for b in benches]
        table.add_data(name, ckpt["mode"], *accs, ckpt["average_accuracy"])
    with stage_run(cfg, job, run_dir) as run:
        run.summary(flat_metrics(eval_metrics))
        if not run.run.disabled:
            run.log({"accuracy_table": table, **{k: wandb.Image(str(p)) for k, p in images.items()}})
        return run.id
