"""Writing an evaluation to disk: records, the report directory (markdown + PNGs) and the plot data.

``evaluate_into`` is the one "evaluate, then write the outputs" of the ``evaluate`` stage (into its DVC
outputs), ``npr eval`` and the nightly flow (into a folder: ``components.evaluation.adhoc.evaluate_into_folder``).
Each output directory is replaced atomically, so a crash never leaves a half-written report or record set.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from components.artifacts import atomic_dir
from components.evaluation.config import BenchmarkSpec
from components.evaluation.job import REPORT_FILE, EvalJob, EvalOutputs
from components.evaluation.plots import render_pngs, write_plot_data
from components.evaluation.report import render_report
from components.evaluation.runner import CheckpointSpec, EvalResult, evaluate_checkpoints, write_records

__all__ = ["REPORT_FILE", "EvalOutputs", "evaluate_into", "write_evaluation"]


def write_evaluation(result: EvalResult, out: EvalOutputs, title: str, n_shards: int) -> str:
    """Write records, report (with its PNG plots) and plot data; returns the report's markdown.

    The PNGs end up in ``out.report_dir`` under the names ``plots.ACCURACY_PNG`` and ``plots.SPEEDUP_PNG``.
    """
    with atomic_dir(out.records_dir) as tmp:
        write_records(result, tmp, n_shards)
    with atomic_dir(out.report_dir) as tmp:
        images = render_pngs(result.metrics, tmp)
        markdown = render_report(result.metrics, title, [p.name for p in images.values()])
        (tmp / REPORT_FILE).write_text(markdown, encoding="utf-8")
    write_plot_data(result.metrics, out.plots_dir)
    return markdown


def evaluate_into(
    job: EvalJob,
    checkpoints: Sequence[CheckpointSpec],
    benchmarks: Sequence[BenchmarkSpec],
    out: EvalOutputs,
    title: str,
    *,
    problems_dir: Path | None,
    work_dir: Path | None = None,
    preloaded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    n_shards: int | None = None,
    annotate: Callable[[EvalResult], None] | None = None,
) -> EvalResult:
    """Evaluate ``checkpoints`` on ``benchmarks`` (``runner.evaluate_checkpoints``) and write records, report
    and plot data into ``out``. ``annotate`` adds to the result's metrics before the report is written (the
    stage's recipe table and scale note); ``n_shards``: record shards per checkpoint and benchmark (default
    ``evaluate.records_shards``); the other arguments are ``evaluate_checkpoints``'."""
    result = evaluate_checkpoints(job, checkpoints, benchmarks, problems_dir, work_dir, preloaded=preloaded)
    if annotate is not None:
        annotate(result)
    write_evaluation(result, out, title, n_shards or job.section.records_shards)
    return result
