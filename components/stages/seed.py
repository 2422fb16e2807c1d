"""Stage `seed`: the starting model of the pipeline.

tiny profile (``models.base_model: tiny``): train the BPE tokenizer on the synthetic task's text, build the
tiny Qwen3, and run a brief causal SFT on freshly generated solutions (mostly sequential, a
``parallel_fraction`` in the NPR format, a ``mistake_fraction`` of those with a realistic format mistake),
every prompt rendered exactly as the engine renders it. The result is a weak "instruct" model: it answers,
sometimes correctly, mostly not in the parallel format. It is then measured on the held-out test split of
``sample_orz`` at ``seed.eval_temperature`` with the engine's sequential sampler and the grader:
``format_valid``, ``accuracy``, ``correct_and_valid`` go to the stage metrics.

hub profile (any other ``models.base_model``): download/load the hub model and write it, unchanged, to the
stage output (run where the hub is reachable; afterwards every stage reads the local copy).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from components.artifacts import atomic_dir
from components.config import PipelineConfig
from components.dag import StageIO

TINY = "tiny"


def run(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    if cfg.models.base_model != TINY:
        return materialise_hub_model(cfg, io)
    return build_tiny_seed(cfg, io)


def materialise_hub_model(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    """Load ``models.base_model`` (hub id or local dir) as a user would and save it as the stage output."""
    from components.models.loading import load_model, save_model

    model, tokenizer = load_model(cfg.models.base_model, cfg.models, cfg.run)
    with atomic_dir(io.output("model")) as tmp:
        save_model(model, tokenizer, tmp)
    return {
        "base_model": cfg.models.base_model,
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
    }


class SeedSource:
    """Fresh SFT examples for every step, a pure function of (seed, step): resumable and reproducible.

    Problems come from the synthetic generator (``seed.difficulty_weights``), minus the held-out ones.
    """

    def __init__(self, cfg: PipelineConfig, tokenizer: Any, held_out: set[str]) -> None:
        self.cfg, self.tokenizer, self.held_out = cfg, tokenizer, held_out
        self.skipped_held_out = 0

    def __call__(self, step: int) -> list[Any]:
        from components.data import synthetic
        from components.prompts import render_prompt
        from components.training.sft_data import encode_example

        seed_cfg = self.cfg.seed
        step_seed = self.cfg.run.seed * 1_000_003 + step
        rng = random.Random(step_seed)
        # Draw a little more than needed: held-out problems are skipped (counted, never trained on).
        pool = synthetic.generate_problems(2 * seed_cfg.batch_size, step_seed, seed_cfg.difficulty_weights)
        examples = []
        for record in pool:
            if record["id"] in self.held_out:
                self.skipped_held_out += 1
                continue
            style = "parallel" if rng.random() < seed_cfg.parallel_fraction else "sequential"
            mistake = None
            if style == "parallel" and rng.random() < seed_cfg.mistake_fraction:
                mistake = rng.choice(synthetic.MISTAKES)
            response = synthetic.render_solution(record, style, rng, mistake)
            # Every sample carries the prompt the engine and evaluation use (the parallel instruction).
            prompt = render_prompt(self.tokenizer, record["problem"], self.cfg.prompts, "parallel")
            examples.append(encode_example(self.tokenizer, prompt, response))
            if len(examples) == seed_cfg.batch_size:
                return examples
        raise RuntimeError(f"step {step}: fewer than {seed_cfg.batch_size} non-held-out problems drawn")


def tokenizer_corpus(cfg: PipelineConfig) -> list[str]:
    """Chat-rendered conversations (prompt and a solution of either style) of generated problems.

    Exactly the text the model will read (role headers and instruction included), so BPE merges the
    prompt's fixed words as well as the solutions'.
    """
    from components.data import synthetic
    from components.models.tiny import render_chat
    from components.prompts import chat_messages

    tiny = cfg.models.tiny
    rng = random.Random(cfg.run.seed)
    texts = []
    for record in synthetic.generate_problems(
        tiny.tokenizer_corpus_size, cfg.run.seed, cfg.seed.difficulty_weights
    ):
        style = "parallel" if rng.random() < 0.5 else "sequential"
        messages = chat_messages(record["problem"], cfg.prompts, "parallel")
        messages.append({"role": "assistant", "content": synthetic.render_solution(record, style, rng)})
        texts.append(render_chat(messages))
    return texts


def build_tiny_seed(cfg: PipelineConfig, io: StageIO) -> dict[str, Any]:
    from components.data.problems import load_problems
    from components.models.loading import save_model
    from components.models.tiny import build_tiny_model, train_tokenizer
    from components.training.sft import SFTSettings
    from components.training.sft_run import train_sft_in_stage_run

    if cfg.models.tiny is None:
        raise ValueError("models.base_model is 'tiny' but models.tiny (the architecture) is not set")
    test = load_problems(io.input("sample_orz/problems"), "test")
    held_out = {r["id"] for r in test}
    tokenizer = train_tokenizer(tokenizer_corpus(cfg), cfg.models.tiny.tokenizer_vocab_size, cfg.schema_name)
    model = build_tiny_model(
        cfg.models.tiny,
        tokenizer,
        cfg.run.seed,
        attn_implementation=cfg.models.attn_implementation,
        pad_vocab_to_multiple_of=cfg.models.pad_embeddings_to_multiple_of,
    )
    metrics: dict[str, Any] = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "tokenizer_vocab": len(tokenizer),
        "held_out_problems": len(held_out),
    }
    work = Path(io.output("model")).parent / "work"
    seed_cfg = cfg.seed
    if seed_cfg.enabled and seed_cfg.steps > 0:
        settings = SFTSettings(
            mode="sequential",
            total_steps=seed_cfg.steps,
            batch_size=seed_cfg.batch_size,
            lr=seed_cfg.lr,
            warmup_steps=seed_cfg.warmup_steps,
            scheduler=seed_cfg.scheduler,
            min_lr=seed_cfg.min_lr,
            weight_decay=seed_cfg.weight_decay,
            adam_betas=seed_cfg.adam_betas,
            grad_clip=seed_cfg.grad_clip,
            save_every=seed_cfg.save_every,
            seed=cfg.run.seed,
            length_splits=seed_cfg.length_splits,
        )
        source = SeedSource(cfg, tokenizer, held_out)
        result = train_sft_in_stage_run(
            cfg, io.stage, work, model, source, settings, pad_id=tokenizer.pad_token_id
        )
        metrics.update(result.summary())
        metrics["skipped_held_out_problems"] = source.skipped_held_out
        if result.wall_time_s > 0 and result.final_step > result.start_step:
            metrics["steps_per_s"] = round((result.final_step - result.start_step) / result.wall_time_s, 4)
    model.eval()
    metrics.update(evaluate_seed(model, tokenizer, test, cfg))
    with atomic_dir(io.output("model")) as tmp:
        save_model(model, tokenizer, tmp)
    return metrics


def evaluate_seed(
    model: Any, tokenizer: Any, problems: list[dict[str, Any]], cfg: PipelineConfig
) -> dict[str, Any]:
    """Sample one response per held-out problem (sequential engine) and grade it."""
    from components.engine import generate
    from components.engine.config import GenerationConfig
    from components.grading.judge import judge_many, summarize
    from components.prompts import render_prompt

    chosen = problems[: cfg.seed.eval_n]
    if not chosen:
        raise ValueError("the sample_orz test split is empty: the seed model cannot be measured")
    gen_cfg = GenerationConfig(
        mode="sequential",
        temperature=cfg.seed.eval_temperature,
        top_p=1.0,
        top_k=-1,
        max_new_tokens=cfg.seed.max_new_tokens,
        step_repetition_penalty=1.0,
        batch_size=cfg.seed.eval_batch_size,
        seed=cfg.run.seed,
    )
    prompts = [render_prompt(tokenizer, p["problem"], cfg.prompts, "parallel") for p in chosen]
    generations = generate(model, tokenizer, prompts, gen_cfg)
    judgements = judge_many(
        [g.text for g in generations],
        [p["answer"] for p in chosen],
        cfg.schema_name,
        cfg.grading,
        purpose="evaluation",
        finish_reasons=[g.finish_reason for g in generations],
    )
    summary = summarize(judgements)
    return {
        "eval_n": summary["n"],
        "format_valid": summary["format_valid"],
        "accuracy": summary["accuracy"],
        "correct_and_valid": summary["correct_and_valid"],
        "mean_format_score": summary["mean_format_score"],
        "truncated": sum(g.finish_reason == "length" for g in generations) / len(generations),
    }
