"""Stage `seed`: the starting model of the pipeline, the stand-in for "the instruct model we do not train".

Both profiles materialise ``models.base_model`` into the stage output: load it as a user would (a local
directory, or a hub id where the hub is reachable) and save it unchanged. On the tiny profile that is the
committed checkpoint ``models/tiny-instruct`` (built once by ``components.training.tiny_seed``; its
``SHA256SUMS`` are verified first, so a truncated copy or a Git LFS pointer fails here with a clear error);
on qwen3-4b it is Qwen3-4B-Instruct-2507.

``models.base_model: tiny`` instead builds the tiny seed from scratch inside the stage with the same code and
the ``seed`` section's recipe (hours on 2 cores: the reason the checkpoint is committed).

With ``seed.eval_n > 0`` the stage then measures the model on the validation split of ``sample_orz`` (the
test split when there is none) at ``seed.eval_temperature`` with the engine's sequential sampler and the
grader: ``format_valid``, ``accuracy``, ``correct_and_valid`` go to the stage metrics.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from components.artifacts import atomic_dir
from components.config import PipelineConfig
from components.dag import StageIO
from components.data.problems import load_tuning_split
from components.training.seed_job import SeedJob, SeedPaths, seed_job
from components.training.tiny_seed import CARD_JSON, measure, read_card, train_seed, verify_checksums

TINY = "tiny"


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    job = seed_job("seed", cfg, SeedPaths.of(io))
    # the tiny profile's committed checkpoint (or a hub model) is copied; models.base_model: tiny builds it
    if job.models.base_model == TINY:
        model, tokenizer, metrics = build_tiny_seed(job)
    else:
        model, tokenizer, metrics = materialise_base_model(job)
    with atomic_dir(job.stage_paths().writes) as tmp:
        from components.models.loading import save_model  # lazy: transformers

        save_model(model, tokenizer, tmp)
    if job.section.eval_n > 0:
        metrics.update(evaluate_seed(model, tokenizer, job))
    return metrics


def materialise_base_model(job: SeedJob) -> tuple[Any, Any, dict[str, Any]]:
    """Load ``models.base_model`` (hub id or local dir; local dirs with ``SHA256SUMS`` are verified)."""
    from components.models.loading import is_local_model_dir, load_model  # lazy: transformers

    source = job.models.base_model
    metrics: dict[str, Any] = {"base_model": source}
    parent = Path(source).parent
    if parent != Path(".") and parent.is_dir() and not is_local_model_dir(source):
        # models/<name> names a directory of this checkout, not a hub id: say so instead of asking the hub
        raise FileNotFoundError(
            f"models.base_model {source!r} does not exist (is the checkout complete? the tiny profile's "
            "checkpoint is committed; `npr seed build` rebuilds it)"
        )
    if is_local_model_dir(source):
        checked = verify_checksums(Path(source))
        metrics["checksums_verified"] = sorted(checked) if checked is not None else []
        if (Path(source) / CARD_JSON).exists():
            metrics["card_weights_sha256"] = read_card(Path(source))["weights_sha256"]
    # A copy computes nothing: it loads on the CPU wherever it runs (qwen3-4b places seed on the cpu pool,
    # whose workers have no CUDA); only a measurement (seed.eval_n > 0) needs run.device.
    run_cfg = job.run if job.section.eval_n > 0 else job.run.model_copy(update={"device": "cpu"})
    model, tokenizer = load_model(source, job.models, run_cfg)
    metrics.update(parameters=sum(p.numel() for p in model.parameters()), vocab_size=len(tokenizer))
    return model, tokenizer, metrics


def build_tiny_seed(job: SeedJob) -> tuple[Any, Any, dict[str, Any]]:
    """The committed checkpoint's build (``tiny_seed.train_seed``), resumable in the stage's work dir."""
    steps = job.section.steps if job.section.enabled else 0
    model, tokenizer, result = train_seed(job, job.stage_paths().work_dir, total_steps=steps)
    metrics: dict[str, Any] = {
        "base_model": TINY,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        **result.summary(),
    }
    if result.wall_time_s > 0 and result.final_step > 0:  # over the whole run, resumed or not
        metrics["steps_per_s"] = round(result.final_step / result.wall_time_s, 4)
    return model, tokenizer, metrics


def evaluate_seed(model: Any, tokenizer: Any, job: SeedJob) -> dict[str, Any]:
    """Sample one response per held-out problem (sequential engine) and grade it."""
    split, problems = load_tuning_split(job.stage_paths().problems)
    chosen = problems[: job.section.eval_n]
    if not chosen:
        raise ValueError(f"the sample_orz {split} split is empty: the seed model cannot be measured")
    m = measure(
        model,
        tokenizer,
        chosen,
        job,
        temperature=job.section.eval_temperature,
        max_new_tokens=job.section.max_new_tokens,
        seed=job.run.seed,
    )
    out = {k: v for k, v in m.items() if k not in ("correct", "n")}
    return {"eval_split": split, "eval_n": m["n"], **out}
