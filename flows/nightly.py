"""The nightly regression evaluation: the promoted checkpoint vs its committed baseline and the last green run.

Deployed as ``nightly-eval`` (prefect.yaml, cron ``nightly.cron`` in ``nightly.timezone``). Steps: evaluate
the checkpoint with the same runner as the `evaluate` stage, gate it (``components.evaluation.gate``),
write the diff table, publish it (Prefect artifact, W&B), alert on a regression, and record a non-failing
run as the new last green. A regression ends the flow in ``Failed``.

The steps are Prefect tasks when the flow runs under Prefect and plain calls under ``nightly_eval.fn`` (unit
tests: no API server needed), see ``_step``.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.states import Failed

from components.artifacts import write_json
from components.config import PipelineConfig, load_config
from components.dag import stage_io
from components.evaluation.adhoc import checkpoint_name
from components.evaluation.config import BenchmarkSpec
from components.evaluation.gate import (
    GateResult,
    baseline_path,
    gate_checkpoint,
    load_baseline,
    load_last_green,
    render_gate_markdown,
    save_last_green,
)
from components.evaluation.outputs import EvalOutputs, write_evaluation
from components.evaluation.report import flat_metrics, in_prefect_run, publish_prefect
from components.evaluation.runner import CheckpointSpec, EvalResult, evaluate_checkpoints, needs_problems_dir

log = logging.getLogger(__name__)


def _step(step: Any, *args: Any) -> Any:
    """Run a task as a tracked task inside a flow run, as a plain function otherwise (``.fn`` calls)."""
    return step(*args) if in_prefect_run() else step.fn(*args)


def resolve_checkpoint(cfg: PipelineConfig, checkpoint: str | None) -> CheckpointSpec:
    """A model directory, or a stage name (default: ``nightly.checkpoint``) -> ``artifacts/<stage>/model``."""
    target = checkpoint or cfg.nightly.checkpoint
    if Path(target).is_dir():
        path = Path(target)
        name = checkpoint_name(path)
    else:
        name = target
        path = stage_io("evaluate").input(f"{name}/model")
        if not path.is_dir():
            raise FileNotFoundError(
                f"promoted checkpoint {path} is not in the workspace; pull it first (dvc pull {path})"
            )
    return CheckpointSpec(
        name,
        path,
        cfg.decode_mode_of(name),
        cfg.prompt_style_of(name),
        schema=cfg.schema_of(name),
        engine_settings=cfg.engine_settings_of(name),
    )


def resolve_baseline(cfg: PipelineConfig, checkpoint: str, baseline: str | None) -> Path:
    """A baseline file path, a tag in ``nightly.baseline_dir``, or the default ``<profile>-<checkpoint>``."""
    if baseline is None:
        return baseline_path(cfg.nightly, cfg.profile, checkpoint)
    if baseline.endswith((".yaml", ".yml")):
        return Path(baseline)
    return Path(cfg.nightly.baseline_dir) / f"{baseline}.yaml"


def nightly_benchmarks(cfg: PipelineConfig) -> list[BenchmarkSpec]:
    """``nightly.benchmarks`` (names) picked from ``evaluate.benchmarks``; all of them when unset."""
    configured = {b.name: b for b in cfg.evaluate.benchmarks}
    names = cfg.nightly.benchmarks or list(configured)
    unknown = [n for n in names if n not in configured]
    if unknown:
        raise ValueError(f"nightly.benchmarks {unknown} are not in evaluate.benchmarks {list(configured)}")
    return [configured[n] for n in names]


@task(name="evaluate-checkpoint")
def evaluate_promoted(cfg: PipelineConfig, checkpoint: CheckpointSpec, out_dir: Path) -> EvalResult:
    """Evaluate the checkpoint (same runner as the stage) and write records, report and plot data."""
    specs = nightly_benchmarks(cfg)
    problems_dir = None
    if needs_problems_dir(specs):
        problems_dir = stage_io("evaluate").input("sample_orz/problems")
    result = evaluate_checkpoints(cfg, [checkpoint], specs, problems_dir)
    out = EvalOutputs(out_dir / "records", out_dir / "report", out_dir / "plots")
    write_evaluation(result, out, f"Nightly evaluation of `{checkpoint.name}` ({cfg.profile})", 1)
    write_json(out_dir / "metrics.json", result.metrics)
    return result


@task(name="gate")
def gate_against_references(
    cfg: PipelineConfig, result: EvalResult, checkpoint: str, baseline_file: Path
) -> GateResult:
    """Compare with the pinned baseline and the last green nightly."""
    return gate_checkpoint(
        result.metrics["checkpoints"][checkpoint],
        result.metrics["settings"],
        load_baseline(baseline_file),
        cfg.nightly,
        records=result.records.get(checkpoint),
        last_green=load_last_green(cfg.nightly.state_file),
        seed=cfg.evaluate.generation.seed,
    )


def log_to_wandb(
    cfg: PipelineConfig, result: EvalResult, gate: GateResult, markdown: str, run_dir: Path, title: str
) -> bool:
    """Log the night's metrics and verdict (offline unless a key is set); ``run.alert`` (Slack/email per
    the W&B project's settings) on a FAIL or WARN, only when W&B is online. Returns whether it alerted."""
    import wandb

    from components.tracking import resolve_mode, stage_run

    with stage_run(cfg, "nightly-eval", run_dir) as run:
        run.summary(
            {**flat_metrics(result.metrics), "verdict": gate.verdict, "failed_checks": len(gate.failures())}
        )
        if gate.verdict == "pass" or resolve_mode(cfg.tracking) != "online":
            return False
        level = wandb.AlertLevel.ERROR if gate.verdict == "fail" else wandb.AlertLevel.WARN
        run.run.alert(title=title, text=markdown, level=level)
        return True


@task(name="publish")
def publish_outcome(
    cfg: PipelineConfig, result: EvalResult, gate: GateResult, markdown: str, out_dir: Path, checkpoint: str
) -> dict:
    """Write the diff table and verdict, publish them (Prefect artifact, W&B), alert on a regression or drift."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gate.md").write_text(markdown, encoding="utf-8")
    write_json(out_dir / "gate.json", gate.to_dict())
    published = publish_prefect(
        markdown, key=f"nightly-{cfg.profile}-{checkpoint}", description="Nightly gate"
    )
    title = f"nightly-eval {cfg.profile}/{checkpoint}: {gate.verdict.upper()}"
    alerted = log_to_wandb(cfg, result, gate, markdown, out_dir / "work", title)
    return {"published": published, "alerted": alerted}


@flow(name="nightly-eval", log_prints=True)
def nightly_eval(profile: str = "tiny", checkpoint: str | None = None, baseline: str | None = None) -> Any:
    """Evaluate the promoted checkpoint and gate it; a regression ends the run in Failed."""
    cfg = load_config(profile=profile)
    ckpt = resolve_checkpoint(cfg, checkpoint)
    baseline_file = resolve_baseline(cfg, ckpt.name, baseline)
    load_baseline(baseline_file)  # a missing or malformed baseline fails before the evaluation is spent
    out_dir = Path(cfg.nightly.report_dir)
    result = _step(evaluate_promoted, cfg, ckpt, out_dir)
    gate = _step(gate_against_references, cfg, result, ckpt.name, baseline_file)
    markdown = render_gate_markdown(gate, f"Nightly `{ckpt.name}` ({cfg.profile}) vs `{baseline_file}`")
    publication = _step(publish_outcome, cfg, result, gate, markdown, out_dir, ckpt.name)
    summary = {
        "verdict": gate.verdict,
        "checkpoint": ckpt.name,
        "baseline": str(baseline_file),
        "failures": [f"{c.benchmark}/{c.metric}: {c.reason}" for c in gate.failures()],
        "warnings": [f"{c.benchmark}/{c.metric}: {c.reason}" for c in gate.warnings()],
        "diff_table": str(out_dir / "gate.md"),
        **publication,
    }
    print(markdown)
    if gate.verdict == "fail":
        return Failed(message=f"regression: {'; '.join(summary['failures'])}", data=summary)
    save_last_green(
        cfg.nightly.state_file,
        result.metrics["checkpoints"][ckpt.name],
        result.metrics["settings"],
        gate.verdict,
    )
    return summary
