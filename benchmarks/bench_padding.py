"""Length-sorted micro-batches vs one padded batch, measured side by side in one run (same gradient).

1. SFT: one tiny-profile seed step (32 examples from the seed stage's own step source), forward + backward +
   AdamW, as one padded batch vs the same examples in 2 and 4 length-sorted passes (``length_splits``).
2. RL: one local-trainer update (``RLTrainer._update``, 16 groups x 8) as one padded batch vs
   length-sorted micro-batches of 32 (``micro_batch_size``): DAPO on causal rows (NPR-Zero, SR) and PAPO on
   the parallel layout (4D masks). The rollouts are rendered solutions of the synthetic tasks (DAPO:
   sequential and parallel text, one in 64 run out to the stage's token budget, ``max_new_tokens``, as real
   rollouts do, ``response_length/clip_ratio`` ~1%, so the longest row sets the padded width; PAPO: whole
   parallel traces, which the budget holds: a truncated one is malformed and the trainer filters it out
   before the update).

Timings are medians over interleaved repeats, so machine load hits every variant alike.

The model is the tiny profile's architecture, random init, with its tokenizer (the committed seed's,
``models/tiny-instruct``: the one ``train_tokenizer(tokenizer_corpus(cfg))`` builds, read instead of retrained).

    .venv/bin/python benchmarks/bench_padding.py [--repeats 7] [--threads 2] [--smoke]

``--smoke`` (benchmarks/_smoke.py): one thread, one timed repeat after the warm-up, 8 examples of the seed
step, and RL updates of 2 groups x 4 rollouts against micro-batches of 4.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._smoke import parse_args  # noqa: E402
from components.config import load_config, rl_stages  # noqa: E402
from components.data import synthetic  # noqa: E402
from components.models.loading import load_tokenizer  # noqa: E402
from components.models.tiny import build_tiny_model  # noqa: E402
from components.prompts import render_prompt  # noqa: E402
from components.training.job import rl_job  # noqa: E402
from components.training.rl import RLTrainer  # noqa: E402
from components.training.rl_batch import Rollout  # noqa: E402
from components.training.seed_job import seed_job  # noqa: E402
from components.training.sft import SFTSettings, _train_step, build_optimizer, build_scheduler  # noqa: E402
from components.training.tiny_seed import SeedSource  # noqa: E402


def padding(lengths_per_batch: list[list[int]]) -> float:
    padded = sum(max(b) * len(b) for b in lengths_per_batch)
    return 1 - sum(sum(b) for b in lengths_per_batch) / padded


def sft_steps(cfg, tok, repeats: int, examples: int | None = None) -> None:
    model = build_tiny_model(
        cfg.models.tiny, tok, 0, pad_vocab_to_multiple_of=cfg.models.pad_embeddings_to_multiple_of
    )
    model.train()
    source = SeedSource(seed_job(None, cfg), tok)
    steps = [source(k)[:examples] for k in range(repeats + 1)]
    times: dict[int, list[float]] = {1: [], 2: [], 4: []}
    optimizers = {}
    for splits in times:
        s = SFTSettings(
            mode="sequential", total_steps=10**6, batch_size=len(steps[0]), lr=1e-4, length_splits=splits
        )
        opt = build_optimizer(model, s)
        optimizers[splits] = (s, opt, build_scheduler(opt, s))
    for k, examples in enumerate(steps):
        for splits, (s, opt, sched) in optimizers.items():
            t0 = time.perf_counter()
            record = _train_step(model, opt, sched, examples, s, tok.pad_token_id, None)
            if k:  # the first round warms up
                times[splits].append(time.perf_counter() - t0)
            if k == 1:
                print(
                    f"  splits {splits}: padding {1 - record['tokens'] / record['padded_tokens']:.1%}", end=""
                )
        if k == 1:
            print()
    base = statistics.median(times[1])
    print(f"SFT seed step, {len(steps[0])} examples, median of {repeats}:")
    for splits, ts in times.items():
        print(
            f"  {splits} pass(es): {statistics.median(ts) * 1e3:7.1f} ms   vs one batch {statistics.median(ts) / base:.3f}x"
        )


def rollouts(
    cfg, tok, n_groups: int, group: int, budget: int, parallel_only: bool = False
) -> list[list[Rollout]]:
    rng = random.Random(0)
    problems = synthetic.generate_problems(n_groups, 11, None)
    out = []
    for g, p in enumerate(problems):
        prompt_ids = tok.encode(
            render_prompt(tok, p["problem"], cfg.prompts, "parallel"), add_special_tokens=False
        )
        rows = []
        for j in range(group):
            style = "parallel" if parallel_only else rng.choice(["sequential", "parallel"])
            text = synthetic.render_solution(p, style, rng)
            ids = tok.encode(text, add_special_tokens=False) + [tok.eos_token_id]
            if not parallel_only and (g * group + j) % 64 == 5:  # rambling, run out to the budget
                ids = (ids * 4)[:budget]
            rows.append(
                Rollout(
                    group_id=f"g{g}",
                    problem_id=p["id"],
                    answer=p["answer"],
                    prompt_ids=prompt_ids,
                    response_ids=ids[:budget],
                    text=text,
                    finish_reason="stop",
                    parallel_taken=False,
                    reward=float(rng.choice([-1.0, 1.0])),
                )
            )
        out.append(rows)
    return out


def rl_updates(cfg, tok, repeats: int, stage: str, n_groups: int = 16, group: int = 8, micro: int = 32) -> None:
    budget = getattr(cfg, stage).max_new_tokens
    groups = rollouts(cfg, tok, n_groups, group, budget, parallel_only=stage == "papo_rl")
    lengths = [len(r.prompt_ids) + len(r.response_ids) for g in groups for r in g]
    problems = synthetic.generate_problems(4, 1, None)
    trainers = {}
    for size in (None, micro):
        c = load_config(
            profile="tiny", overrides=[f"{stage}.micro_batch_size={size or 'null'}", f"{stage}.lr=1e-7"]
        )
        model = build_tiny_model(
            cfg.models.tiny, tok, 0, pad_vocab_to_multiple_of=cfg.models.pad_embeddings_to_multiple_of
        )
        trainers[size] = RLTrainer(
            rl_job(stage, c), model, tok, problems, problems, Path("/tmp/npr-bench-padding") / str(size)
        )
    times: dict[int | None, list[float]] = {m: [] for m in trainers}
    for k in range(repeats + 1):
        for size, trainer in trainers.items():
            t0 = time.perf_counter()
            trainer._update(groups, Counter())
            if k:
                times[size].append(time.perf_counter() - t0)
    ordered = sorted(lengths)
    chunks = [ordered[i : i + micro] for i in range(0, len(ordered), micro)]
    layout = "parallel layout" if stage == "papo_rl" else "causal rows"
    print(
        f"RL update ({stage}, {layout}), {len(lengths)} rollouts of {min(lengths)}-{max(lengths)} tokens, "
        f"median of {repeats}:"
    )
    print(f"  padding: one batch {padding([lengths]):.1%}, {len(chunks)} sorted micro-batches {padding(chunks):.1%}")
    one, split = statistics.median(times[None]), statistics.median(times[micro])
    print(
        f"  one batch {one * 1e3:7.1f} ms   micro-batches of {micro} {split * 1e3:7.1f} ms   "
        f"ratio {split / one:.3f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sft-examples", type=int, default=None, help="examples of the seed step [all 32]")
    parser.add_argument("--groups", type=int, default=16, help="RL groups per update")
    parser.add_argument("--group-size", type=int, default=8, help="rollouts per RL group")
    parser.add_argument("--micro-batch", type=int, default=32, help="RL micro-batch size")
    args = parse_args(
        parser, None, repeats=1, threads=1, sft_examples=8, groups=2, group_size=4, micro_batch=4
    )
    torch.set_num_threads(args.threads)
    cfg = load_config(profile="tiny")
    tok = load_tokenizer(REPO / "models" / "tiny-instruct")
    sft_steps(cfg, tok, args.repeats, args.sft_examples)
    # one RL stage per rollout layout (causal DAPO rows: NPR-Zero; parallel PAPO rows: PAPO), the first of each
    one_per_mode: dict[str, str] = {}
    for stage in rl_stages():
        one_per_mode.setdefault(getattr(cfg, stage).engine_mode, stage)
    for stage in one_per_mode.values():
        rl_updates(cfg, tok, args.repeats, stage, args.groups, args.group_size, args.micro_batch)


if __name__ == "__main__":
    main()
