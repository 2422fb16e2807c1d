"""`npr eval`: one checkpoint, chosen benchmarks, the same code path as the `evaluate` stage."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.artifacts import write_json
from components.dag import stage_io
from components.data.benchmarks import BENCHMARK_NAMES, FieldMap, is_benchmark_file, load_benchmark_file
from components.errors import UserError
from components.evaluation.config import BenchmarkSpec, EvaluateConfig
from components.evaluation.job import EvalJob, EvalJobConfig, EvalOutputs, eval_job
from components.evaluation.outputs import evaluate_into
from components.evaluation.runner import (
    CheckpointSpec,
    EvalResult,
    checkpoint_spec,
    needs_problems_dir,
)

MODES = ("parallel", "sequential")


class EvalInputError(UserError, ValueError):
    """A bad `npr eval` argument: an unknown benchmark, a mode, two benchmarks of one name."""


def checkpoint_name(checkpoint: Path) -> str:
    """``artifacts/papo_rl/model`` -> ``papo_rl``; any other directory -> its own name."""
    checkpoint = Path(checkpoint)
    return (
        checkpoint.parent.name if checkpoint.name == "model" and checkpoint.parent.name else checkpoint.name
    )


def benchmark_specs(
    section: EvaluateConfig, names: list[str], k: int | None, files: frozenset[str] = frozenset()
) -> list[BenchmarkSpec]:
    """Specs of the named benchmarks: the profile's settings where it has them (never for a user's file,
    named in ``files``: one sample per problem unless ``k``); ``k`` overrides n and k."""
    if not names:
        raise EvalInputError("--benchmarks: name at least one benchmark or benchmark file")
    configured = {b.name: b for b in section.benchmarks}
    specs = []
    for name in names:
        if name not in files and name not in configured and name not in BENCHMARK_NAMES:
            raise EvalInputError(
                f"--benchmarks: unknown benchmark {name!r}; known: {', '.join(BENCHMARK_NAMES)} "
                "(or give a .jsonl file)"
            )
        spec = BenchmarkSpec(name=name) if name in files else configured.get(name, BenchmarkSpec(name=name))
        if k is not None:
            spec = spec.model_copy(update={"n_samples": k, "k": k})
        specs.append(spec)
    return specs


def evaluate_checkpoint(
    cfg: EvalJobConfig,
    checkpoint: Path,
    benchmarks: list[str],
    k: int | None,
    mode: str,
    out_dir: Path,
    fields: FieldMap = FieldMap(),
) -> dict[str, Any]:
    """Evaluate one model directory; writes records/, report/, plots/ and metrics.json under ``out_dir``.

    A ``benchmarks`` entry that is a file (``is_benchmark_file``) is a user's benchmark, read with
    ``fields`` (``components.data.benchmarks.load_benchmark_file``) and named by its stem. Returns the
    metrics dict (the same shape the stage returns, with one checkpoint). ``cfg`` is read once, into the
    evaluation's job (``eval_job``) for this one checkpoint.
    """
    if mode not in MODES:
        raise EvalInputError(f"--mode must be one of {MODES}, got {mode!r}")
    checkpoint = Path(checkpoint)
    if not checkpoint.is_dir():
        raise FileNotFoundError(f"checkpoint directory {checkpoint} does not exist")
    # a user's files are read (and refused when bad) before any model is loaded
    preloaded: dict[str, list[dict[str, Any]]] = {}
    names = []
    for entry in benchmarks:
        if not is_benchmark_file(entry):
            names.append(entry)
            continue
        records = load_benchmark_file(entry, fields)
        name = records[0]["benchmark"]
        if name in preloaded or name in benchmarks:
            raise EvalInputError(f"--benchmarks: two benchmarks named {name!r} ({entry})")
        preloaded[name] = records
        names.append(name)
    ckpt_name = checkpoint_name(checkpoint)
    job = eval_job(cfg, [ckpt_name])
    specs = benchmark_specs(job.section, names, k, frozenset(preloaded))
    spec = checkpoint_spec(job, ckpt_name, checkpoint, mode)  # type: ignore[arg-type]
    result, out = evaluate_into_folder(
        job, [spec], specs, Path(out_dir), f"Ad-hoc evaluation of `{checkpoint}`", preloaded=preloaded
    )
    return {**result.metrics, "report": str(out.report)}


def evaluate_into_folder(
    job: EvalJob,
    checkpoints: list[CheckpointSpec],
    benchmarks: list[BenchmarkSpec],
    out_dir: Path,
    title: str,
    *,
    preloaded: dict[str, list[dict[str, Any]]] | None = None,
    n_shards: int | None = None,
) -> tuple[EvalResult, EvalOutputs]:
    """``outputs.evaluate_into`` a folder: records/, report/, plots/ and metrics.json under ``out_dir`` (what
    ``npr eval`` and the nightly do; the stage writes into its DVC outputs). ``preloaded``: benchmarks already
    read (a user's files), the others are read from the run's ``sample_orz/problems`` when they need it."""
    preloaded = preloaded or {}
    problems_dir = None
    if needs_problems_dir([s for s in benchmarks if s.name not in preloaded]):
        problems_dir = stage_io("evaluate").input("sample_orz/problems")
    out = EvalOutputs(out_dir / "records", out_dir / "report", out_dir / "plots")
    result = evaluate_into(
        job, checkpoints, benchmarks, out, title,
        problems_dir=problems_dir, preloaded=preloaded, n_shards=n_shards,
    )  # fmt: skip
    write_json(out_dir / "metrics.json", result.metrics)
    return result, out
