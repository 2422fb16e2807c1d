"""What a stage reports beside its outputs: the flat numbers DVC compares and the rows DVC plots.

- ``metrics/<stage>.json`` (DVC ``metrics``, git-tracked, ``cache: false``, as DVC's example project): the
  few numbers a user compares between runs, flat, in one shared vocabulary (``accuracy``, ``format_valid``,
  ``correct_and_valid``, ``parallel_rate``, ``speedup``, ``tokens_per_s``, ``steps``, counts, ``wall_time_s``)
  so that ``dvc metrics show`` is one readable table with a row per stage. The evaluation writes
  ``metrics/evaluate/<checkpoint>.json``: a row per checkpoint. ``dvc exp run -S ...`` commits these files
  with dvc.lock, so ``dvc exp show`` and ``dvc metrics diff`` show what an experiment changed.
- ``plots/<stage>/train.json`` (and ``eval.json`` for RL): the training curves of every training stage,
  read from the per-step logs the trainers keep in the stage's work dir (SFT ``train_metrics.json``, RL
  ``metrics.jsonl``); drawn by the top-level ``plots:`` of dvc.yaml.
- markdown for the Prefect UI: a stage's numbers (``stage_markdown``) and the run's wall times
  (``timing_markdown``); the flow publishes them.

Provenance (prompt hash, profile, threads), nested tables and free text stay in the stage's full record,
``artifacts/<stage>/metrics.json``, never here. This module is plumbing (``tests.support.code_deps``): it only
reshapes what a stage returned or logged.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from components.artifacts import read_json, write_json
from components.config import PipelineConfig
from components.data.config import RejectFilterConfig, SampleOrzConfig
from components.engine.config import DistillConfig
from components.evaluation.report import accuracy_table, throughput_table
from components.models.config import SeedConfig
from components.training.config import RLStageConfig, SFTStageConfig

Flat = dict[str, Any]  # metric name -> number (or a nested dict of numbers: DVC flattens it as a.b)


def _number(value: Any) -> float | int | None:
    """A JSON-safe number, or None (DVC can diff only numbers; NaN is not JSON)."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        return None if math.isnan(value) or math.isinf(value) else round(value, 6)
    return None


def _pick(metrics: Mapping[str, Any], names: Mapping[str, str]) -> Flat:
    """``{flat name: metrics[source name]}`` for the sources that hold a number."""
    out: Flat = {}
    for flat_name, source in names.items():
        value = _number(metrics.get(source))
        if value is not None:
            out[flat_name] = value
    return out


def _scalars(metrics: Mapping[str, Any]) -> Flat:
    """Fallback for a stage without a summary below: its top-level numbers."""
    return {k: v for k, v in ((k, _number(v)) for k, v in metrics.items()) if v is not None}


def sample_orz_summary(m: Mapping[str, Any]) -> Flat:
    return _pick(
        m,
        {n: n for n in ("rows_in", "kept", "quarantined", "duplicates", "n_train", "n_test")},
    )


def seed_summary(m: Mapping[str, Any]) -> Flat:
    names = {"steps": "steps", "final_loss": "final_loss", "n": "eval_n"}
    names.update({k: k for k in ("accuracy", "format_valid", "correct_and_valid")})
    return _pick(m, names)


def rl_summary(m: Mapping[str, Any]) -> Flat:
    names = {
        "steps": "steps",
        "accuracy": "final/accuracy",
        "format_valid": "final/format_valid",
        "correct_and_valid": "final/correct_and_valid",
        "parallel_rate": "final/parallel_rate",
        "accuracy_gain": "delta/accuracy",
        "rollouts_trained": "train/rollouts_trained",
        "structurally_rejected": "train/structurally_rejected",
        "tokens_per_s": "perf/tokens_per_s",
    }
    return _pick(m, names)


def distill_summary(m: Mapping[str, Any]) -> Flat:
    names = {"n": "n_trajectories", "mean_response_tokens": "mean_response_tokens"}
    names.update({k: k for k in ("accuracy", "format_valid", "correct_and_valid", "tokens_per_s")})
    return _pick(m, names)


def reject_filter_summary(m: Mapping[str, Any]) -> Flat:
    names = {k: k for k in ("sampled", "accepted", "acceptance_rate")}
    names.update({k: k for k in ("rejected_wrong", "rejected_format", "rejected_other")})
    return _pick(m, names)


def warmup_summary(m: Mapping[str, Any]) -> Flat:
    return _pick(
        m, {"steps": "steps", "final_loss": "final_loss", "n": "n_examples", "rejected": "n_rejected"}
    )


def main_benchmarks(ckpt: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """An evaluated checkpoint's benchmarks without its smoke ones (``smoke_benchmarks``: a few problems
    that check the path runs, reported in their own table and never in a flat metric or an average)."""
    smoke = set(ckpt.get("smoke_benchmarks", ()))
    return {name: b for name, b in ckpt.get("benchmarks", {}).items() if name not in smoke}


def _mean(values: list[float | int | None]) -> float | None:
    numbers = [v for v in values if v is not None]
    return round(sum(numbers) / len(numbers), 6) if numbers else None


def checkpoint_summary(ckpt: Mapping[str, Any]) -> Flat:
    """One evaluated checkpoint: its averages over its main (non-smoke) benchmarks, its speedup, and
    accuracy per main benchmark. Smoke benchmarks enter none of these; a checkpoint evaluated on smoke
    benchmarks only has no average here (its record, ``artifacts/evaluate/metrics.json``, has them)."""
    benches = main_benchmarks(ckpt)
    out: Flat = {}
    for flat_name, source in (
        ("accuracy", "accuracy"),
        ("format_valid", "format_valid_rate"),
        ("parallel_rate", "parallel_rate"),
    ):
        value = _mean([_number(b.get(source)) for b in benches.values()])
        if value is not None:
            out[flat_name] = value
    if benches:  # the runner's throughput is over the main benchmarks (over smoke ones when it has no other)
        out.update(
            _pick(
                ckpt.get("throughput", {}),
                {
                    "speedup": "achieved_speedup",
                    "ideal_speedup": "ideal_speedup",
                    "tokens_per_s": "tokens_per_s",
                },
            )
        )
    per_bench = {name: _number(b.get("accuracy")) for name, b in benches.items()}
    out["benchmark"] = {k: v for k, v in per_bench.items() if v is not None}
    return out


# What each kind of stage reports, keyed by its section's type (components.config's stage table): a stage
# is summarised by its kind (PR1RLConfig is an RLStageConfig), so no stage name is written here.
SUMMARIES: dict[type, Callable[[Mapping[str, Any]], Flat]] = {
    SampleOrzConfig: sample_orz_summary,
    SeedConfig: seed_summary,
    RLStageConfig: rl_summary,
    DistillConfig: distill_summary,
    RejectFilterConfig: reject_filter_summary,
    SFTStageConfig: warmup_summary,
}


def summary_of(stage: str) -> Callable[[Mapping[str, Any]], Flat] | None:
    """The summary function of ``stage``'s kind; None for a stage without one of its own (``evaluate``,
    whose metrics are per checkpoint, or a name the config has no section for)."""
    field = PipelineConfig.model_fields.get(stage)
    kind = field.annotation if field is not None else None
    if not isinstance(kind, type):
        return None
    return next((summarise for base, summarise in SUMMARIES.items() if issubclass(kind, base)), None)


def stage_summary(stage: str, metrics: Mapping[str, Any]) -> Flat:
    """The flat metrics of one (single-file) stage, ``wall_time_s`` included."""
    flat = (summary_of(stage) or _scalars)(metrics)
    if (wall := _number(metrics.get("wall_time_s"))) is not None:
        flat["wall_time_s"] = wall
    return flat


def write_summary(stage: str, metrics: Mapping[str, Any], target: Path) -> list[Path]:
    """Write the stage's flat metrics to ``target``: a ``.json`` file, or (evaluate) a directory with one
    ``<checkpoint>.json`` per evaluated checkpoint. Returns the files written."""
    target = Path(target)
    if target.suffix == ".json":
        write_json(target, stage_summary(stage, metrics))
        return [target]
    if target.exists():
        shutil.rmtree(target)  # a checkpoint no longer evaluated must not keep its old row
    written = []
    wall = _number(metrics.get("wall_time_s"))
    for name, ckpt in metrics.get("checkpoints", {}).items():
        flat = checkpoint_summary(ckpt)
        if wall is not None:
            flat["wall_time_s"] = wall
        write_json(target / f"{name}.json", flat)
        written.append(target / f"{name}.json")
    target.mkdir(parents=True, exist_ok=True)
    return written


# ----------------------------------------------------------------------------------------------------
# training curves

SFT_LOG = "train_metrics.json"
RL_LOG = "metrics.jsonl"
SFT_CURVE = {"loss": "loss", "lr": "lr", "grad_norm": "grad_norm"}
RL_CURVE = {
    "reward": "reward/mean",
    "pg_loss": "actor/pg_loss",
    "format_valid": "rollout/format_valid",
    "correct_and_valid": "rollout/correct_and_valid",
    "parallel_rate": "rollout/parallel_rate",
    "response_length": "response_length/mean",
}
EVAL_CURVE = {k: k for k in ("accuracy", "format_valid", "correct_and_valid", "parallel_rate")}


def _rows(records: list[Mapping[str, Any]], fields: Mapping[str, str]) -> list[dict[str, Any]]:
    """One row per step (the last record of a step wins: a resumed run logs a step again), every field in
    every row: ``null`` where the step has no value (a step without an update has no reward). DVC drops a
    whole plot when one of its files lacks the field; Vega leaves nulls out of a line."""
    by_step: dict[int, dict[str, Any]] = {}
    for rec in records:
        step = rec.get("step")
        if not isinstance(step, int):
            continue
        values = _pick(rec, fields)
        if values:
            by_step[step] = {"step": step, **{name: values.get(name) for name in fields}}
    return [by_step[s] for s in sorted(by_step)]


def training_curves(work_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """``{"train": rows, ["eval": rows]}`` from the trainer's log in ``work_dir`` (empty when none ran)."""
    work_dir = Path(work_dir)
    if (work_dir / SFT_LOG).exists():
        return {"train": _rows(read_json(work_dir / SFT_LOG).get("history", []), SFT_CURVE)}
    if (work_dir / RL_LOG).exists():
        records = []
        for line in (work_dir / RL_LOG).read_text(encoding="utf-8").splitlines():
            if line.strip():
                records.append(json.loads(line))
        # step 0 (the eval before training) has no training record; later evals ride on their step's record
        evals = [r.get("eval") for r in records if isinstance(r.get("eval"), dict)]
        train = [r for r in records if "reward/mean" in r]
        return {"train": _rows(train, RL_CURVE), "eval": _rows(evals, EVAL_CURVE)}
    return {"train": []}


def write_training_curves(work_dir: Path | None, plots_dir: Path) -> dict[str, Path]:
    """Write ``train.json`` (and ``eval.json``) into ``plots_dir``; an empty list when the stage trained
    nothing here (a hub seed, a verl job), so the declared output always exists."""
    curves = training_curves(work_dir) if work_dir is not None else {"train": []}
    paths = {}
    for name, rows in curves.items():
        paths[name] = Path(plots_dir) / f"{name}.json"
        write_json(paths[name], rows)
    return paths


# ----------------------------------------------------------------------------------------------------
# W&B: the same numbers, plus why records were dropped (as a fixed set of categories)

# Where each stage returns its per-reason counts; every key is a category from a fixed list (a quality
# check's name, a filter rule, a parser violation code), never a message.
REJECTION_FIELDS = ("quarantine_reasons", "duplicate_reasons", "reasons", "rejected_by_reason")
RL_REJECTIONS_LOG = "rollout_rejections.jsonl"
MAX_CATEGORIES = 64  # a guard: more distinct reasons than this means free text leaked into a category


def rejection_categories(metrics: Mapping[str, Any], work_dir: Path | None = None) -> dict[str, int]:
    """Counts per rejection category: the stage's own counters, and (RL) the filtered rollouts' log."""
    counts: dict[str, int] = {}
    for field in REJECTION_FIELDS:
        for reason, n in (metrics.get(field) or {}).items():
            if isinstance(n, int):
                counts[str(reason)] = counts.get(str(reason), 0) + n
    log = Path(work_dir) / RL_REJECTIONS_LOG if work_dir is not None else None
    if log is not None and log.exists():
        # a resumed run replays the steps after its last checkpoint: a step counts as its last writer
        # (``segment``, one per trainer process) logged it
        by_step: dict[Any, tuple[Any, list[str]]] = {}
        for line in log.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            rec = json.loads(line)
            segment, reasons = by_step.get(rec.get("step"), (None, []))
            if segment != rec.get("segment"):
                reasons = []
            by_step[rec.get("step")] = (rec.get("segment"), [*reasons, str(rec["reason"])])
        for _, reasons in by_step.values():
            for reason in reasons:
                counts[reason] = counts.get(reason, 0) + 1
    if len(counts) > MAX_CATEGORIES:
        raise ValueError(f"{len(counts)} rejection categories (> {MAX_CATEGORIES}): free text in a reason?")
    return dict(sorted(counts.items()))


def flatten(
    values: Mapping[str, Any], leaf: Callable[[Any], Any] = lambda v: v, prefix: str = ""
) -> dict[str, Any]:
    """Nested mappings as ``outer/inner`` keys; every other value goes through ``leaf`` and is left out
    when that gives None (the one flattener: W&B summaries here, the flow's report, ``npr`` tables)."""
    out: dict[str, Any] = {}
    for key, value in values.items():
        if isinstance(value, Mapping):
            out.update(flatten(value, leaf, f"{prefix}{key}/"))
        elif (kept := leaf(value)) is not None:
            out[f"{prefix}{key}"] = kept
    return out


def wandb_summary(
    stage: str, metrics: Mapping[str, Any], work_dir: Path | None = None, categories: bool = True
) -> dict[str, Any]:
    """The run summary of a stage: its flat metrics (evaluate: ``<checkpoint>/<metric>``) and
    ``rejected/<category>`` counts (``categories``)."""
    if "checkpoints" in metrics and summary_of(stage) is None:
        flat = flatten({name: checkpoint_summary(c) for name, c in metrics["checkpoints"].items()}, _number)
        if (wall := _number(metrics.get("wall_time_s"))) is not None:
            flat["wall_time_s"] = wall
    else:
        flat = flatten(stage_summary(stage, metrics), _number)
    if categories:
        flat.update({f"rejected/{k}": v for k, v in rejection_categories(metrics, work_dir).items()})
    return flat


# ------------------------------------------------------------------------------------ markdown
def embed_images(markdown: str, base: Path) -> str:
    """``![x](file.png)`` -> ``![x](data:image/png;base64,...)``: a Prefect artifact cannot link files."""

    def inline(match: re.Match[str]) -> str:
        path = base / match.group(2)
        if not path.is_file():
            return match.group(0)
        data = base64.b64encode(path.read_bytes()).decode()
        return f"![{match.group(1)}](data:image/png;base64,{data})"

    return re.sub(r"!\[([^\]]*)\]\(([^):]+\.png)\)", inline, markdown)


def stage_markdown(stage: str, metrics: dict[str, Any], header: str) -> str:
    """A stage's numbers as markdown (the flow's Prefect artifact): ``header`` (how its task went), the flat
    metrics `dvc metrics show` reads, the evaluation's tables, then every other number of the stage's record,
    flattened."""
    parts = [f"## Stage `{stage}`: {header}", ""]
    if not metrics:
        return "\n".join([*parts, "_no metrics recorded_", ""])
    if "checkpoints" in metrics:
        parts += [
            "### Accuracy",
            "",
            accuracy_table(metrics),
            "",
            "### Throughput",
            "",
            throughput_table(metrics),
        ]
        rows = {
            f"{c}/{k}": v for c, m in metrics["checkpoints"].items() for k, v in checkpoint_summary(m).items()
        }
    else:
        rows = stage_summary(stage, metrics)
    parts += ["", "### Summary (`dvc metrics show`)", "", _table(_flatten(rows))]
    skip = {"provenance", "checkpoints", "settings", "evals", "rejection_examples"}
    detail = _flatten({k: v for k, v in metrics.items() if k not in skip})
    detail = {k: v for k, v in detail.items() if k not in _flatten(rows)}
    if detail:
        parts += ["", "### All recorded numbers", "", _table(detail)]
    prov = metrics.get("provenance") or {}
    if prov:
        parts += ["", "Provenance: " + ", ".join(f"{k} `{v}`" for k, v in _flatten(prov).items())]
    return "\n".join(parts) + "\n"


def _flatten(values: dict[str, Any]) -> dict[str, Any]:
    """Nested dicts as ``outer/inner`` keys; scalars only (lists, e.g. the eval history, are left out)."""
    return flatten(values, lambda v: v if isinstance(v, int | float | str) else None)


def _table(rows: dict[str, Any]) -> str:
    def cell(v: Any) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    return "\n".join(["| metric | value |", "|---|---|", *(f"| {k} | {cell(v)} |" for k, v in rows.items())])


def timing_markdown(stage_wall_s: dict[str, float], total_s: float) -> str:
    """The run's wall-time table: each stage's task (DVC check, run or skip, push) and the whole pipeline."""
    rows = [f"| {name} | {wall:.1f} |" for name, wall in stage_wall_s.items()]
    return "\n".join(
        [
            "## Pipeline wall time",
            "",
            "| stage | wall s |",
            "|---|---|",
            *rows,
            f"| **total** | **{total_s:.1f}** |",
        ]
    )
