"""Stage ``distill``: K sampled trajectories per training problem from a checkpoint, graded (NPR stage 2).

Problems are the train split of ``sample_orz/problems`` in file order (the first ``n_problems``); the
model is ``artifacts/<distill.init_from>/model``. Prompts use the parallel instruction (the paper samples
NPR-Zero with it); the engine mode is ``distill.generation.mode`` (sequential visibility by default, as in
the paper). Each response is judged with ``components.grading.judge_many``.

Resumable: problems are decoded in chunks of ``generation.batch_size // k`` problems; each finished chunk
is written as ``chunk-NNNNN.jsonl`` into ``artifacts/distill/work`` (atomically) and a rerun skips it. The work dir
is stamped by ``components.stages.run_stage`` with the stage's code, params and input files; any change
clears it so stale samples are never mixed in.
"""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.artifacts import (
    atomic_dir,
    read_jsonl,
    read_shards,
    write_jsonl,
    write_shards,
)
from components.config import PipelineConfig
from components.dag import StageIO
from components.data.acceptance import accepted_problem_prefix
from components.engine import generate
from components.engine.config import GenerationConfig
from components.grading.judge import judge_many
from components.progress import track
from components.prompts import PromptConfig, render_prompt
from components.structure import TagIds

WORK_DIR_NAME = "work"
log = logging.getLogger(__name__)


def load_problems(problems_dir: Path, n_problems: int | None) -> list[dict[str, Any]]:
    problems = read_shards(problems_dir, stem="train")
    if not problems:
        raise ValueError(f"no train problems in {problems_dir}")
    return problems[:n_problems] if n_problems else problems


def trajectory_records(
    problems: list[dict[str, Any]], k: int, prompts: list[str], gens: list[Any], judgements: list[Any]
) -> list[dict[str, Any]]:
    """One record per sample (docs/architecture.md "trajectories"), plus source and difficulty for the
    filter's per-difficulty acceptance check."""
    out = []
    for i, (gen, judgement) in enumerate(zip(gens, judgements, strict=True)):
        problem = problems[i // k]
        out.append(
            {
                "problem_id": problem["id"],
                "sample_idx": i % k,
                "problem": problem["problem"],
                "answer": problem["answer"],
                "source": problem.get("source"),
                "difficulty": problem.get("difficulty"),
                "prompt": prompts[i],
                "response": gen.text,
                "n_tokens": gen.total_tokens,
                **judgement.as_record(),
                "finish_reason": gen.finish_reason,
                "structure": gen.structure() | {"wall_time_s": round(gen.wall_time_s, 4)},
            }
        )
    return out


@dataclass
class DecodeStats:
    """What ``_decode_chunks`` did: the records of the chunks it read (in problem order) and its counts."""

    records: list[dict[str, Any]]
    chunks: int
    resumed: int
    tokens: int
    seconds: float


def _decode_chunks(
    cfg: PipelineConfig,
    problems: list[dict[str, Any]],
    model: Any,
    tokenizer: Any,
    tags: Any,
    gen_cfg: GenerationConfig,
    work: Path,
) -> DecodeStats:
    """Decode and grade every chunk not already in ``work``, in order, until ``distill.target_accepted``
    problems have an accepted trajectory (the reject_filter rule) or the problems run out."""
    dcfg = cfg.distill
    per_chunk = max(1, gen_cfg.batch_size // dcfg.k)
    n_chunks = math.ceil(len(problems) / per_chunk)
    resumed = generated_tokens = 0
    gen_seconds = 0.0
    records: list[dict[str, Any]] = []
    accepted = read = 0
    with track(
        f"distill ({dcfg.k} samples x up to {len(problems)} problems)", total=n_chunks, unit="chunks"
    ) as task:
        for c in range(n_chunks):
            if dcfg.target_accepted is not None and accepted >= dcfg.target_accepted:
                break
            chunk_path = work / f"chunk-{c:05d}.jsonl"
            chunk = problems[c * per_chunk : (c + 1) * per_chunk]
            if chunk_path.exists():
                resumed += 1
            else:
                prompts = [
                    render_prompt(tokenizer, p["problem"], cfg.prompts, "parallel")
                    for p in chunk
                    for _ in range(dcfg.k)
                ]
                # Seed per chunk: a resumed run draws exactly the samples an uninterrupted one would (on an
                # SGLang server only in its deterministic mode, which the GPU profile's distill turns on;
                # otherwise the server ignores request seeds and a regenerated chunk is a new draw)
                chunk_cfg = gen_cfg.model_copy(update={"seed": gen_cfg.seed + c})
                start = time.perf_counter()
                gens = generate(model, tokenizer, prompts, chunk_cfg, tags)
                gen_seconds += time.perf_counter() - start
                generated_tokens += sum(g.total_tokens for g in gens)
                golds = [p["answer"] for p in chunk for _ in range(dcfg.k)]
                judgements = judge_many(
                    [g.text for g in gens],
                    golds,
                    cfg.schema_name,
                    cfg.grading,
                    purpose="distill",
                    finish_reasons=[g.finish_reason for g in gens],
                )
                tmp = chunk_path.with_suffix(".tmp")
                write_jsonl(tmp, trajectory_records(chunk, dcfg.k, prompts, gens, judgements))
                tmp.replace(chunk_path)
            records.extend(read_jsonl(chunk_path))
            read += 1
            if dcfg.target_accepted is not None:
                decoded = [str(p["id"]) for p in problems[: (c + 1) * per_chunk]]
                _, accepted = accepted_problem_prefix(
                    decoded, records, cfg.reject_filter, dcfg.target_accepted
                )
            task.advance(
                1,
                tokens_per_s=generated_tokens / max(gen_seconds, 1e-9),
                **({"accepted": accepted} if dcfg.target_accepted else {}),
            )
    return DecodeStats(records, read, resumed, generated_tokens, gen_seconds)


def longest_prompt_tokens(tokenizer: Any, problems: list[dict[str, Any]], prompts_cfg: PromptConfig) -> int:
    """Tokens of the longest rendered prompt (checked against the server's context length up front)."""
    return max(
        len(
            tokenizer.encode(
                render_prompt(tokenizer, p["problem"], prompts_cfg, "parallel"), add_special_tokens=False
            )
        )
        for p in problems
    )


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    from components.models.loading import load_model, load_tokenizer  # lazy: transformers

    dcfg = cfg.distill
    gen_cfg = dcfg.generation
    model_dir = io.input(f"{dcfg.init_from}/model")
    out_dir = io.output("trajectories")
    problems = load_problems(io.input("sample_orz/problems"), dcfg.n_problems)
    served = gen_cfg.served
    if served:
        model, tokenizer = None, load_tokenizer(model_dir)  # the server holds the weights
    else:
        model, tokenizer = load_model(model_dir, cfg.models, cfg.run)
    tags = TagIds.from_tokenizer(tokenizer, cfg.schema_name) if gen_cfg.mode == "parallel" else None

    work = out_dir.parent / WORK_DIR_NAME
    work.mkdir(parents=True, exist_ok=True)  # stamped and reset on any change by components.stages.run_stage
    if served:
        from components.engine.serving import (  # lazy: httpx
            check_context_length,
            context_length_for,
            server_label,
            serving,
        )

        longest = longest_prompt_tokens(tokenizer, problems, cfg.prompts)
        check_context_length(
            context_length_for(gen_cfg), longest, gen_cfg.max_new_tokens, "distill", server_label(gen_cfg)
        )
        with serving(model_dir, gen_cfg, work / "server-logs") as live_cfg:
            stats = _decode_chunks(cfg, problems, model, tokenizer, tags, live_cfg, work)
    else:
        stats = _decode_chunks(cfg, problems, model, tokenizer, tags, gen_cfg, work)
    # Keep the shortest prefix of problems that reaches the target: the same problems on a rerun, and a
    # chunk's extra problems do not add data beyond what was asked for.
    decoded = problems[: min(len(problems), stats.chunks * max(1, gen_cfg.batch_size // dcfg.k))]
    used, accepted = len(decoded), None
    if dcfg.target_accepted is not None:
        used, accepted = accepted_problem_prefix(
            [str(p["id"]) for p in decoded], stats.records, cfg.reject_filter, dcfg.target_accepted
        )
    kept_ids = {str(p["id"]) for p in decoded[:used]}
    records = [r for r in stats.records if str(r["problem_id"]) in kept_ids]
    expected = used * dcfg.k
    if len(records) != expected:
        raise RuntimeError(f"distill work dir holds {len(records)} trajectories, expected {expected}")
    shortfall = max(0, dcfg.target_accepted - accepted) if accepted is not None else 0
    if shortfall:
        log.warning(
            "distill: %d problems with an accepted trajectory after all %d problems (distill.n_problems), "
            "%d short of distill.target_accepted=%d",
            accepted,
            len(problems),
            shortfall,
            dcfg.target_accepted,
        )
    with atomic_dir(out_dir) as tmp_dir:
        write_shards(tmp_dir, records, n_shards=math.ceil(len(records) / dcfg.shard_size))

    n = len(records)
    return {
        "n_problems": used,
        "max_problems": len(problems),
        "target_accepted": dcfg.target_accepted,
        "accepted_problems": accepted,
        "shortfall": shortfall,
        "k": dcfg.k,
        "n_trajectories": len(records),
        "chunks": stats.chunks,
        "chunks_resumed": stats.resumed,
        "accuracy": sum(r["correct"] for r in records) / n,
        "format_valid": sum(r["valid"] for r in records) / n,
        "correct_and_valid": sum(r["correct"] and r["valid"] for r in records) / n,
        "problems_with_a_correct_valid_sample": len(
            {r["problem_id"] for r in records if r["correct"] and r["valid"]}
        ),
        "mean_response_tokens": sum(r["n_tokens"] for r in records) / n,
        "finish_reasons": dict(Counter(r["finish_reason"] for r in records)),
        "parallel_taken_rate": sum(r["structure"]["parallel_taken"] for r in records) / n,
        "generated_tokens_this_run": stats.tokens,
        "tokens_per_s": stats.tokens / stats.seconds if stats.seconds else None,
        "engine_mode": gen_cfg.mode,
        "backend": gen_cfg.backend,
    }
