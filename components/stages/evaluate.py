"""Stage `evaluate`: every checkpoint of the run on every benchmark -> records, report, metrics, plots.

Parallel checkpoints (``evaluate.parallel_checkpoints``; Parallel-R1's per ``parallel_r1.attention``) decode
in the engine's parallel mode, the others sequentially; each checkpoint is prompted, decoded and judged with
its own schema and instruction (``PipelineConfig.schema_of`` / ``prompt_style_of``); the held-out benchmark
is the test split of ``sample_orz/problems``. The returned dict is what ``artifacts/evaluate/metrics.json``
holds; the stage runner writes one flat row per checkpoint into ``metrics/evaluate/`` (``dvc metrics show``);
the plot rows go to ``plots/evaluate/`` (``dvc plots show``).
"""

from __future__ import annotations

import logging
from typing import Any

from components.config import PipelineConfig
from components.dag import StageIO
from components.evaluation.job import EvalOutputs, EvalPaths, eval_job
from components.evaluation.outputs import evaluate_into
from components.evaluation.plots import ACCURACY_PNG, SPEEDUP_PNG
from components.evaluation.recipe import Recipe, recipe_summary
from components.evaluation.report import publish_wandb, read_scale_note
from components.evaluation.runner import EvalResult, checkpoint_spec
from components.evaluation.spread import committed_spread, read_committed_spread, spread_path
from components.training.precision import run_precision

log = logging.getLogger(__name__)

# The stage writes its own plot rows (per-checkpoint bars) into plots/evaluate (dvc.yaml), so the stage
# runner does not write training curves there.
WRITES_PLOTS = True


def stage_outputs(io: StageIO) -> EvalOutputs:
    """The stage's records, report and plots directories (dvc.yaml's outs and plots)."""
    return EvalPaths.of(io, []).outputs


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    # the evaluate section, the shared settings it reads and each checkpoint's decoding, resolved once; its
    # paths are resolved after the seed spread is read (below)
    job = eval_job(cfg)
    ecfg = job.section
    # The compute precision the run's training resolved to (run.autocast; the pipeline's stages run on one
    # machine, and each stage's record keeps its own in provenance.precision): the report says it, and the
    # committed seed spread compared with is the one of that precision.
    precision = run_precision(job.run).as_dict(job.run.dtype)
    # the committed seed spread (evaluate.seed_spread; its directory a dep in dvc.yaml), read first: a
    # malformed file fails the stage before the decode, not after it
    spread_file = spread_path(ecfg.seed_spread, precision["compute_dtype"])
    seed_spread = read_committed_spread(spread_file)
    scale_note = read_scale_note(ecfg.scale_note)
    paths = EvalPaths.of(io, list(job.decoding))  # each checkpoint's <stage>/model, the outs, the work dir
    checkpoints = [checkpoint_spec(job, name, path) for name, path in paths.models.items()]
    out = paths.outputs

    def annotate(result: EvalResult) -> None:
        bench = ecfg.recipe_benchmark_name()
        if bench is not None:  # the paper's comparison with its uncertainty, in the report and metrics.json
            recipe = recipe_summary(
                result.metrics,
                result.records,
                bench,
                Recipe.of(ecfg),
                ecfg.recipe_confidence,
                ecfg.recipe_resamples,
            )
            if recipe["rows"]:  # the committed seed spread beside it, or the report says there is none
                first = recipe["rows"][0]
                recipe["seed_spread"] = committed_spread(
                    spread_file, seed_spread, bench, first["n_problems"], first["n_samples"],
                    precision["compute_dtype"],
                )  # fmt: skip
            result.metrics["recipe"] = recipe
        result.metrics["settings"]["scale_note"] = scale_note
        result.metrics["settings"]["training_precision"] = precision

    # flows/pipeline.py publishes report.md as a Prefect artifact after the stage; nothing to do here.
    result = evaluate_into(
        job,
        checkpoints,
        ecfg.benchmarks,
        out,
        f"Evaluation of profile `{cfg.profile}`",
        problems_dir=paths.problems,
        # the stage's work dir (artifacts/evaluate/work, stamped by run_stage) keeps finished checkpoints
        work_dir=paths.work_dir,
        annotate=annotate,
    )
    # W&B run id kept in the stage's work dir (artifacts/evaluate/work, not a DVC out) so reruns resume it.
    # publish_wandb opens the stage's run with the whole config (TrackedConfig): what W&B records, not what
    # the evaluation computes, so it keeps cfg.
    images = {"accuracy": out.report_dir / ACCURACY_PNG, "speedup": out.report_dir / SPEEDUP_PNG}
    publish_wandb(cfg, "evaluate", paths.work_dir, result.metrics, images)
    log.info("report: %s", out.report)
    return result.metrics
