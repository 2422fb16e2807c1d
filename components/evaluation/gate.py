"""The nightly regression gate: a checkpoint's evaluation against its pinned baseline and the last green run.

Decisions (conventions.md §C2):

- a baseline belongs to one checkpoint (its content hash) and to the evaluation settings its numbers depend
  on: sampling (merge mode included), prompt hash, decode mode, prompt style, grader version, and per
  benchmark the problems/samples/k. Anything else is not like with like: the gate REFUSES (``GateRefused``,
  a user error whose message says what to run: ``npr nightly promote <checkpoint>``); it never reports
  such a comparison as a regression. A candidate checkpoint (``candidate=True``: ``npr nightly promote``
  of a new checkpoint against the old baseline) is the one case a different hash is compared, by design.
- accuracy-like metrics (``NightlyConfig.gate_metrics``) vs the baseline: FAIL only when the one-sided upper
  confidence bound of the current value (Wilson at n = problems x samples, or a bootstrap over problems) is
  below ``baseline * (1 - tolerance)``, i.e. the data say the drop is real; WARN when only the point estimate
  is below that threshold; PASS otherwise.
- the same comparison vs the last green nightly is drift: it can WARN, never FAIL (the baseline decides
  promotion; drift is for people to look at).
- hard floors on format-valid rate and (for parallel checkpoints) parallel rate: below the floor is FAIL.
  These regress before accuracy does. A point drop of either beyond tolerance vs the baseline WARNs.
- an engine change (torch, transformers, this package, the backend) WARNs and the numbers are compared:
  catching what an engine or environment change does to the same checkpoint is what the nightly is for.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal, Protocol

import yaml
from pydantic import ValidationError

from components.artifacts import read_json, write_json
from components.errors import UserError
from components.evaluation.bounds import bootstrap_interval, wilson_interval
from components.evaluation.config import NightlyConfig
from components.evaluation.metrics import per_problem_accuracy, per_problem_pass_at_k
from components.settings import ConfigError, StrictModel, load_yaml_text

Verdict = Literal["pass", "warn", "fail"]


class BaselineError(UserError, ValueError):
    """A baseline file is missing, not YAML, or not a baseline; the message names the file and key."""


class GateRefused(UserError, ValueError):
    """The baseline is of another checkpoint or other settings: no verdict; the message says what to run."""


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
    """``<nightly.baseline_dir>/<tag>.yaml``, written by ``npr nightly promote``: the numbers the promoted
    checkpoint must keep, and what they belong to (the checkpoint's hash and the evaluation settings)."""

    tag: str
    profile: str
    checkpoint: str
    mode: Literal["parallel", "sequential"]
    prompt_style: Literal["parallel", "sequential", "parallel_r1"]
    checkpoint_hash: str
    # where the checkpoint was promoted from (None in baselines written before it was recorded)
    checkpoint_path: str | None = None
    prompt_hash: str
    engine_version: dict[str, str]
    # None in baselines written before the grader was versioned: such a baseline is refused
    grader_version: dict[str, str] | None = None
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
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"baseline {path} does not exist; promote the checkpoint the nightly gates first: "
            "`npr nightly promote <checkpoint>` (e.g. artifacts/papo_rl/model)"
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


class RunProfile(Protocol):
    """What a baseline records of the run's config (components.config.PipelineConfig, a floor above this
    package): the profile and the nightly section."""

    @property
    def profile(self) -> str: ...

    @property
    def nightly(self) -> NightlyConfig: ...


def write_baseline(
    eval_metrics: Mapping[str, Any],
    cfg: RunProfile,
    path: Path | str,
    checkpoint: str | None = None,
    command: str | None = None,
    benchmarks: Sequence[str] | None = None,
) -> Baseline:
    """Write the baseline file of one checkpoint from an evaluation's metrics (the stage's or `npr eval`'s).

    ``cfg`` is the PipelineConfig of the run; ``checkpoint`` defaults to ``cfg.nightly.checkpoint``;
    ``benchmarks`` to the ones the nightly runs (``cfg.nightly.benchmarks``, else all of the evaluation's),
    since the gate fails on a baseline benchmark the night did not evaluate.
    The header comment records how the numbers were produced and how to replace them (a promotion).
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
        checkpoint_path=str(ckpt["path"]) if ckpt.get("path") else None,
        prompt_hash=settings["prompt_hash"],
        engine_version={k: str(v) for k, v in settings["engine_version"].items()},
        grader_version=dict(settings["grader_version"]) if settings.get("grader_version") else None,
        sampling=dict(settings["sampling"]),
        created_at=dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        benchmarks=baseline_benchmarks,
    )
    header = (
        f"# Baseline of checkpoint '{name}' (profile '{cfg.profile}') for the nightly regression gate.\n"
        f"# Produced by: {command or 'components.evaluation.gate.write_baseline'}\n"
        "# It belongs to this checkpoint (checkpoint_hash) and these settings; to gate another checkpoint\n"
        "# or other settings, promote it: npr nightly promote <checkpoint>.\n"
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


SHAPE_KEYS = ("n_problems", "n_samples", "k")


def refusal_reasons(
    current: Mapping[str, Any],
    settings: Mapping[str, Any],
    baseline: Baseline,
    same_checkpoint: bool = True,
) -> list[str]:
    """Why ``current`` (a ``checkpoints`` entry, or the part of one known before evaluating: mode,
    prompt_style, checkpoint_hash, path, benchmarks' n_samples/k) is not comparable with ``baseline``;
    empty when it is. ``same_checkpoint``: the hash must be the baseline's (the nightly); False for a
    candidate being promoted against the old baseline."""
    reasons = []
    if same_checkpoint and current["checkpoint_hash"] != baseline.checkpoint_hash:
        origin = f" (promoted from {baseline.checkpoint_path})" if baseline.checkpoint_path else ""
        reasons.append(
            f"it is the baseline of checkpoint {baseline.checkpoint_hash}{origin}, and "
            f"{current.get('path', 'this checkpoint')} is {current['checkpoint_hash']}"
        )
    pinned = {
        "mode": (baseline.mode, current["mode"]),
        "prompt_style": (baseline.prompt_style, current["prompt_style"]),
        "prompt_hash": (baseline.prompt_hash, settings["prompt_hash"]),
        "grader_version": (baseline.grader_version, settings.get("grader_version")),
    }
    for key, (ref, cur) in pinned.items():
        if ref != cur:
            reasons.append(f"{key} {_plain(ref)} in the baseline, {_plain(cur)} now")
    sampling = dict(settings["sampling"])
    for key in sorted(set(baseline.sampling) | set(sampling)):
        if baseline.sampling.get(key, "unset") != sampling.get(key, "unset"):
            reasons.append(
                f"sampling.{key} {baseline.sampling.get(key, 'unset')} in the baseline, "
                f"{sampling.get(key, 'unset')} now"
            )
    benches = current["benchmarks"]
    for bench, ref in baseline.benchmarks.items():
        if bench not in benches:
            reasons.append(f"benchmark {bench} is in the baseline and not in this evaluation")
            continue
        for key in SHAPE_KEYS:
            if key in benches[bench] and int(benches[bench][key]) != getattr(ref, key):
                reasons.append(
                    f"{bench}.{key} {getattr(ref, key)} in the baseline, {benches[bench][key]} now"
                )
    return reasons


def _plain(value: Any) -> str:
    if value is None:
        return "none recorded"
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{k}: {v}" for k, v in value.items()) + "}"
    return str(value)


def refusal_message(baseline: Baseline, reasons: Sequence[str], checkpoint_path: str | None) -> str:
    """One line: which baseline, why it is not comparable, and what to run."""
    target = checkpoint_path or baseline.checkpoint_path or "<checkpoint>"
    return (
        f"nightly gate refused: baseline '{baseline.tag}' is not comparable with this evaluation "
        f"({'; '.join(reasons)}); this is not a regression. To gate this checkpoint with these settings, "
        f"promote it: `npr nightly promote {target}`"
    )


def check_comparable(
    current: Mapping[str, Any], settings: Mapping[str, Any], baseline: Baseline, same_checkpoint: bool = True
) -> None:
    """Raise ``GateRefused`` (what to run) unless ``current`` is comparable with ``baseline``."""
    reasons = refusal_reasons(current, settings, baseline, same_checkpoint)
    if reasons:
        raise GateRefused(refusal_message(baseline, reasons, current.get("path")))


def _settings_checks(
    current: Mapping[str, Any], settings: Mapping[str, Any], baseline: Baseline
) -> list[Check]:
    """What is reported beside a comparable evaluation: an engine change (WARN), a candidate's hash."""
    checks = []
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
                "a candidate checkpoint against the promoted one's baseline",
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
    candidate: bool = False,
) -> GateResult:
    """Gate one checkpoint's evaluation; ``GateRefused`` when it is not comparable with the baseline.

    ``current`` is one entry of an evaluation's ``checkpoints`` (mode, checkpoint_hash, benchmarks);
    ``settings`` the evaluation's ``settings``; ``records`` the per-sample records by benchmark (needed by
    the bootstrap method); ``last_green`` the ``checkpoints`` entry of the last green nightly, if any;
    ``candidate``: a new checkpoint judged against the promoted one's baseline (its hash may differ).
    """
    check_comparable(current, settings, baseline, same_checkpoint=not candidate)
    result = GateResult(_settings_checks(current, settings, baseline))
    benches = current["benchmarks"]
    for bench, ref in baseline.benchmarks.items():
        m = benches[bench]
        shape = {key: getattr(ref, key) for key in SHAPE_KEYS}
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
