"""Build the tiny profile's "instruct" model: tokenizer, tiny Qwen3 and a long causal SFT on both answer styles.

The real pipeline starts from an instruct model it does not train (Qwen3-4B-Instruct-2507). The tiny profile
has the same shape: ``models/tiny-instruct`` is a checkpoint built once by this module, committed with its
model card and checksums, and materialised by stage `seed` exactly as the hub model is on qwen3-4b. Its
recipe is the tiny profile's ``seed`` section (steps, batch, schedule, style mix), its data the synthetic task
family's ``train`` partition only, so no test or validation problem is ever trained on (the partition is a
property of the problem, ``components.data.synthetic.partition``), and no real benchmark problem either
(none is a synthetic problem: ``disjoint_from_benchmarks``).

What the model is taught: given the parallel instruction, a solution in one of two styles, the NPR schema
written out in one stream (``parallel_fraction`` of the samples, a ``mistake_fraction`` of those with a
realistic format mistake) or a plain sequential solution. Like an instruct model that follows a format
instruction only part of the time, it answers mostly sequentially, sometimes in the schema, and has never
seen the parallel attention mask: NPR-Zero's RL and the parallel warmup teach the rest.

Build (hours on 2 cores; resumable from its work dir)::

    npr seed build --out models/tiny-instruct

``--steps N`` overrides the recipe's length (for a quick look); ``models.base_model: tiny`` makes stage
`seed` run this same build inside the pipeline instead of materialising the committed checkpoint.
Reproduction (``tests/integration/models/test_tiny_seed.py``): the tokenizer, the initial weights and the
first optimizer steps' losses recorded in the card are rebuilt and compared, and the committed weights are
measured again on a small validation sample against the card's numbers.
"""

from __future__ import annotations

import hashlib
import json
import logging
import platform
import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from components.artifacts import atomic_dir, write_json
from components.data import synthetic
from components.data.synthetic import DIFFICULTIES, PARTITION_MODULUS, PARTITION_OF_BUCKET, Expression
from components.engine import generate
from components.engine.config import GenerationConfig
from components.grading.judge import judge_many
from components.prompts import chat_messages, render_prompt
from components.training.seed_job import SeedJob
from components.training.sft_data import encode_example

log = logging.getLogger(__name__)

CARD_FILE = "README.md"
CARD_JSON = "model_card.json"
CHECKSUMS_FILE = "SHA256SUMS"
DEFAULT_OUT = Path("models/tiny-instruct")
DEFAULT_WORK = Path("artifacts/seed-build/work")
# How many optimizer steps the card fingerprints (the reproduction test replays them: a few seconds).
FINGERPRINT_STEPS = 3
# Validation problems the card measures the model on, and the greedy sample the test re-measures.
CARD_EVAL_N = 600
CARD_GREEDY_N = 48
LOG_EVERY = 10  # optimizer steps between loss-curve points


# ----------------------------------------------------------------------------------------------- data
def training_problems(n: int, seed: int, weights: dict[str, float]) -> list[dict[str, Any]]:
    """``n`` synthetic problems from the ``train`` partition only (never a test or validation problem)."""
    return synthetic.generate_problems(n, seed, weights, partitions=("train",))


def validation_problems(n: int, weights: dict[str, float], seed: int = 17) -> list[dict[str, Any]]:
    """``n`` problems of the ``val`` partition: what the card measures (disjoint from training and test)."""
    return synthetic.generate_problems(n, seed, weights, partitions=("val",))


class SeedSource:
    """Fresh SFT examples for every step, a pure function of (seed, step): resumable and reproducible.

    Problems come from the synthetic generator's ``train`` partition (``seed.difficulty_weights``); each gets
    a parallel-schema solution with probability ``seed.parallel_fraction`` (a ``mistake_fraction`` of those
    with one format mistake), else a sequential one, always under the parallel instruction the engine uses.
    """

    def __init__(self, job: SeedJob, tokenizer: Any) -> None:
        self.job, self.tokenizer = job, tokenizer

    def __call__(self, step: int) -> list[Any]:
        recipe = self.job.section
        step_seed = self.job.run.seed * 1_000_003 + step
        rng = random.Random(step_seed)
        examples = []
        for record in training_problems(recipe.batch_size, step_seed, recipe.difficulty_weights):
            style = "parallel" if rng.random() < recipe.parallel_fraction else "sequential"
            mistake = None
            if style == "parallel" and rng.random() < recipe.mistake_fraction:
                mistake = rng.choice(synthetic.MISTAKES)
            response = synthetic.render_solution(record, style, rng, mistake)
            prompt = render_prompt(self.tokenizer, record["problem"], self.job.prompts, "parallel")
            example = encode_example(self.tokenizer, prompt, response)
            if len(example.input_ids) > recipe.max_length:
                raise ValueError(
                    f"step {step}: a {len(example.input_ids)}-token seed example exceeds seed.max_length "
                    f"{recipe.max_length} (raise it: the task family's longest problems must fit)"
                )
            examples.append(example)
        return examples


def tokenizer_corpus(job: SeedJob) -> list[str]:
    """Chat-rendered conversations (prompt and a solution of either style) of generated training problems.

    Exactly the text the model will read (role headers and instruction included), so BPE merges the
    prompt's fixed words as well as the solutions'.
    """
    from components.models.tiny import render_chat  # lazy: transformers

    tiny = job.models.tiny
    rng = random.Random(job.run.seed)
    texts = []
    for record in training_problems(tiny.tokenizer_corpus_size, job.run.seed, job.section.difficulty_weights):
        style = "parallel" if rng.random() < 0.5 else "sequential"
        messages = chat_messages(record["problem"], job.prompts, "parallel")
        messages.append({"role": "assistant", "content": synthetic.render_solution(record, style, rng)})
        texts.append(render_chat(messages))
    return texts


# ----------------------------------------------------------------------------------------------- model
def new_tokenizer_and_model(job: SeedJob) -> tuple[Any, Any]:
    """The trained tokenizer and the randomly initialised tiny Qwen3 of the profile (deterministic)."""
    from components.models.tiny import build_tiny_model, train_tokenizer  # lazy: transformers

    if job.models.tiny is None:
        raise ValueError("building the tiny seed needs models.tiny (the architecture)")
    tokenizer = train_tokenizer(tokenizer_corpus(job), job.models.tiny.tokenizer_vocab_size, job.schema)
    model = build_tiny_model(
        job.models.tiny,
        tokenizer,
        job.run.seed,
        attn_implementation=job.models.attn_implementation,
        pad_vocab_to_multiple_of=job.models.pad_embeddings_to_multiple_of,
    )
    return tokenizer, model


def sft_settings(job: SeedJob, total_steps: int | None = None, log_every: int = LOG_EVERY) -> Any:
    from components.training.sft import SFTSettings  # lazy: transformers

    s = job.section
    return SFTSettings(
        mode="sequential",
        total_steps=s.steps if total_steps is None else total_steps,
        batch_size=s.batch_size,
        lr=s.lr,
        warmup_steps=s.warmup_steps,
        scheduler=s.scheduler,
        min_lr=s.min_lr,
        weight_decay=s.weight_decay,
        adam_betas=s.adam_betas,
        grad_clip=s.grad_clip,
        save_every=s.save_every,
        seed=job.run.seed,
        length_splits=s.length_splits,
        log_every=log_every,
        autocast=s.autocast,
    )


def weights_sha256(model: torch.nn.Module) -> str:
    """sha256 over the parameter names and float32 bytes, in name order (independent of file format)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        digest.update(name.encode() + b"\0")
        digest.update(tensor.detach().to(torch.float32).contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def tokenizer_sha256(tokenizer: Any) -> str:
    """sha256 of the tokenizer's vocabulary and merges (its ``tokenizer.json`` model section)."""
    model_section = json.loads(tokenizer.backend_tokenizer.to_str())["model"]
    payload = json.dumps({"vocab": model_section["vocab"], "merges": model_section["merges"]}, sort_keys=True)
    return hashlib.sha256(payload.encode()).hexdigest()


def first_steps_fingerprint(job: SeedJob, n_steps: int = FINGERPRINT_STEPS) -> dict[str, Any]:
    """Tokenizer hash, initial-weights hash and the losses of the first ``n_steps`` optimizer steps.

    What the reproduction test compares with the card: the data, tokenizer, initialisation and optimizer
    of the build, in seconds (the losses at one torch thread; other thread counts agree to ~1e-6).
    """
    from components.training.sft import train_sft  # lazy: transformers

    tokenizer, model = new_tokenizer_and_model(job)
    init_hash = weights_sha256(model)
    # A fresh work dir: train_sft resumes from any checkpoint it finds, which would skip the steps.
    with torch.random.fork_rng(devices=[]), tempfile.TemporaryDirectory() as work_dir:
        result = train_sft(
            model,
            SeedSource(job, tokenizer),
            sft_settings(job, n_steps, log_every=1),
            Path(work_dir),
            pad_id=tokenizer.pad_token_id,
            show_progress=False,
        )
    return {
        "tokenizer_sha256": tokenizer_sha256(tokenizer),
        "initial_weights_sha256": init_hash,
        "steps": n_steps,
        "losses": [round(float(h["loss"]), 6) for h in result.history[:n_steps]],
    }


# ----------------------------------------------------------------------------------------------- measure
def measure(
    model: Any,
    tokenizer: Any,
    problems: Sequence[dict[str, Any]],
    job: SeedJob,
    temperature: float,
    max_new_tokens: int,
    seed: int = 0,
) -> dict[str, Any]:
    """One response per problem (sequential engine, the parallel instruction), graded; overall and per level.

    Returns ``format_valid``, ``accuracy``, ``correct_and_valid``, ``parallel_style`` (responses that open a
    ``<guideline>``), ``accuracy_parallel_style`` / ``accuracy_sequential_style``, ``truncated``, ``n``,
    ``per_difficulty`` and the per-problem ``correct`` flags (for exact comparisons in tests).
    """
    if not problems:
        raise ValueError("no problems to measure the seed model on")
    gen_cfg = GenerationConfig(
        mode="sequential",
        temperature=temperature,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=max_new_tokens,
        step_repetition_penalty=1.0,
        batch_size=job.section.eval_batch_size,
        seed=seed,
    )
    prompts = [render_prompt(tokenizer, p["problem"], job.prompts, "parallel") for p in problems]
    generations = generate(model, tokenizer, prompts, gen_cfg)
    judgements = judge_many(
        [g.text for g in generations],
        [p["answer"] for p in problems],
        job.schema,
        job.grading,
        purpose="evaluation",
        finish_reasons=[g.finish_reason for g in generations],
    )
    rows = [
        {
            "difficulty": p.get("difficulty"),
            "correct": bool(j.correct),
            "valid": bool(j.valid),
            "parallel_style": g.text.lstrip().startswith("<guideline>"),
            "truncated": g.finish_reason == "length",
        }
        for p, g, j in zip(problems, generations, judgements, strict=True)
    ]
    return {
        **_summary(rows),
        "per_difficulty": _per_difficulty(rows),
        "correct": [r["correct"] for r in rows],
    }


def _summary(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    n = len(rows)
    par = [r for r in rows if r["parallel_style"]]
    seq = [r for r in rows if not r["parallel_style"]]

    def frac(items: Sequence[dict[str, Any]], key: str) -> float | None:
        return round(sum(r[key] for r in items) / len(items), 4) if items else None

    return {
        "n": n,
        "format_valid": frac(rows, "valid"),
        "accuracy": frac(rows, "correct"),
        "correct_and_valid": round(sum(r["correct"] and r["valid"] for r in rows) / n, 4),
        "parallel_style": frac(rows, "parallel_style"),
        "accuracy_parallel_style": frac(par, "correct"),
        "accuracy_sequential_style": frac(seq, "correct"),
        "truncated": frac(rows, "truncated"),
    }


def _per_difficulty(rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    seen = {str(r["difficulty"]) for r in rows}
    levels = [d for d in DIFFICULTIES if d in seen] + sorted(seen - set(DIFFICULTIES))
    return {lv: _summary([r for r in rows if str(r["difficulty"]) == lv]) for lv in levels}


def disjoint_from_benchmarks(benchmark_problems: Sequence[str]) -> bool:
    """True when no benchmark problem text is a synthetic problem (so the seed cannot have trained on it)."""
    for text in benchmark_problems:
        try:
            Expression.parse(text)
        except ValueError:
            continue
        return False
    return True


# ----------------------------------------------------------------------------------------------- build
def train_seed(job: SeedJob, work_dir: Path, total_steps: int | None = None) -> Any:
    """Tokenizer + model + SFT (resumable in ``work_dir``); returns ``(model, tokenizer, SFTResult)``.

    A job of a stage (``job.stage``) runs the SFT inside that stage's W&B run (``sft_run``), as the
    pipeline's `seed` stage does; ``npr seed build``'s (no stage) trains without one.
    """
    tokenizer, model = new_tokenizer_and_model(job)
    settings = sft_settings(job, total_steps)
    source = SeedSource(job, tokenizer)
    result = _train(job, model, tokenizer, source, settings, Path(work_dir))
    model.eval()
    return model, tokenizer, result


def _train(job: SeedJob, model: Any, tokenizer: Any, source: Any, settings: Any, work_dir: Path) -> Any:
    from components.training.sft import train_sft  # lazy: transformers
    from components.training.sft_run import train_sft_in_stage_run  # lazy: transformers

    if job.stage is not None:
        result = train_sft_in_stage_run(
            job.tracking, job.stage, work_dir, model, source, settings, pad_id=tokenizer.pad_token_id
        )
    else:
        result = train_sft(
            model,
            source,
            settings,
            work_dir,
            pad_id=tokenizer.pad_token_id,
            metrics_path=Path(work_dir) / "train_metrics.json",
        )
    return result


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_checksums(model_dir: Path) -> dict[str, str]:
    """``SHA256SUMS`` (``sha256sum`` format) of every file of a model directory except itself."""
    model_dir = Path(model_dir)
    sums = {
        p.name: file_sha256(p)
        for p in sorted(model_dir.iterdir())
        if p.is_file() and p.name != CHECKSUMS_FILE
    }
    (model_dir / CHECKSUMS_FILE).write_text("".join(f"{h}  {n}\n" for n, h in sums.items()), encoding="utf-8")
    return sums


def verify_checksums(model_dir: Path) -> dict[str, str] | None:
    """Check a directory against its ``SHA256SUMS``; None when it has none (a hub model). Raises ValueError
    naming the first file that is missing or differs (a truncated copy, a Git LFS pointer, an edit)."""
    model_dir = Path(model_dir)
    listing = model_dir / CHECKSUMS_FILE
    if not listing.exists():
        return None
    expected = {}
    for line in listing.read_text(encoding="utf-8").splitlines():
        if line.strip():
            digest, name = line.split(maxsplit=1)
            expected[name.strip()] = digest
    for name, digest in expected.items():
        path = model_dir / name
        if not path.is_file():
            raise ValueError(f"{model_dir}: {name} is listed in {CHECKSUMS_FILE} but missing")
        actual = file_sha256(path)
        if actual != digest:
            raise ValueError(
                f"{model_dir}: {name} has sha256 {actual[:12]}..., {CHECKSUMS_FILE} says {digest[:12]}... "
                "(a partial copy or a Git LFS pointer instead of the file?)"
            )
    return expected


def read_card(model_dir: Path) -> dict[str, Any]:
    """The machine-readable model card of a checkpoint built here (``model_card.json``)."""
    path = Path(model_dir) / CARD_JSON
    if not path.exists():
        raise FileNotFoundError(f"{model_dir} has no {CARD_JSON}: not a checkpoint built by tiny_seed")
    return json.loads(path.read_text(encoding="utf-8"))


def build_card(
    job: SeedJob,
    model: Any,
    tokenizer: Any,
    result: Any,
    fingerprint: dict[str, Any],
    threads: int,
    eval_n: int = CARD_EVAL_N,
) -> dict[str, Any]:
    """Recipe, data, seeds, environment, training summary and validation metrics of a built model."""
    weights = dict(job.section.difficulty_weights)
    val = validation_problems(eval_n, weights)
    sampled = measure(model, tokenizer, val, job, temperature=1.0, max_new_tokens=job.section.max_new_tokens)
    greedy_n = min(CARD_GREEDY_N, eval_n)
    greedy = measure(
        model, tokenizer, val[:greedy_n], job, temperature=0.0, max_new_tokens=job.section.max_new_tokens
    )
    return {
        "name": "tiny-instruct",
        "architecture": "Qwen3ForCausalLM",
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "config": {
            "models.tiny": job.models.tiny.model_dump(mode="json"),
            "seed": job.section.model_dump(mode="json"),
            "run.seed": job.run.seed,
            "prompts": job.prompts.model_dump(mode="json"),
            "schema_name": job.schema,
        },
        "data": {
            "generator": "components.data.synthetic (train partition only)",
            "partition": {
                "rule": f"int(content id, 16) % {PARTITION_MODULUS}",
                "reserved": {str(k): v for k, v in PARTITION_OF_BUCKET.items()},
            },
            "difficulties": list(DIFFICULTIES),
            "training_samples": result.final_step * job.section.batch_size,
        },
        "environment": {
            "torch": torch.__version__,
            "python": platform.python_version(),
            "machine": platform.machine(),
            "torch_threads": threads,
        },
        "training": {
            **result.summary(),
            # a resumed build's own clock covers only its last session: the logged step times cover all
            "estimated_total_train_time_s": estimated_train_time_s(result.history, result.final_step),
            "history_every": LOG_EVERY,
            "loss_curve": [
                {"step": int(h["step"]), "loss": round(float(h["loss"]), 5)} for h in result.history
            ],
        },
        "fingerprint": fingerprint,
        "weights_sha256": weights_sha256(model),
        "validation": {
            "problems": f"validation_problems({eval_n}, {weights}) (seed 17)",
            "sampled_t1": {k: v for k, v in sampled.items() if k != "correct"},
            "greedy": {
                "n": greedy_n,
                "accuracy": greedy["accuracy"],
                "format_valid": greedy["format_valid"],
                "correct": greedy["correct"],
            },
        },
    }


def estimated_train_time_s(history: Sequence[dict[str, Any]], steps: int) -> float | None:
    """``steps`` x the mean logged step time: the whole build's training time, resumed sessions included."""
    times = [float(h["step_time_s"]) for h in history if "step_time_s" in h]
    return round(steps * sum(times) / len(times), 1) if times else None


def _build_sentence(card: dict[str, Any]) -> str:
    env, training = card["environment"], card["training"]
    text = f"- Built with torch {env['torch']} on {env['torch_threads']} thread(s)"
    resumed = training.get("resumed_from_step") or 0
    if resumed:
        text += (
            f", in two sessions: the build was interrupted after step {resumed} and resumed from that "
            f"checkpoint (`train_sft` restores weights, optimizer, scheduler and RNG; the data are a pure "
            f"function of the step), the last session training {training['train_wall_time_s']:.0f} s"
        )
    else:
        text += f" in {training['train_wall_time_s']:.0f} s"
    estimate = training.get("estimated_total_train_time_s")
    if estimate:
        text += (
            f"; all {training['steps']} steps about {estimate / 60:.0f} min of wall time ({training['steps']} x "
            "the mean logged step time, on a shared machine)"
        )
    return text + f"; final loss {training['final_loss']:.4f}."


def render_card(card: dict[str, Any]) -> str:
    """The human-readable model card (README.md) from the machine-readable one."""
    v = card["validation"]["sampled_t1"]
    seed = card["config"]["seed"]
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        "---",
        "# tiny-instruct",
        "",
        "The tiny profile's stand-in for the instruct model (Qwen3-4B-Instruct-2507 on the qwen3-4b profile):",
        f"a {card['parameters']:,}-parameter Qwen3ForCausalLM with its own {card['vocab_size']}-entry BPE "
        "tokenizer, trained by `npr seed build` (components/training/tiny_seed.py).",
        "Stage `seed` materialises it; nothing in the pipeline trains it further.",
        "",
        "## Recipe",
        "",
        f"- Causal SFT, {seed['steps']} steps x {seed['batch_size']} fresh samples, AdamW lr {seed['lr']} "
        f"({seed['scheduler']} to {seed['min_lr']} after {seed['warmup_steps']} warmup steps), "
        f"betas {seed['adam_betas']}, grad clip {seed['grad_clip']}, run seed {card['config']['run.seed']}.",
        f"- Data: synthetic bracket-chain problems of the `train` partition only "
        f"(difficulties {seed['difficulty_weights']}), under the parallel instruction; "
        f"{seed['parallel_fraction']:.0%} answered in the NPR schema (written as one stream, causal attention; "
        f"{seed['mistake_fraction']:.0%} of those with one format mistake), the rest sequentially.",
        "- Disjoint from every evaluation problem: test and validation problems are a partition of the problem "
        f"space by content id ({card['data']['partition']['rule']}: "
        f"{card['data']['partition']['reserved']}), never drawn for training; real benchmark problems are not "
        "synthetic problems.",
        _build_sentence(card),
        "",
        "## Validation (validation partition, one sample per problem at temperature 1.0)",
        "",
        "| | n | format-valid | accuracy | correct-and-valid | answers in the schema | accuracy (schema) "
        "| accuracy (sequential) |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def row(name: str, m: dict[str, Any]) -> str:
        def pct(x: Any) -> str:
            return "–" if x is None else f"{100 * x:.1f}%"

        return (
            f"| {name} | {m['n']} | {pct(m['format_valid'])} | {pct(m['accuracy'])} | "
            f"{pct(m['correct_and_valid'])} | {pct(m['parallel_style'])} | {pct(m['accuracy_parallel_style'])} | "
            f"{pct(m['accuracy_sequential_style'])} |"
        )

    lines.append(row("all", v))
    for level, m in v["per_difficulty"].items():
        lines.append(row(level, m))
    g = card["validation"]["greedy"]
    lines += [
        "",
        f"Greedy on the first {g['n']}: accuracy {100 * g['accuracy']:.1f}%, format-valid "
        f"{100 * g['format_valid']:.1f}%.",
        "",
        f"Files: `{CHECKSUMS_FILE}` lists every file's sha256; `{CARD_JSON}` is this card with the loss curve "
        "and the first steps' fingerprint the reproduction test replays.",
        "",
    ]
    return "\n".join(lines)


def write_checkpoint(model: Any, tokenizer: Any, out_dir: Path, card: dict[str, Any]) -> Path:
    """The model directory (weights, tokenizer, card, checksums), written atomically."""
    from components.models.loading import save_model  # lazy: transformers

    with atomic_dir(Path(out_dir)) as tmp:
        save_model(model, tokenizer, tmp)
        write_json(tmp / CARD_JSON, card)
        (tmp / CARD_FILE).write_text(render_card(card), encoding="utf-8")
        write_checksums(tmp)
    return Path(out_dir)


def build(
    job: SeedJob,
    out_dir: Path,
    work_dir: Path,
    total_steps: int | None = None,
    threads: int = 1,
    eval_n: int = CARD_EVAL_N,
) -> dict[str, Any]:
    """The whole build: fingerprint, SFT (resumable), validation metrics, checkpoint with card. Returns the card."""
    torch.set_num_threads(1)
    fingerprint = first_steps_fingerprint(job)
    torch.set_num_threads(threads)
    start = time.perf_counter()
    model, tokenizer, result = train_seed(job, Path(work_dir) / "sft", total_steps)
    log.info("trained %d steps in %.0f s", result.final_step, time.perf_counter() - start)
    card = build_card(job, model, tokenizer, result, fingerprint, threads, eval_n)
    write_checkpoint(model, tokenizer, out_dir, card)
    return card
