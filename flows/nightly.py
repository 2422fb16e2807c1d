"""The nightly regression evaluation: the promoted checkpoint vs its baseline and the last green run.

A baseline belongs to one checkpoint and one set of evaluation settings (``components.evaluation.gate``).
``promote`` (``npr nightly promote CHECKPOINT``) evaluates a checkpoint once and writes its baseline into the
user's workspace (``nightly.baseline_dir``, tracked with DVC); when a baseline of another checkpoint with
the same settings is there, the candidate is first gated against it with the noise-aware rule and a
regression refuses the promotion (``--force`` promotes anyway). The nightly (``nightly_eval``: deployed as
``nightly-eval`` with cron ``nightly.cron``; by hand ``npr nightly run``) re-evaluates the promoted
checkpoint with the same runner as the `evaluate` stage, gates it (catching what grading, engine, data or
environment changes did to the same checkpoint), writes the diff table, publishes it (Prefect artifact,
W&B), alerts on a regression (``components.evaluation.alerts``: an alert file, a webhook) and records a
non-failing run as the new last green. A regression ends the flow in ``Failed``; a baseline of another
checkpoint or of other settings is refused before anything is evaluated (``GateRefused``, which says what
to run), never reported as a regression.

The steps are Prefect tasks when the flow runs under Prefect and plain calls under ``nightly_eval.fn`` (unit
tests: no API server needed), see ``_step``.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.states import Failed

from components import storage
from components.artifacts import write_json
from components.config import PipelineConfig, load_config
from components.dag import stage_io
from components.errors import UserError
from components.evaluation.adhoc import checkpoint_name, evaluate_into_folder
from components.evaluation.alerts import deliver_alert
from components.evaluation.config import BenchmarkSpec
from components.evaluation.gate import (
    GateRefused,
    GateResult,
    baseline_path,
    check_comparable,
    gate_checkpoint,
    load_baseline,
    load_last_green,
    refusal_reasons,
    render_gate_markdown,
    save_last_green,
    write_baseline,
)
from components.evaluation.job import eval_job
from components.evaluation.report import flat_metrics, in_prefect_run, publish_prefect
from components.evaluation.runner import (
    CheckpointSpec,
    EvalResult,
    checkpoint_hash,
    checkpoint_spec,
    grader_version,
    sampling_settings,
)
from components.prompts import prompt_fingerprint
from components.tracking import resolve_mode, stage_run

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
    # the nightly's one checkpoint, decoded as the evaluate stage would decode it
    return checkpoint_spec(eval_job(cfg, [name]), name, path)


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


def planned_evaluation(cfg: PipelineConfig, ckpt: CheckpointSpec, digest: str) -> tuple[dict, dict]:
    """What an evaluation of ``ckpt`` will be compared on, known before it runs: the ``checkpoints`` entry
    (mode, prompt style, hash, samples and k per benchmark) and the settings, as the runner records them."""
    current = {
        "mode": ckpt.mode,
        "prompt_style": ckpt.prompt_style,
        "checkpoint_hash": digest,
        "path": str(ckpt.path),
        "benchmarks": {b.name: {"n_samples": b.n_samples, "k": b.k} for b in nightly_benchmarks(cfg)},
    }
    settings = {
        "sampling": sampling_settings(cfg.evaluate, cfg.merge_semantics),
        "prompt_hash": prompt_fingerprint(cfg.prompts)["prompt_hash"],
        "grader_version": grader_version(cfg.grading),
    }
    return current, settings


@task(name="evaluate-checkpoint")
def evaluate_promoted(cfg: PipelineConfig, checkpoint: CheckpointSpec, out_dir: Path) -> EvalResult:
    """Evaluate the checkpoint (same runner as the stage) and write records, report and plot data."""
    title = f"Nightly evaluation of `{checkpoint.name}` ({cfg.profile})"
    job = eval_job(cfg, [checkpoint.name])  # the config read once, for the checkpoint it evaluates
    result, _ = evaluate_into_folder(job, [checkpoint], nightly_benchmarks(cfg), out_dir, title, n_shards=1)
    return result


@task(name="gate")
def gate_against_references(
    cfg: PipelineConfig, result: EvalResult, checkpoint: str, baseline_file: Path
) -> GateResult:
    """Compare with the promoted baseline and the last green nightly."""
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
    import wandb  # lazy: wandb

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


def preflight(
    profile: str, checkpoint: str | None, baseline: str | None
) -> tuple[PipelineConfig, CheckpointSpec, Path]:
    """Everything the nightly checks before it evaluates: the config, the checkpoint, its baseline (missing
    or malformed: a user error) and that the two are comparable (``GateRefused`` otherwise). `npr nightly
    run` calls it before it starts the flow, so a user error is one line, not a flow run's traceback."""
    cfg = load_config(profile=profile)
    ckpt = resolve_checkpoint(cfg, checkpoint)
    baseline_file = resolve_baseline(cfg, ckpt.name, baseline)
    promoted = load_baseline(baseline_file)
    check_comparable(*planned_evaluation(cfg, ckpt, checkpoint_hash(ckpt.path)), promoted)
    return cfg, ckpt, baseline_file


@flow(name="nightly-eval", log_prints=True)
def nightly_eval(profile: str = "tiny", checkpoint: str | None = None, baseline: str | None = None) -> Any:
    """Evaluate the promoted checkpoint and gate it; a regression ends the run in Failed (and alerts), a
    baseline of another checkpoint or other settings is refused (GateRefused) before evaluating."""
    cfg, ckpt, baseline_file = preflight(profile, checkpoint, baseline)
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
        title = f"nightly-eval {cfg.profile}/{ckpt.name}: FAIL (regression vs {baseline_file})"
        summary.update(deliver_alert(cfg.nightly, title, summary))
        return Failed(message=f"regression: {'; '.join(summary['failures'])}", data=summary)
    save_last_green(
        cfg.nightly.state_file,
        result.metrics["checkpoints"][ckpt.name],
        result.metrics["settings"],
        gate.verdict,
    )
    return summary


# ----------------------------------------------------------------------------------------------------
# promotion


class PromotionRefused(UserError, RuntimeError):
    """The candidate fails the gate against the promoted baseline (or a hard floor); ``--force`` overrides."""


def track_with_dvc(path: Path) -> str:
    """`dvc add` the baseline file (the user commits the ``.dvc`` file; `dvc push` sends the content)."""
    if not Path(".dvc").is_dir():
        return "not tracked (no .dvc directory here)"
    storage.dvc_add(path)
    return f"tracked by {path}.dvc (commit it; `dvc push` sends the baseline to the remote)"


def promote(profile: str, checkpoint: str, force: bool = False, command: str | None = None) -> dict[str, Any]:
    """Evaluate ``checkpoint`` once and make it the nightly's baseline (``<baseline_dir>/<tag>.yaml``).

    A baseline already there for another checkpoint with the same settings: the candidate is gated against
    it (noise-aware rule, floors); a ``fail`` refuses the promotion unless ``force``. A candidate below a
    hard floor is refused too (every night would fail). The last-green state is reset (it was another
    checkpoint's). Returns what was done; raises PromotionRefused.
    """
    cfg = load_config(profile=profile)
    ckpt = resolve_checkpoint(cfg, checkpoint)
    target = baseline_path(cfg.nightly, cfg.profile, ckpt.name)
    result = evaluate_promoted.fn(cfg, ckpt, Path(cfg.nightly.report_dir) / "promote")
    current = result.metrics["checkpoints"][ckpt.name]
    settings = result.metrics["settings"]
    records = result.records.get(ckpt.name)
    seed = cfg.evaluate.generation.seed
    outcome: dict[str, Any] = {"checkpoint": str(ckpt.path), "baseline": str(target), "compared_with": None}
    if target.exists():
        previous = load_baseline(target)
        reasons = refusal_reasons(current, settings, previous, same_checkpoint=False)
        if reasons:
            outcome["compared_with"] = (
                f"not compared: the previous baseline had other settings ({'; '.join(reasons)})"
            )
        else:
            gate = gate_checkpoint(
                current, settings, previous, cfg.nightly, records, seed=seed, candidate=True
            )
            outcome["compared_with"] = f"{previous.checkpoint_hash}: {gate.verdict}"
            outcome["candidate_failures"] = [f"{c.benchmark}/{c.metric}: {c.reason}" for c in gate.failures()]
            if gate.verdict == "fail" and not force:
                title = f"nightly promote {cfg.profile}/{ckpt.name}: FAIL (candidate regresses vs {target})"
                alert = deliver_alert(
                    cfg.nightly,
                    title,
                    {"verdict": "fail", "checkpoint": str(ckpt.path), "baseline": str(target),
                     "failures": outcome["candidate_failures"]},
                )  # fmt: skip
                raise PromotionRefused(
                    f"not promoted: {ckpt.path} regresses against the promoted baseline {target} "
                    f"({'; '.join(outcome['candidate_failures'])}); alert written to {alert['alert_file']} "
                    f"(webhook: {alert['webhook']}); `npr nightly promote {checkpoint} --force` promotes it anyway"
                )
    with tempfile.TemporaryDirectory() as tmp:
        staged = Path(tmp) / target.name
        new = write_baseline(result.metrics, cfg, staged, checkpoint=ckpt.name, command=command)
        floors = [
            c for c in gate_checkpoint(current, settings, new, cfg.nightly, records, seed=seed).failures()
        ]
        if floors and not force:
            raise PromotionRefused(
                f"not promoted: {ckpt.path} is below the nightly's hard floors "
                f"({'; '.join(f'{c.benchmark}/{c.metric} {c.current:.4f}: {c.reason}' for c in floors)}), so "
                f"every night would fail; `npr nightly promote {checkpoint} --force` promotes it anyway"
            )
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.move(str(staged), target)
    Path(cfg.nightly.state_file).unlink(missing_ok=True)  # the drift reference was another checkpoint's
    outcome.update(
        checkpoint_hash=new.checkpoint_hash,
        benchmarks={b: dict(m.metrics) for b, m in new.benchmarks.items()},
        dvc=track_with_dvc(target),
    )
    return outcome


__all__ = ["GateRefused", "PromotionRefused", "nightly_eval", "promote"]
