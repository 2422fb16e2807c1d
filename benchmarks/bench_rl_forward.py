"""One RL step's masked policy forward (+ backward) at batch 16: one batched call vs a per-sample loop.

The public NPR actor runs each sample alone with its own 4D mask (npr-reference.md §1.7, "too slow");
``components.training.rl_batch`` builds one ``(B, 1, L, L)`` mask with the canonical builder and runs the
batch in one call. Both are measured side by side in this run, on the tiny profile's architecture, with
parallel-format responses rendered from the synthetic task family.

    .venv/bin/python benchmarks/bench_rl_forward.py [--batch 16] [--repeats 5] [--smoke]

``--smoke`` (benchmarks/_smoke.py): batch 2, one repeat.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402
from components.config import load_config  # noqa: E402
from components.data.synthetic import expression_of, generate_problems, render_parallel  # noqa: E402
from components.models.tiny import build_tiny_model, synthetic_corpus, train_tokenizer  # noqa: E402
from components.prompts import render_prompt  # noqa: E402
from components.structure import TagIds  # noqa: E402
from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs  # noqa: E402


def rollouts(tok, cfg, n: int) -> list[Rollout]:
    rng = random.Random(0)
    out = []
    for p in generate_problems(n, seed=7):
        prompt = render_prompt(tok, p["problem"], cfg.prompts, "parallel")
        text = render_parallel(expression_of(p), rng)
        out.append(
            Rollout(
                group_id=p["id"],
                problem_id=p["id"],
                answer=p["answer"],
                prompt_ids=tok.encode(prompt, add_special_tokens=False),
                response_ids=tok.encode(text, add_special_tokens=False) + [tok.eos_token_id],
                text=text,
                finish_reason="stop",
                parallel_taken=True,
            )
        )
    return out


def step(model, batches, tags, pad_id) -> float:
    start = time.perf_counter()
    for group in batches:
        batch = build_policy_batch(group, pad_id, tags)
        log_prob, _ = response_log_probs(model, batch)
        (-(log_prob.sum()) / batch.response_mask.sum()).backward()
    model.zero_grad(set_to_none=True)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    args = parse_args(parser, None, batch=2, repeats=1)
    torch.set_num_threads(args.threads)
    cfg = load_config(profile="tiny")
    arch = cfg.models.tiny
    tok = train_tokenizer(synthetic_corpus(2000, 0), arch.tokenizer_vocab_size, cfg.schema_name)
    model = build_tiny_model(arch, tok, seed=0)
    model.train()
    tags = TagIds.from_tokenizer(tok, cfg.schema_name)
    data = rollouts(tok, cfg, args.batch)
    lengths = [len(r.prompt_ids) + len(r.response_ids) for r in data]
    print(
        f"model {sum(p.numel() for p in model.parameters()) / 1e6:.2f}M params, batch {args.batch}, "
        f"sequence length {min(lengths)}-{max(lengths)}, threads {args.threads}"
    )
    step(model, [data], tags, tok.pad_token_id)  # warm-up
    batched = min(step(model, [data], tags, tok.pad_token_id) for _ in range(args.repeats))
    looped = min(step(model, [[r] for r in data], tags, tok.pad_token_id) for _ in range(args.repeats))
    print(f"batched (one call, 4D mask [B,1,L,L]): {batched * 1e3:8.1f} ms")
    print(f"per-sample loop ({args.batch} calls):      {looped * 1e3:8.1f} ms")
    print(f"speedup: {looped / batched:.2f}x (target >= 3x)")


if __name__ == "__main__":
    main()
