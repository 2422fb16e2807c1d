"""The evaluation runner: checkpoints x benchmarks -> per-sample records and metrics, and the files they go to.

Shared by the `evaluate` stage, `npr eval` (``adhoc``) and the nightly flow, so every number comes from the
same code. For each checkpoint and benchmark: render each problem's prompt, decode ``n_samples`` samples per
problem with the engine (parallel mode for parallel checkpoints), grade them, measure their structure on the
token ids (``components.structure.trace_metrics``), and time the decode. Benchmarks small enough to share one
engine batch are decoded in one call (``decode_groups``). For a parallel checkpoint the speedup decode
(``measure_speedup``) decodes the same prompts in both modes at the configured batch size. Smoke benchmarks
(``BenchmarkSpec.smoke``) are measured and reported but kept out of every average and of the speedup.

With ``evaluate.generation.backend: sglang`` (the GPU profile) every checkpoint is decoded by a fresh SGLang
server for that checkpoint (``components.engine.serving.serving``, stopped afterwards), parallel ones
through the SGLang backend's fork/merge, so tokens/s and the speedup are the served engine's; before any
server starts, every prompt of every checkpoint is checked to fit the server's context length with
``max_new_tokens``. Given a ``work_dir`` (the stage's), each finished checkpoint is kept there and a
rerun after a failure (a server error, a crash) evaluates only the checkpoints not finished yet.
"""

from __future__ import annotations

import gc
import hashlib
import json
import logging
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from components.artifacts import read_jsonl, write_jsonl, write_shards
from components.data.benchmarks import SPLIT_BENCHMARKS, load_benchmark
from components.engine import Generation, GenerationConfig, generate
from components.engine.generation import exact_semantics
from components.engine.serving import check_context_length, context_length_for, server_label, serving
from components.evaluation.config import BenchmarkSpec, EvaluateConfig
from components.evaluation.job import EvalJob, Mode
from components.evaluation.metrics import (
    achieved_speedup,
    ideal_speedup,
    summarize_records,
    tokens_per_second,
)
from components.grading.config import GradingConfig
from components.grading.judge import judge_many
from components.progress import Task, track
from components.prompts import prompt_fingerprint, render_prompt
from components.structure import TagIds, TagTokenError, parse_ids, parse_text, trace_metrics

log = logging.getLogger(__name__)

# GenerationConfig fields that do not change what is sampled (or, for the backend, are recorded as engine
# version instead), so they are left out of the settings a baseline pins. merge_mode is pinned: a
# re-prefilled merge samples from another context than the exact one.
DEPLOYMENT_SETTINGS = (
    "mode",
    "batch_size",
    "backend",
    "server",
    "server_spec",
    "vllm_server_spec",
    "server_args",
    "server_url",
    "request_timeout_s",
    "server_start_timeout_s",
)


@dataclass(frozen=True)
class CheckpointSpec:
    """A checkpoint to evaluate: its name in reports, its model directory, and how it is decoded.

    ``schema``: the structure schema its traces are judged and decoded by (None = the pipeline's
    ``schema_name``; Parallel-R1's checkpoints: ``parallel_r1``); ``engine_settings``: extra
    ``GenerationConfig`` fields of its decoding (Parallel-R1's paths per block), recorded in the metrics.
    """

    name: str
    path: Path
    mode: Mode
    prompt_style: str = "parallel"
    schema: str | None = None
    engine_settings: Mapping[str, Any] = field(default_factory=dict)


def checkpoint_spec(job: EvalJob, name: str, path: Path, mode: Mode | None = None) -> CheckpointSpec:
    """How the evaluation decodes checkpoint ``name`` from ``path``: its mode (``mode`` overrides it, as
    ``npr eval --mode`` does), instruction, schema and engine settings, as the job resolved them from the
    config. The one builder the evaluate stage, ``npr eval`` and the nightly share."""
    how = job.decode_of(name)
    return CheckpointSpec(
        name,
        Path(path),
        mode or how.mode,
        how.prompt_style,
        schema=how.schema,
        engine_settings=how.engine_settings,
    )


@dataclass
class EvalResult:
    """Everything one evaluation produced: the metrics dict and the per-sample records."""

    metrics: dict[str, Any]
    # records[checkpoint][benchmark] in the checkpoint's own mode; speedup re-decodes under "sequential".
    records: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)
    sequential_records: dict[str, dict[str, list[dict[str, Any]]]] = field(default_factory=dict)


def generation_config(
    ecfg: EvaluateConfig, mode: Mode, engine_settings: Mapping[str, Any] | None = None
) -> GenerationConfig:
    """The engine's GenerationConfig from the evaluate section's sampling settings, a mode and a
    checkpoint's extra engine settings (validated as GenerationConfig fields)."""
    if not engine_settings:
        return ecfg.generation.model_copy(update={"mode": mode})

    return GenerationConfig.model_validate({**ecfg.generation.model_dump(), **engine_settings, "mode": mode})


def sampling_settings(ecfg: EvaluateConfig, merge_semantics: str) -> dict[str, Any]:
    """The settings the numbers depend on (pinned in baseline files): the engine's sampling, and the merge
    semantics the checkpoints were trained in (the pipeline's ``merge_semantics``) beside the
    ``merge_mode`` they are decoded with, so an evaluation never mixes semantics with its baseline."""
    keys = [k for k in GenerationConfig.model_fields if k not in DEPLOYMENT_SETTINGS]
    return {**{k: getattr(ecfg.generation, k) for k in keys}, "merge_semantics": merge_semantics}


def merge_settings(merge_semantics: str, merge_mode: str) -> dict[str, Any]:
    """The merge of an evaluation: the trained semantics, the decode's mode, and whether that decode samples
    the trained semantics exactly (``components.engine.generation.exact_semantics``)."""
    return {
        "semantics": merge_semantics,
        "mode": merge_mode,
        "exact": exact_semantics(merge_mode) == merge_semantics,
    }


def engine_version(ecfg: EvaluateConfig) -> dict[str, str]:
    """Versions of what decodes: this package, torch, transformers, and the backend name."""
    out = {"backend": ecfg.generation.backend}
    for dist in ("npr-pipeline", "torch", "transformers"):
        try:
            out[dist] = version(dist)
        except PackageNotFoundError:
            out[dist] = "not installed"
    return out


def grader_version(grading: GradingConfig) -> dict[str, str]:
    """What grades an evaluation: the math-verify release and a fingerprint of the evaluation's grading
    settings (answer extraction, numeric tolerance, timeout). Pinned in a baseline, like the sampling."""
    try:
        verifier = version("math-verify")
    except PackageNotFoundError:
        verifier = "not installed"
    settings = {
        "extraction": grading.extraction.for_purpose("evaluation").model_dump(mode="json"),
        "float_rel_tol": grading.float_rel_tol,
        "timeout_s": grading.timeout_s,
    }
    digest = hashlib.sha256(json.dumps(settings, sort_keys=True).encode()).hexdigest()[:16]
    return {"math-verify": verifier, "settings": digest}


def checkpoint_hash(model_dir: Path | str) -> str:
    """sha256 over the relative names and bytes of every file in a model directory (sorted)."""
    model_dir = Path(model_dir)
    if not model_dir.is_dir():
        raise FileNotFoundError(f"checkpoint directory {model_dir} does not exist")
    digest = hashlib.sha256()
    for path in sorted(p for p in model_dir.rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(model_dir)).encode() + b"\0")
        with path.open("rb") as f:
            for chunk in iter(lambda f=f: f.read(1 << 20), b""):
                digest.update(chunk)
    return "sha256:" + digest.hexdigest()[:32]


def needs_problems_dir(specs: Sequence[BenchmarkSpec]) -> bool:
    """Whether a benchmark is a split of `sample_orz` (read from its problems directory)."""
    return any(s.name in SPLIT_BENCHMARKS for s in specs)


def load_benchmark_problems(
    spec: BenchmarkSpec, ecfg: EvaluateConfig, problems_dir: Path | None
) -> list[dict[str, Any]]:
    """Problems ``{id, benchmark, problem, answers}`` of a benchmark (``components.data.benchmarks``)."""
    problems = load_benchmark(spec.name, ecfg.benchmark_dir, spec.max_problems, problems_dir, full=not spec.smoke)
    if not problems:
        raise ValueError(f"benchmark {spec.name!r} has no problems")
    return problems


def _decode(
    model: Any, tokenizer: Any, tags: TagIds | None, prompts: list[str], gen_cfg: GenerationConfig
) -> tuple[list[Generation], float]:
    start = time.perf_counter()
    generations = generate(model, tokenizer, prompts, gen_cfg, tags)
    return generations, time.perf_counter() - start


def _rate(wall_s: float, generations: Sequence[Generation]) -> float:
    """Tokens per second of one decode."""
    return tokens_per_second(sum(g.total_tokens for g in generations), wall_s)


def _structure(generation: Generation, tags: TagIds | None, schema_name: str) -> dict[str, Any]:
    """Parallel flags, branches and critical path of one response, by the structure module's definition."""
    if tags is not None:
        tm = trace_metrics(parse_ids(generation.token_ids, tags))
        critical = tm.critical_tokens
    else:
        # Tags are not single tokens (a base model without tag tokens): flags from the text; the token
        # critical path is what the engine decoded (sequential decoding: all of it).
        tm = trace_metrics(parse_text(generation.text, schema_name))
        critical = generation.critical_path_tokens
    return {
        "critical_path_tokens": int(critical),
        "is_parallel": tm.is_parallel,
        "is_parallel_any": tm.is_parallel_any,
        "branches_per_block": list(tm.branches),
    }


def decode_groups(
    specs: Sequence[BenchmarkSpec], n_problems: Mapping[str, int], batch_size: int
) -> list[list[BenchmarkSpec]]:
    """Consecutive benchmarks whose samples fit together in one engine batch, decoded by one engine call.

    Small benchmarks (a few problems each, as in the tiny profile's sample of the real ones) would otherwise
    each pay a whole decode loop for a handful of rows; a benchmark with a batch or more of samples (every
    benchmark of a real run) is decoded alone, as before.
    """
    groups: list[list[BenchmarkSpec]] = []
    room = 0
    for spec in specs:
        n = spec.n_samples * n_problems[spec.name]
        if groups and n <= room:
            groups[-1].append(spec)
            room -= n
        else:
            groups.append([spec])
            room = batch_size - n
    return groups


def evaluate_benchmarks(
    model: Any,
    tokenizer: Any,
    tags: TagIds | None,
    problems: Mapping[str, Sequence[Mapping[str, Any]]],
    specs: Sequence[BenchmarkSpec],
    job: EvalJob,
    checkpoint: str,
    mode: Mode,
    prompt_style: str,
    progress: Task | None = None,
    *,
    schema: str | None = None,
    engine_settings: Mapping[str, Any] | None = None,
) -> dict[str, tuple[list[dict[str, Any]], float]]:
    """Decode and grade ``spec.n_samples`` samples of every problem of every benchmark (``progress``, a
    ``components.progress.Task``, advances by one per decode group).

    Returns ``{benchmark: (records, decode wall seconds)}``. Benchmarks decoded in one call
    (``decode_groups``) share its wall time in proportion to the tokens each generated, so each reports the
    call's throughput and the seconds add up to the call's.
    """
    ecfg: EvaluateConfig = job.section
    out: dict[str, tuple[list[dict[str, Any]], float]] = {}
    sizes = {spec.name: len(problems[spec.name]) for spec in specs}
    for group in decode_groups(specs, sizes, ecfg.generation.batch_size):
        prompts: dict[str, list[str]] = {}
        for spec in group:
            rendered = [
                render_prompt(tokenizer, p["problem"], job.prompts, prompt_style) for p in problems[spec.name]
            ]
            prompts[spec.name] = [pp for pp in rendered for _ in range(spec.n_samples)]
        flat = [pp for spec in group for pp in prompts[spec.name]]
        names = ", ".join(spec.name for spec in group)
        if progress is not None:
            progress.update(f"evaluate {checkpoint} ({mode}): decoding {len(flat)} on {names}")
        generations, wall = _decode(
            model, tokenizer, tags, flat, generation_config(ecfg, mode, engine_settings)
        )
        if progress is not None:
            progress.update(f"evaluate {checkpoint} ({mode}): grading {len(flat)} on {names}")
        if len(generations) != len(flat):
            raise RuntimeError(f"engine returned {len(generations)} generations for {len(flat)} prompts")
        total_tokens = max(1, sum(g.total_tokens for g in generations))
        offset = 0
        for spec in group:
            gens = generations[offset : offset + len(prompts[spec.name])]
            offset += len(gens)
            share = sum(g.total_tokens for g in gens) / total_tokens if len(group) > 1 else 1.0
            records = _records(
                gens, prompts[spec.name], problems[spec.name], spec, job, checkpoint, mode, tags, schema
            )
            out[spec.name] = (records, wall * share)
        if progress is not None:
            progress.advance(1)
    return out


def _records(
    generations: Sequence[Generation],
    prompts: Sequence[str],
    problems: Sequence[Mapping[str, Any]],
    spec: BenchmarkSpec,
    job: EvalJob,
    checkpoint: str,
    mode: Mode,
    tags: TagIds | None,
    schema: str | None = None,
) -> list[dict[str, Any]]:
    """Grade one benchmark's generations into per-sample records."""
    schema = schema or job.schema
    golds = [list(p["answers"]) for p in problems for _ in range(spec.n_samples)]
    judgements = judge_many(
        [g.text for g in generations],
        golds,
        schema,
        job.grading,
        purpose="evaluation",
        finish_reasons=[g.finish_reason for g in generations],
    )
    records = []
    for i, (gen, judgement) in enumerate(zip(generations, judgements, strict=True)):
        problem = problems[i // spec.n_samples]
        rec = {
            "checkpoint": checkpoint,
            "benchmark": spec.name,
            "mode": mode,
            "problem_id": str(problem["id"]),
            "sample_idx": i % spec.n_samples,
            "problem": problem["problem"],
            "answers": list(problem["answers"]),
            "prompt": prompts[i],
            "response": gen.text,
            "answer_pred": judgement.pred,
            "correct": bool(judgement.correct),
            "format_score": float(judgement.format_score),
            "valid": bool(judgement.valid),
            "violations": list(judgement.violations),
            "grade_reason": judgement.grade_reason,
            "n_tokens": gen.total_tokens,
            "parallel_taken": gen.parallel_taken,
            "finish_reason": gen.finish_reason,
            # how the merges were decoded and what the policy was trained to see (never mixed unseen)
            "merge_mode": gen.merge_mode,
            "merge_semantics": job.merge_semantics,
            **_structure(gen, tags, schema),
        }
        records.append(rec)
    return records


def _tags_for(tokenizer: Any, schema_name: str, mode: Mode) -> TagIds | None:
    try:
        return TagIds.from_tokenizer(tokenizer, schema_name)
    except TagTokenError as err:
        if mode == "parallel":
            raise ValueError(f"parallel decoding needs single-token tags: {err}") from err
        log.warning("tags are not single tokens (%s); structure measured on text", err)
        return None


def _throughput(
    benches: Mapping[str, Mapping[str, Any]], speedup: Mapping[str, Any] | None = None
) -> dict[str, float]:
    """Checkpoint-level throughput over its (non-smoke) benchmarks (sums before ratios, like the wall clock),
    and the speedup decode's numbers when there was one."""
    tokens = sum(m["total_tokens"] for m in benches.values())
    wall = sum(m["wall_s"] for m in benches.values())
    responses = sum(m["n_problems"] * m["n_samples"] for m in benches.values())
    out = {
        "tokens_per_s": tokens / wall,
        "mean_tokens": tokens / responses,
        "ideal_speedup": ideal_speedup(
            [m["total_tokens"] for m in benches.values()],
            [m["total_critical_path_tokens"] for m in benches.values()],
        )
        if sum(m["total_critical_path_tokens"] for m in benches.values())
        else 1.0,
    }
    if speedup:
        out["sequential_tokens_per_s"] = speedup["sequential_tokens_per_s"]
        out["achieved_speedup"] = speedup["achieved_speedup"]
        out["speedup_ideal"] = speedup["ideal_speedup"]
        out["speedup_efficiency"] = speedup["efficiency"]
    return out


def speedup_problems(
    problems: Mapping[str, Sequence[Mapping[str, Any]]], specs: Sequence[BenchmarkSpec], ecfg: EvaluateConfig
) -> list[Mapping[str, Any]]:
    """The problems the speedup decode uses: ``speedup.benchmark``'s when it is evaluated (else every
    non-smoke benchmark's: ``npr eval`` of a user's file under a profile that names its own benchmark),
    the first ``speedup.max_problems`` of them."""
    sp = ecfg.speedup
    own = sp.benchmark is not None and sp.benchmark in problems
    names = [sp.benchmark] if own else [s.name for s in specs if not s.smoke]
    chosen = [p for name in names if name in problems for p in problems[name]]
    return chosen[: sp.max_problems] if sp.max_problems else chosen


def measure_speedup(
    model: Any,
    tokenizer: Any,
    tags: TagIds | None,
    problems: Sequence[Mapping[str, Any]],
    job: EvalJob,
    prompt_style: str,
    progress: Task | None = None,
    *,
    schema: str | None = None,
    engine_settings: Mapping[str, Any] | None = None,
) -> tuple[dict[str, Any], list[Generation], list[Generation]]:
    """Decode the same prompts in parallel and in sequential mode, batch by batch, and compare tokens/s.

    The modes alternate which goes first in each batch, so a machine whose speed drifts (a shared one) biases
    neither; with ``speedup.repeats`` > 1 each batch is decoded that many times per mode (the order flipping
    each round) and each mode's fastest decode of the batch counts, so a burst of other work on the machine
    does not land in one mode's time. ``achieved_speedup`` = parallel tokens/s / sequential tokens/s;
    ``ideal_speedup`` = total / critical-path tokens of the parallel traces (Amdahl); ``efficiency`` =
    achieved / ideal. Returns the summary and both modes' generations (in prompt order, from the decodes
    that counted); ``progress`` advances by one per batch.
    """
    ecfg: EvaluateConfig = job.section
    if not problems:
        raise ValueError("no problems for the speedup decode (evaluate.speedup)")
    batch = ecfg.speedup.batch_size or ecfg.generation.batch_size
    prompts = [render_prompt(tokenizer, p["problem"], job.prompts, prompt_style) for p in problems]
    walls = {"parallel": 0.0, "sequential": 0.0}
    gens: dict[str, list[Generation]] = {"parallel": [], "sequential": []}
    gen_cfgs = {
        mode: generation_config(ecfg, mode, engine_settings).model_copy(update={"batch_size": batch})
        for mode in ("parallel", "sequential")
    }
    for i, start in enumerate(range(0, len(prompts), batch)):
        chunk = prompts[start : start + batch]
        fastest: dict[str, tuple[float, list[Generation]]] = {}
        for r in range(ecfg.speedup.repeats):
            order: tuple[Mode, Mode] = ("parallel", "sequential") if (i + r) % 2 == 0 else ("sequential", "parallel")
            for mode in order:
                decoded, wall = _decode(model, tokenizer, tags, chunk, gen_cfgs[mode])
                # by tokens/s, not wall: were a repeat to decode other tokens, its time would not compare
                if mode not in fastest or _rate(wall, decoded) > _rate(*fastest[mode]):
                    fastest[mode] = (wall, decoded)
        for mode, (wall, decoded) in fastest.items():
            walls[mode] += wall
            gens[mode] += decoded
        if progress is not None:
            progress.advance(1)
    tokens = {m: sum(g.total_tokens for g in gens[m]) for m in gens}
    crit = [_structure(g, tags, schema or job.schema)["critical_path_tokens"] for g in gens["parallel"]]
    par_tps = tokens_per_second(tokens["parallel"], walls["parallel"])
    seq_tps = tokens_per_second(tokens["sequential"], walls["sequential"])
    ideal = ideal_speedup([g.total_tokens for g in gens["parallel"]], crit) if sum(crit) else 1.0
    achieved = achieved_speedup(par_tps, seq_tps)
    summary = {
        "benchmark": ecfg.speedup.benchmark,
        "n_problems": len(prompts),
        "batch_size": batch,
        "repeats": ecfg.speedup.repeats,
        "parallel_tokens": tokens["parallel"],
        "sequential_tokens": tokens["sequential"],
        "parallel_wall_s": walls["parallel"],
        "sequential_wall_s": walls["sequential"],
        "parallel_tokens_per_s": par_tps,
        "sequential_tokens_per_s": seq_tps,
        "achieved_speedup": achieved,
        "ideal_speedup": ideal,
        "efficiency": achieved / ideal,
        "parallel_taken_rate": sum(g.parallel_taken for g in gens["parallel"]) / len(prompts),
    }
    return summary, gens["parallel"], gens["sequential"]


def _times_speedup(ecfg: EvaluateConfig, ckpt: CheckpointSpec) -> bool:
    """Whether a checkpoint gets the speedup decode: parallel, ``measure_speedup``, ``speedup.checkpoints``."""
    return ckpt.mode == "parallel" and ecfg.measure_speedup and ecfg.speedup.applies_to(ckpt.name)


def check_served_context(
    job: EvalJob,
    checkpoints: Sequence[CheckpointSpec],
    benchmarks: Sequence[BenchmarkSpec],
    problems: Mapping[str, Sequence[Mapping[str, Any]]],
) -> int:
    """Before any work: the longest prompt of every checkpoint + ``max_new_tokens`` must fit the server's
    context length; returns the longest prompt's tokens."""
    from components.models.loading import load_tokenizer  # lazy: transformers

    gen = job.section.generation
    longest = 0
    for ckpt in checkpoints:
        tok = load_tokenizer(ckpt.path)
        for spec in benchmarks:
            for p in problems[spec.name]:
                text = render_prompt(tok, p["problem"], job.prompts, ckpt.prompt_style)
                longest = max(longest, len(tok.encode(text, add_special_tokens=False)))
    check_context_length(context_length_for(gen), longest, gen.max_new_tokens, "evaluate", server_label(gen))
    return longest


def _finished_dir(work_dir: Path | None, ckpt: CheckpointSpec) -> Path | None:
    return None if work_dir is None else Path(work_dir) / "checkpoints" / ckpt.name


def _load_finished(
    work_dir: Path | None, ckpt: CheckpointSpec, digest: str
) -> tuple[dict, dict, dict] | None:
    """A checkpoint's metrics and records kept by an earlier, interrupted run (same checkpoint bytes)."""
    d = _finished_dir(work_dir, ckpt)
    if d is None or not (d / "metrics.json").is_file():
        return None

    metrics = json.loads((d / "metrics.json").read_text())
    if metrics.get("checkpoint_hash") != digest or metrics.get("mode") != ckpt.mode:
        return None
    records: dict[str, list[dict[str, Any]]] = {}
    sequential: dict[str, list[dict[str, Any]]] = {}
    for rec in read_jsonl(d / "records.jsonl"):
        records.setdefault(rec["benchmark"], []).append(rec)
    if (d / "sequential.jsonl").is_file():
        for rec in read_jsonl(d / "sequential.jsonl"):
            sequential.setdefault(rec["benchmark"], []).append(rec)
    return metrics, records, sequential


def _keep_finished(
    work_dir: Path | None, ckpt: CheckpointSpec, metrics: dict, records: dict, sequential: dict
) -> None:
    d = _finished_dir(work_dir, ckpt)
    if d is None:
        return

    d.mkdir(parents=True, exist_ok=True)
    write_jsonl(d / "records.jsonl", [r for recs in records.values() for r in recs])
    write_jsonl(d / "sequential.jsonl", [r for recs in sequential.values() for r in recs])
    tmp = d / "metrics.json.tmp"
    tmp.write_text(json.dumps(metrics))
    tmp.replace(d / "metrics.json")  # written last: its presence marks the checkpoint finished


def evaluate_checkpoints(
    job: EvalJob,
    checkpoints: Sequence[CheckpointSpec],
    benchmarks: Sequence[BenchmarkSpec],
    problems_dir: Path | None,
    work_dir: Path | None = None,
    preloaded: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
) -> EvalResult:
    """Evaluate every checkpoint on every benchmark; the one code path behind every evaluation number.

    ``work_dir``: where finished checkpoints are kept so a rerun resumes (and a launched SGLang server
    writes its log); None keeps nothing. ``preloaded``: problems of benchmarks that are not registered
    names (a user's file, ``npr eval --benchmarks file.jsonl``), by benchmark name.
    """
    ecfg: EvaluateConfig = job.section
    if not checkpoints:
        raise ValueError("no checkpoints to evaluate")
    if not benchmarks:
        raise ValueError("no benchmarks to evaluate (evaluate.benchmarks is empty)")
    preloaded = preloaded or {}
    problems = {
        spec.name: list(preloaded[spec.name])
        if spec.name in preloaded
        else load_benchmark_problems(spec, ecfg, problems_dir)
        for spec in benchmarks
    }
    result = EvalResult(
        metrics={
            "settings": {
                "sampling": sampling_settings(ecfg, job.merge_semantics),
                "merge": merge_settings(job.merge_semantics, ecfg.generation.merge_mode),
                "prompt_hash": prompt_fingerprint(job.prompts)["prompt_hash"],
                "engine_version": engine_version(ecfg),
                "grader_version": grader_version(job.grading),
                "schema": job.schema,
            },
            "checkpoints": {},
        }
    )
    served = ecfg.generation.served
    if served:
        check_served_context(job, checkpoints, benchmarks, problems)

    groups = len(decode_groups(benchmarks, {s.name: len(problems[s.name]) for s in benchmarks},
                               ecfg.generation.batch_size))  # fmt: skip
    # a parallel checkpoint's speedup decode: one progress unit per batch (both modes)
    n_speedup = len(speedup_problems(problems, benchmarks, ecfg))
    speedup_batches = -(-n_speedup // (ecfg.speedup.batch_size or ecfg.generation.batch_size))
    units = {c.name: groups + (speedup_batches if _times_speedup(ecfg, c) else 0) for c in checkpoints}
    with track("evaluate", total=sum(units.values()), unit="decode batches") as progress:
        for ckpt in checkpoints:
            _evaluate_one(
                job, ckpt, benchmarks, problems, result, progress, work_dir, served, units[ckpt.name]
            )
    result.metrics["n_records"] = sum(len(r) for b in result.records.values() for r in b.values())
    return result


def _evaluate_one(
    job: EvalJob,
    ckpt: CheckpointSpec,
    benchmarks: Sequence[BenchmarkSpec],
    problems: Mapping[str, Sequence[Mapping[str, Any]]],
    result: EvalResult,
    progress: Task,
    work_dir: Path | None,
    served: bool,
    units: int,
) -> None:
    """One checkpoint on every benchmark (and, parallel, its speedup decode) into ``result``; a checkpoint
    finished by an earlier run is read back from ``work_dir`` instead (its ``units`` decode batches are then
    counted done at once)."""
    from components.models.loading import load_model, load_tokenizer  # lazy: transformers

    ecfg: EvaluateConfig = job.section
    digest = checkpoint_hash(ckpt.path)
    kept = _load_finished(work_dir, ckpt, digest)
    if kept is not None:
        log.info("%s: kept from an earlier run (%s)", ckpt.name, digest)
        result.metrics["checkpoints"][ckpt.name], result.records[ckpt.name], seq_kept = kept
        if seq_kept:
            result.sequential_records[ckpt.name] = seq_kept
        progress.advance(units)
        return
    if served:
        model, tokenizer = None, load_tokenizer(ckpt.path)
        log_dir = (
            Path(work_dir) / "server-logs" if work_dir is not None else Path(tempfile.mkdtemp("-sglang"))
        )
        with serving(ckpt.path, ecfg.generation, log_dir) as live:
            decoded, speedup = _decode_checkpoint(
                job.with_generation(live), ckpt, model, tokenizer, problems, benchmarks, result, progress
            )
    else:
        model, tokenizer = load_model(ckpt.path, job.models, job.run)
        decoded, speedup = _decode_checkpoint(
            job, ckpt, model, tokenizer, problems, benchmarks, result, progress
        )
    benches: dict[str, dict[str, Any]] = {}
    result.records[ckpt.name] = {}
    main_names = [spec.name for spec in benchmarks if not spec.smoke] or [spec.name for spec in benchmarks]
    for spec in benchmarks:
        records, wall = decoded[spec.name]
        metrics = summarize_records(records, spec.k, wall)
        benches[spec.name] = metrics
        result.records[ckpt.name][spec.name] = records
        log.info(
            "%s on %s (%s): accuracy %.3f, %.0f tokens/s",
            ckpt.name,
            spec.name,
            ckpt.mode,
            metrics["accuracy"],
            metrics["tokens_per_s"],
        )
    main = {name: benches[name] for name in main_names}
    result.metrics["checkpoints"][ckpt.name] = {
        "mode": ckpt.mode,
        "prompt_style": ckpt.prompt_style,
        **({"schema": ckpt.schema} if ckpt.schema and ckpt.schema != job.schema else {}),
        **({"engine_settings": dict(ckpt.engine_settings)} if ckpt.engine_settings else {}),
        "path": str(ckpt.path),
        "checkpoint_hash": digest,
        "benchmarks": benches,
        "smoke_benchmarks": [spec.name for spec in benchmarks if spec.smoke],
        # Smoke samples are reported, never averaged.
        "average_accuracy": sum(m["accuracy"] for m in main.values()) / len(main),
        "throughput": _throughput(main, speedup),
        **({"speedup": speedup} if speedup else {}),
    }
    _keep_finished(
        work_dir,
        ckpt,
        result.metrics["checkpoints"][ckpt.name],
        result.records[ckpt.name],
        result.sequential_records.get(ckpt.name, {}),
    )
    del model
    gc.collect()


def _decode_checkpoint(
    job: EvalJob,
    ckpt: CheckpointSpec,
    model: Any,
    tokenizer: Any,
    problems: Mapping[str, Sequence[Mapping[str, Any]]],
    benchmarks: Sequence[BenchmarkSpec],
    result: EvalResult,
    progress: Task | None = None,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """One checkpoint's decodes: in its own mode on every benchmark, and (parallel, ``measure_speedup``) the
    speedup decode, whose graded sequential samples go to ``result.sequential_records`` (benchmark
    ``speedup``) so a reader can see what the comparison decoded."""
    schema = ckpt.schema or job.schema
    tags = _tags_for(tokenizer, schema, ckpt.mode)
    args = (model, tokenizer, tags, problems, benchmarks, job, ckpt.name)
    how = {"schema": schema, "engine_settings": ckpt.engine_settings}
    decoded = evaluate_benchmarks(*args, ckpt.mode, ckpt.prompt_style, progress, **how)
    if not _times_speedup(job.section, ckpt):
        return decoded, None

    chosen = speedup_problems(problems, benchmarks, job.section)
    if progress is not None:
        progress.update(f"evaluate {ckpt.name}: speedup decode of {len(chosen)} problems")
    summary, _, seq_gens = measure_speedup(
        model, tokenizer, tags, chosen, job, ckpt.prompt_style, progress, **how
    )
    prompts = [render_prompt(tokenizer, p["problem"], job.prompts, ckpt.prompt_style) for p in chosen]
    spec = BenchmarkSpec(name="speedup", n_samples=1, k=1)
    seq_records = _records(seq_gens, prompts, chosen, spec, job, ckpt.name, "sequential", tags, schema)
    result.sequential_records.setdefault(ckpt.name, {})["speedup"] = seq_records
    summary["sequential_accuracy"] = sum(r["correct"] for r in seq_records) / len(seq_records)
    log.info(
        "%s speedup at batch %d on %d problems: achieved %.2f, ideal %.2f (%.2f)",
        ckpt.name,
        summary["batch_size"],
        summary["n_problems"],
        summary["achieved_speedup"],
        summary["ideal_speedup"],
        summary["efficiency"],
    )
    return decoded, summary


def write_records(result: EvalResult, records_dir: Path, n_shards: int) -> int:
    """Per-sample records as ``<checkpoint>/<benchmark>-NNNNN.jsonl`` (sequential re-decodes as
    ``<benchmark>.sequential-NNNNN.jsonl``); returns how many records were written."""
    n = 0
    for store, suffix in ((result.records, ""), (result.sequential_records, ".sequential")):
        for ckpt, by_bench in store.items():
            for bench, records in by_bench.items():
                write_shards(Path(records_dir) / ckpt, records, n_shards, stem=f"{bench}{suffix}")
                n += len(records)
    return n
