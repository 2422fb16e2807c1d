"""The nightly regression gate: a checkpoint's evaluation against its pinned baseline and the last green run.

Decisions (conventions.md §C2):

- accuracy-like metrics (``NightlyConfig.gate_metrics``) vs the baseline: FAIL only when the one-sided upper
  confidence bound of the current value (Wilson at n = problems x samples, or a bootstrap over problems) is
  below ``baseline * (1 - tolerance)``, i.e. the data say the drop is real; WARN when only the point estimate
  is below that threshold; PASS otherwise.
- the same comparison vs the last green nightly is drift: it can WARN, never FAIL (the baseline decides
  promotion; drift is for people to look at).
- hard floors on format-valid rate and (for parallel checkpoints) parallel rate: below the floor is FAIL.
  These regress before accuracy does. A point drop of either beyond tolerance vs the baseline WARNs.
- settings the numbers depend on (sampling, prompt hash, n problems, samples, k) must match the baseline,
  else the comparison is meaningless and the gate FAILs saying so; an engine change WARNs.
- the checkpoint's hash never decides anything: its bytes differ between machines of the same kind (the
  seed model is only statistically reproducible there, docs/architecture.md) and a retrained checkpoint is
  exactly what the gate exists to judge, by its metrics. A changed hash is reported (a ``pass`` check that
  says so), never a warning or a failure.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from components.artifacts import read_json, write_json
from components.errors import UserError
from components.evaluation.bounds import bootstrap_interval, wilson_interval
from components.evaluation.config import NightlyConfig
from components.evaluation.metrics import per_problem_accuracy, per_problem_pass_at_k
from components.settings import StrictModel

Verdict = Literal["pass", "warn", "fail"]


class BaselineError(UserError, ValueError):
    """A baseline file is missing, not YAML, or not a baseline; the message names the file and key."""


_SEVERITY = {"pass": 0, "warn": 1, "fail": 2}

# Metrics copied into a baseline file (the gate reads a subset; the rest make the diff table useful).
BASELINE_METRICS = (
    "accuracy",
    "pass@k",
    "format_valid_rate",
    "parallel_rate",
    "parallel_rate_any",
    "mean_branches_per_block",
    "mean_tokens",
    "truncation_rate",
    "ideal_speedup",
    "tokens_per_s",
)


class BaselineBenchmark(StrictModel):
    n_problems: int
    n_samples: int
    k: int
    metrics: dict[str, float]


class Baseline(StrictModel):
    """A committed ``eval/baselines/<tag>.yaml``: the numbers a promoted checkpoint must keep."""

    tag: str
    profile: str
    checkpoint: str
    mode: Literal["parallel", "sequential"]
    prompt_style: Literal["parallel", "sequential", "parallel_r1"]
    checkpoint_hash: str
    prompt_hash: str
    engine_version: dict[str, str]
    sampling: dict[str, Any]
    created_at: str
    benchmarks: dict[str, BaselineBenchmark]


@dataclass(frozen=True)
class Check:
    """One gate comparison and its verdict."""

    benchmark: str
    metric: str
    reference: Literal["baseline", "last_green", "floor", "settings"]
    verdict: Verdict
    reason: str
    reference_value: float | str | None = None
    current: float | str | None = None
    bound: float | None = None
    threshold: float | None = None


@dataclass
class GateResult:
    checks: list[Check] = field(default_factory=list)

    @property
    def verdict(self) -> Verdict:
        worst = max((_SEVERITY[c.verdict] for c in self.checks), default=0)
        return next(v for v, s in _SEVERITY.items() if s == worst)

    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == "fail"]

    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.verdict == "warn"]

    def to_dict(self) -> dict[str, Any]:
        return {"verdict": self.verdict, "checks": [asdict(c) for c in self.checks]}


def baseline_path(cfg_nightly: NightlyConfig, profile: str, checkpoint: str) -> Path:
    """``<baseline_dir>/<tag>.yaml`` with the configured tag or ``<profile>-<checkpoint>``."""
    tag = cfg_nightly.baseline_tag or f"{profile}-{checkpoint}"
    return Path(cfg_nightly.baseline_dir) / f"{tag}.yaml"


def load_baseline(path: Path) -> Baseline:
    from pydantic import ValidationError

    from components.config import ConfigError, load_yaml_text

    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"baseline {path} does not exist; create it from a trusted run with "
            "components.evaluation.gate.write_baseline and commit it"
        )
    try:
        data = load_yaml_text(path.read_text(encoding="utf-8"), f"baseline {path}")
    except ConfigError as err:
        raise BaselineError(str(err)) from None
    if not isinstance(data, dict):
        raise BaselineError(f"baseline {path} must hold a mapping")
    try:
        return Baseline.model_validate(data)
    except ValidationError as err:
        where = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in err.errors())
        raise BaselineError(f"baseline {path}: {where}") from None


def write_baseline(
    eval_metrics: Mapping[str, Any],
    cfg: Any,
    path: Path | str,
    checkpoint: str | None = None,
    command: str | None = None,
    benchmarks: Sequence[str] | None = None,
) -> Baseline:
    """Write the baseline file of one checkpoint from an evaluation's metrics (the stage's or `npr eval`'s).

    ``cfg`` is the PipelineConfig of the run; ``checkpoint`` defaults to ``cfg.nightly.checkpoint``;
    ``benchmarks`` to the ones the nightly runs (``cfg.nightly.benchmarks``, else all of the evaluation's),
    since the gate fails on a baseline benchmark the night did not evaluate.
    The header comment records how the numbers were produced (baseline updates land by PR, with a reason).
    """
    name = checkpoint or cfg.nightly.checkpoint
    checkpoints = eval_metrics.get("checkpoints", {})
    if name not in checkpoints:
        raise KeyError(f"checkpoint {name!r} is not in the evaluation (it has {sorted(checkpoints)})")
    ckpt = checkpoints[name]
    settings = eval_metrics["settings"]
    wanted = list(benchmarks or cfg.nightly.benchmarks or ckpt["benchmarks"])
    missing = [b for b in wanted if b not in ckpt["benchmarks"]]
    if missing:
        raise KeyError(f"benchmarks {missing} are not in the evaluation of {name!r}")
    baseline_benchmarks = {
        bench: BaselineBenchmark(
            n_problems=int(m["n_problems"]),
            n_samples=int(m["n_samples"]),
            k=int(m["k"]),
            metrics={key: float(m[key]) for key in BASELINE_METRICS if key in m},
        )
        for bench, m in ckpt["benchmarks"].items()
        if bench in wanted
    }
    path = Path(path)
    baseline = Baseline(
        tag=path.stem,
        profile=cfg.profile,
        checkpoint=name,
        mode=ckpt["mode"],
        prompt_style=ckpt["prompt_style"],
        checkpoint_hash=ckpt["checkpoint_hash"],
        prompt_hash=settings["prompt_hash"],
        engine_version={k: str(v) for k, v in settings["engine_version"].items()},
        sampling=dict(settings["sampling"]),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        benchmarks=baseline_benchmarks,
    )
    header = (
        f"# Baseline of checkpoint '{name}' (profile '{cfg.profile}') for the nightly regression gate.\n"
        f"# Produced by: {command or 'components.evaluation.gate.write_baseline'}\n"
        "# Update only by PR, with a line saying why the numbers changed.\n"
    )
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(header + yaml.safe_dump(baseline.model_dump(mode="json"), sort_keys=False, width=100))
    tmp.replace(path)
    return baseline


def _upper_bound(
    metric: str,
    value: float,
    bench_metrics: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]] | None,
    cfg: NightlyConfig,
    seed: int,
) -> float:
    """One-sided upper confidence bound of the current value of ``metric``."""
    n_problems = int(bench_metrics["n_problems"])
    if cfg.method == "bootstrap":
        if not records:
            raise ValueError(f"bootstrap gate on {metric} needs the per-sample records of the run")
        per_problem = (
            per_problem_accuracy(records)
            if metric == "accuracy"
            else per_problem_pass_at_k(records, int(bench_metrics["k"]))
        )
        return bootstrap_interval(per_problem, cfg.confidence, cfg.bootstrap_samples, seed)[1]
    # Wilson: accuracy is a proportion over problems x samples; pass@k is one (fractional) trial per problem.
    n = n_problems * int(bench_metrics["n_samples"]) if metric == "accuracy" else n_problems
    return wilson_interval(min(max(value, 0.0), 1.0) * n, n, cfg.confidence)[1]


def _compare(
    bench: str,
    metric: str,
    reference: Literal["baseline", "last_green"],
    ref_value: float,
    bench_metrics: Mapping[str, Any],
    records: Sequence[Mapping[str, Any]] | None,
    cfg: NightlyConfig,
    seed: int,
) -> Check:
    value = float(bench_metrics[metric])
    threshold = ref_value * (1 - cfg.tolerance)
    upper = _upper_bound(metric, value, bench_metrics, records, cfg, seed)
    if upper < threshold:
        verdict: Verdict = "fail" if reference == "baseline" else "warn"
        what = "a real drop" if reference == "baseline" else "a real drift from the last green run"
        reason = f"upper {cfg.confidence:.0%} bound {upper:.4f} < {threshold:.4f}: {what}"
    elif value < threshold:
        verdict, reason = "warn", f"point estimate below {threshold:.4f}, within noise"
    else:
        verdict, reason = "pass", "within tolerance"
    return Check(bench, metric, reference, verdict, reason, ref_value, value, upper, threshold)


def _settings_checks(
    current: Mapping[str, Any], settings: Mapping[str, Any], baseline: Baseline
) -> list[Check]:
    checks = []
    fatal = {
        "sampling": (baseline.sampling, dict(settings["sampling"])),
        "prompt_hash": (baseline.prompt_hash, settings["prompt_hash"]),
        "mode": (baseline.mode, current["mode"]),
        "prompt_style": (baseline.prompt_style, current["prompt_style"]),
    }
    for key, (ref, cur) in fatal.items():
        if ref != cur:
            checks.append(
                Check(
                    "*",
                    key,
                    "settings",
                    "fail",
                    "differs from the baseline: the numbers are not comparable; "
                    "re-create the baseline if the change is intended",
                    str(ref),
                    str(cur),
                )
            )
    engine = {k: str(v) for k, v in settings["engine_version"].items()}
    if engine != baseline.engine_version:
        checks.append(
            Check(
                "*",
                "engine_version",
                "settings",
                "warn",
                "engine changed since the baseline",
                str(baseline.engine_version),
                str(engine),
            )
        )
    if current["checkpoint_hash"] != baseline.checkpoint_hash:
        checks.append(
            Check(
                "*",
                "checkpoint_hash",
                "settings",
                "pass",
                "a different checkpoint than the baseline's (reported only: the gate judges metrics)",
                baseline.checkpoint_hash,
                current["checkpoint_hash"],
            )
        )
    return checks


def gate_checkpoint(
    current: Mapping[str, Any],
    settings: Mapping[str, Any],
    baseline: Baseline,
    cfg: NightlyConfig,
    records: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    last_green: Mapping[str, Any] | None = None,
    seed: int = 0,
) -> GateResult:
    """Gate one checkpoint's evaluation.

    ``current`` is one entry of an evaluation's ``checkpoints`` (mode, checkpoint_hash, benchmarks);
    ``settings`` the evaluation's ``settings``; ``records`` the per-sample records by benchmark (needed by
    the bootstrap method); ``last_green`` the ``checkpoints`` entry of the last green nightly, if any.
    """
    result = GateResult(_settings_checks(current, settings, baseline))
    benches = current["benchmarks"]
    for bench, ref in baseline.benchmarks.items():
        if bench not in benches:
            result.checks.append(Check(bench, "*", "baseline", "fail", "benchmark missing from this run"))
            continue
        m = benches[bench]
        shape = {"n_problems": ref.n_problems, "n_samples": ref.n_samples, "k": ref.k}
        shape_now = {key: int(m[key]) for key in shape}
        if shape != shape_now:
            result.checks.append(
                Check(
                    bench,
                    "shape",
                    "settings",
                    "fail",
                    "problems/samples/k differ from the baseline",
                    str(shape),
                    str(shape_now),
                )
            )
            continue
        bench_records = (records or {}).get(bench)
        for metric in cfg.gate_metrics:
            if metric in ref.metrics:
                result.checks.append(
                    _compare(bench, metric, "baseline", ref.metrics[metric], m, bench_records, cfg, seed)
                )
        green = ((last_green or {}).get("benchmarks") or {}).get(bench)
        if green is not None and all(int(green[key]) == shape[key] for key in shape):
            for metric in cfg.gate_metrics:
                if metric in green:
                    result.checks.append(
                        _compare(
                            bench, metric, "last_green", float(green[metric]), m, bench_records, cfg, seed
                        )
                    )
        result.checks.extend(_floor_checks(bench, m, ref, current["mode"] == "parallel", cfg))
    return result


def _floor_checks(
    bench: str, m: Mapping[str, Any], ref: BaselineBenchmark, parallel: bool, cfg: NightlyConfig
) -> list[Check]:
    floors = {"format_valid_rate": cfg.format_valid_floor}
    if parallel:
        floors["parallel_rate"] = cfg.parallel_rate_floor
    checks = []
    for metric, floor in floors.items():
        value = float(m[metric])
        ref_value = ref.metrics.get(metric)
        if value < floor:
            verdict: Verdict = "fail"
            reason = f"below the hard floor {floor:.2f}"
        elif ref_value is not None and value < ref_value * (1 - cfg.tolerance):
            verdict, reason = (
                "warn",
                f"above the floor but dropped more than {cfg.tolerance:.0%} vs the baseline",
            )
        else:
            verdict, reason = "pass", "above the floor"
        checks.append(Check(bench, metric, "floor", verdict, reason, ref_value, value, None, floor))
    return checks


def _fmt(value: float | str | None) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value).replace("|", "\\|")


_ICON = {"pass": "PASS", "warn": "WARN", "fail": "**FAIL**"}


def render_gate_markdown(result: GateResult, title: str) -> str:
    """The diff table: one row per comparison, the verdict and why."""
    lines = [
        f"## {title}: {result.verdict.upper()}",
        "",
        f"{len(result.failures())} failed, {len(result.warnings())} warned, {len(result.checks)} checks.",
        "",
        "| benchmark | metric | vs | reference | current | Δ | upper bound | threshold | verdict | why |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for c in result.checks:
        delta = (
            f"{c.current - c.reference_value:+.4f}"
            if isinstance(c.current, float) and isinstance(c.reference_value, float)
            else "–"
        )
        lines.append(
            f"| {c.benchmark} | {c.metric} | {c.reference} | {_fmt(c.reference_value)} | {_fmt(c.current)} | "
            f"{delta} | {_fmt(c.bound)} | {_fmt(c.threshold)} | {_ICON[c.verdict]} | {c.reason} |"
        )
    return "\n".join(lines) + "\n"


def load_last_green(path: Path | str) -> dict[str, Any] | None:
    """The last green nightly's checkpoint entry, or None before the first green run."""
    path = Path(path)
    if not path.exists():
        return None
    state = read_json(path)
    if not isinstance(state, dict) or "checkpoint" not in state:
        raise ValueError(f"nightly state file {path} is malformed (no 'checkpoint' entry)")
    return state["checkpoint"]


def save_last_green(
    path: Path | str, current: Mapping[str, Any], settings: Mapping[str, Any], verdict: Verdict
) -> None:
    """Record a non-failing nightly as the new drift reference (atomic write)."""
    if verdict == "fail":
        raise ValueError("a failed nightly must not become the last green reference")
    write_json(
        Path(path),
        {
            "checkpoint": dict(current),
            "settings": dict(settings),
            "verdict": verdict,
            "saved_at": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        },
    )
