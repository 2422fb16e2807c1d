"""Writing an evaluation to disk: records, the report directory (markdown + PNGs) and the plot data.

Each output directory is replaced atomically, so a crash never leaves a half-written report or record set.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from components.artifacts import atomic_dir
from components.evaluation.plots import render_pngs, write_plot_data
from components.evaluation.report import render_report
from components.evaluation.runner import EvalResult, write_records

REPORT_FILE = "report.md"


@dataclass(frozen=True)
class EvalOutputs:
    records_dir: Path
    report_dir: Path
    plots_dir: Path

    @property
    def report(self) -> Path:
        return self.report_dir / REPORT_FILE


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
