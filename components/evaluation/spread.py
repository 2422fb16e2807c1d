"""The seed spread of the recipe (issue 27): one commit trained N times with shifted training seeds.

Training on the tiny profile is chaotic: the same commit gives tiny_test accuracies points apart on two
machines. ``aggregate`` takes the evaluation metrics (``artifacts/evaluate/metrics.json``) of N finished runs
that differ only in their training seeds (``components.config.training_seed_overrides``; the problems and
the evaluation's sampling are the same) and gives, per checkpoint of the recipe benchmark and in the recipe
table's order, each run's value, the mean and the spread (max - min) of avg@n accuracy, format-valid rate,
parallel rate, ideal and achieved speedup. ``benchmarks/bench_recipe.py --seeds / --from-dirs --json PATH``
writes it; the committed file (``evaluate.seed_spread``) is what the evaluation report sets beside each
checkpoint's single-run avg@n (``committed_spread``; ``recipe.recipe_markdown`` renders it). Everything
here is a pure function of plain dicts but the file's reading and writing (``load_seed_spread``,
``read_committed_spread``, ``write_seed_spread``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from pydantic import ValidationError, model_validator

from components.errors import UserError
from components.evaluation.recipe import Recipe
from components.settings import StrictModel

MetricName = Literal["accuracy", "format_valid_rate", "parallel_rate", "ideal_speedup", "achieved_speedup"]
# The metrics of a spread, in the recipe table's column order, with their labels; rates print in %.
SPREAD_METRICS: tuple[tuple[MetricName, str], ...] = (
    ("accuracy", "avg@n"),
    ("format_valid_rate", "format-valid"),
    ("parallel_rate", "parallel rate"),
    ("ideal_speedup", "ideal speedup"),
    ("achieved_speedup", "achieved speedup"),
)
RATES = frozenset({"accuracy", "format_valid_rate", "parallel_rate"})


class SeedSpreadError(UserError, ValueError):
    """A seed spread file that does not parse, or runs that cannot be aggregated; names the file or run."""


class MetricSpread(StrictModel):
    """One metric of one checkpoint over the runs: each run's value (None: the run did not measure it)."""

    values: list[float | None]
    mean: float | None = None
    spread: float | None = None  # max - min over the runs that measured it


class CheckpointSpread(StrictModel):
    paper_name: str
    metrics: dict[MetricName, MetricSpread]


class SpreadRun(StrictModel):
    """One run: its workspace, its seed offset (None when not known), its commit and `make run` wall time,
    its training seeds by key path (``components.config.training_seeds``) and the compute precision its
    training ran in (``provenance.precision.compute_dtype`` of its stages; None when not recorded)."""

    source: str
    offset: int | None = None
    commit: str | None = None
    make_run_minutes: float | None = None
    seeds: dict[str, int] | None = None
    precision: str | None = None


class SeedSpread(StrictModel):
    """The file ``bench_recipe.py --json`` writes and ``evaluate.seed_spread`` names. ``precision``: the
    compute precision every run trained in (bf16 and fp32 training are different recipes numerically, so a
    spread is of one; issue 43)."""

    benchmark: str
    n_problems: int
    n_samples: int
    sampling: dict[str, Any]
    precision: str | None = None
    runs: list[SpreadRun]
    checkpoints: dict[str, CheckpointSpread]

    @model_validator(mode="after")
    def _one_value_per_run(self) -> SeedSpread:
        if not self.runs:
            raise ValueError("no runs")
        mixed = {r.precision for r in self.runs if r.precision is not None} - {self.precision}
        if mixed:
            raise ValueError(f"runs trained in {sorted(mixed)} in a spread of precision {self.precision}")
        for name, ckpt in self.checkpoints.items():
            for metric, m in ckpt.metrics.items():
                if len(m.values) != len(self.runs):
                    raise ValueError(
                        f"checkpoints.{name}.metrics.{metric}: {len(m.values)} values for {len(self.runs)} runs"
                    )
        return self

    @property
    def n_runs(self) -> int:
        return len(self.runs)


def run_values(eval_metrics: Mapping[str, Any], benchmark: str) -> dict[str, dict[str, float | None]]:
    """The spread's metrics of one run, per checkpoint evaluated on ``benchmark``: the benchmark's avg@n,
    format-valid and parallel rates and ideal speedup (the recipe table's point estimates), the speedup
    decode's achieved speedup (None for a checkpoint without one)."""
    out: dict[str, dict[str, float | None]] = {}
    for name, ckpt in eval_metrics["checkpoints"].items():
        bench = ckpt["benchmarks"].get(benchmark)
        if bench is None:
            continue
        speed = ckpt.get("speedup") or {}
        achieved = speed.get("achieved_speedup")
        out[name] = {
            "accuracy": float(bench["accuracy"]),
            "format_valid_rate": float(bench["format_valid_rate"]),
            "parallel_rate": float(bench["parallel_rate"]),
            "ideal_speedup": float(bench["ideal_speedup"]),
            "achieved_speedup": None if achieved is None else float(achieved),
        }
    return out


def training_precision(eval_metrics: Mapping[str, Any]) -> str | None:
    """The compute precision a run's training resolved to, as its evaluate stage recorded it (None for a run
    from before it was recorded)."""
    return ((eval_metrics.get("settings") or {}).get("training_precision") or {}).get("compute_dtype")


def metric_spread(values: Sequence[float | None]) -> MetricSpread:
    """Mean and max - min of the values that are there (both None when none is)."""
    present = [float(v) for v in values if v is not None]
    if not present:
        return MetricSpread(values=list(values))
    return MetricSpread(
        values=[None if v is None else float(v) for v in values],
        mean=sum(present) / len(present),
        spread=max(present) - min(present),
    )


def _shape(eval_metrics: Mapping[str, Any], benchmark: str, source: str) -> tuple[int, int]:
    """The (problems, samples) of ``benchmark`` in one run, the same for every checkpoint."""
    shapes = {
        (int(b["n_problems"]), int(b["n_samples"]))
        for ckpt in eval_metrics["checkpoints"].values()
        if (b := ckpt["benchmarks"].get(benchmark)) is not None
    }
    if not shapes:
        raise SeedSpreadError(f"{source}: no checkpoint was evaluated on {benchmark!r}")
    if len(shapes) > 1:
        raise SeedSpreadError(
            f"{source}: checkpoints evaluated {benchmark!r} on different sizes {sorted(shapes)}"
        )
    return shapes.pop()


def aggregate(
    runs_metrics: Sequence[Mapping[str, Any]],
    benchmark: str,
    recipe: Recipe,
    runs: Sequence[SpreadRun] | None = None,
) -> SeedSpread:
    """The spread over runs of one recipe: per checkpoint (``recipe``'s order and names) and metric, each
    run's value, the mean and max - min. ``runs`` describes each run (default: ``run 0``, ``run 1``, ...).

    Raises SeedSpreadError when the runs are not measurements of the same thing: a run without the benchmark,
    another number of problems or samples, other sampling settings (a spread would then hold more than
    training noise)."""
    if not runs_metrics:
        raise SeedSpreadError("no runs to aggregate")
    runs = (
        list(runs) if runs is not None else [SpreadRun(source=f"run {i}") for i in range(len(runs_metrics))]
    )
    if len(runs) != len(runs_metrics):
        raise ValueError(f"{len(runs)} run descriptions for {len(runs_metrics)} runs")
    shapes = [_shape(m, benchmark, r.source) for m, r in zip(runs_metrics, runs, strict=True)]
    if len(set(shapes)) > 1:
        listed = ", ".join(f"{r.source}: {p} x {s}" for r, (p, s) in zip(runs, shapes, strict=True))
        raise SeedSpreadError(f"the runs evaluated {benchmark!r} on different problems x samples ({listed})")
    samplings = [dict(m.get("settings", {}).get("sampling", {})) for m in runs_metrics]
    for r, sampling in zip(runs[1:], samplings[1:], strict=True):
        if sampling != samplings[0]:
            raise SeedSpreadError(
                f"{r.source}: evaluation sampling {sampling} differs from {runs[0].source}'s {samplings[0]}; "
                "a seed spread compares trainings evaluated the same way"
            )
    values = [run_values(m, benchmark) for m in runs_metrics]
    names = recipe.order(name for v in values for name in v)
    checkpoints = {
        name: CheckpointSpread(
            paper_name=recipe.paper_name(name),
            metrics={
                metric: metric_spread([v.get(name, {}).get(metric) for v in values])
                for metric, _ in SPREAD_METRICS
            },
        )
        for name in names
    }
    precisions = {r.precision for r in runs}
    if len(precisions) > 1:
        listed = ", ".join(f"{r.source}: {r.precision}" for r in runs)
        raise SeedSpreadError(f"the runs trained in different precisions ({listed}); a spread is of one")
    n_problems, n_samples = shapes[0]
    return SeedSpread(
        benchmark=benchmark,
        n_problems=n_problems,
        n_samples=n_samples,
        sampling=samplings[0],
        precision=precisions.pop(),
        runs=runs,
        checkpoints=checkpoints,
    )


def write_seed_spread(spread: SeedSpread, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spread.model_dump(mode="json"), indent=2) + "\n", encoding="utf-8")


def load_seed_spread(path: Path) -> SeedSpread:
    """Read a seed spread file; anything but one ``SeedSpread`` is one SeedSpreadError naming the file."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SeedSpreadError(f"seed spread file {path}: cannot be read as JSON ({err})") from None
    try:
        return SeedSpread.model_validate(data)
    except ValidationError as err:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '(top)'}: {e['msg'].removeprefix('Value error, ')}"
            for e in err.errors()
        )
        raise SeedSpreadError(
            f"seed spread file {path} is malformed (write it with benchmarks/bench_recipe.py --json): {problems}"
        ) from None


PRECISION_FIELD = "{precision}"


def spread_path(setting: str | None, precision: str) -> str | None:
    """The file ``evaluate.seed_spread`` names for a run that trained in ``precision``: the setting with
    ``{precision}`` replaced (one committed spread per precision), or the setting itself."""
    return None if setting is None else setting.replace(PRECISION_FIELD, precision)


def read_committed_spread(path: str | None) -> SeedSpread | None:
    """The committed spread at ``path`` (``spread_path``): None when that is null or the file does not
    exist; a malformed file raises (the evaluate stage reads it before it decodes anything)."""
    if path is None or not Path(path).exists():
        return None
    return load_seed_spread(Path(path))


def committed_spread(
    path: str | None,
    spread: SeedSpread | None,
    benchmark: str,
    n_problems: int,
    n_samples: int,
    precision: str | None = None,
) -> dict[str, Any]:
    """What the report says about the committed spread (``path``, read by ``read_committed_spread``), as a
    plain dict: ``state`` is ``unset`` (null), ``absent`` (no such file), ``mismatch`` (measured on another
    benchmark or size, or with training in another precision than this run's ``precision``; ``detail``
    says which) or ``shown`` (``spread`` is the file's content)."""
    if path is None:
        return {"file": None, "state": "unset"}
    if spread is None:
        return {"file": path, "state": "absent"}
    theirs = (spread.benchmark, spread.n_problems, spread.n_samples)
    if theirs != (benchmark, n_problems, n_samples):
        detail = (
            f"it was measured on {spread.benchmark} ({spread.n_problems} problems x {spread.n_samples} samples), "
            f"this run on {benchmark} ({n_problems} x {n_samples})"
        )
        return {"file": path, "state": "mismatch", "detail": detail}
    if precision is not None and spread.precision is not None and spread.precision != precision:
        detail = f"its runs trained in {spread.precision}, this run in {precision}"
        return {"file": path, "state": "mismatch", "detail": detail}
    return {"file": path, "state": "shown", "spread": spread.model_dump(mode="json")}


# ---------------------------------------------------------------------------------------------- rendering
def format_value(metric: str, value: float | None) -> str:
    if value is None:
        return "–"
    return f"{100 * value:.1f}" if metric in RATES else f"{value:.2f}"


def spread_markdown(spread: SeedSpread) -> str:
    """One table per metric: a row per checkpoint with each run's value, the mean and the spread; then the
    runs (workspace, seed offset, commit, `make run` minutes)."""
    n = spread.n_samples
    runs = spread.runs
    lines = [
        f"On `{spread.benchmark}` ({spread.n_problems} problems x {n} samples), {len(runs)} runs; spread = "
        "max - min over the runs (rates in %).",
    ]
    for metric, label in SPREAD_METRICS:
        title = f"avg@{n}" if metric == "accuracy" else label
        header = ["checkpoint", "stage", *(f"run {i}" for i in range(len(runs))), "mean", "spread"]
        lines += ["", f"### {title}", "", "| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        for name, ckpt in spread.checkpoints.items():
            m = ckpt.metrics[metric]
            cells = [ckpt.paper_name, name, *(format_value(metric, v) for v in m.values)]
            cells += [format_value(metric, m.mean), format_value(metric, m.spread)]
            lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "| run | workspace | seed offset | commit | make run, min |", "|---|---|---|---|---|"]
    for i, r in enumerate(runs):
        offset = "–" if r.offset is None else str(r.offset)
        minutes = "–" if r.make_run_minutes is None else f"{r.make_run_minutes:.1f}"
        lines.append(f"| {i} | {r.source} | {offset} | {(r.commit or '–')[:10]} | {minutes} |")
    return "\n".join(lines)
