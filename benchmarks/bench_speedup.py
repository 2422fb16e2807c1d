"""Parallel vs sequential decoding of a trained parallel checkpoint, at several batch sizes, side by side.

The evaluate stage measures NPR's speedup with its speedup decode (``components.evaluation.runner.
measure_speedup``) at one batch size. This prints the same measurement at several (default 1, 8, 64, 256)
on the same prompts, so the effect of batching on a CPU is visible: at a small batch a decode step costs
about the same whatever the number of streams (per-step overhead), so a parallel trace finishes in fewer,
wider steps and the speedup approaches the ideal (total / critical-path tokens); at a large batch the CPU
is compute-bound and parallel decoding only regroups the same work.

Run after ``make run``: ``.venv/bin/python benchmarks/bench_speedup.py [--checkpoint artifacts/papo_rl/model]
[--problems 64] [--batch-sizes 1,8,64,256] [--threads 1] [--repeats N] [--max-new-tokens N]``. ``--smoke`` (benchmarks/_smoke.py):
the committed seed ``models/tiny-instruct`` unless ``--checkpoint`` names one, 4 problems at batch sizes 1 and
4, one decode per mode of up to 64 tokens (the problems still come from a run's ``--problems-dir``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import parse_args  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=ROOT / "artifacts" / "papo_rl" / "model")
    parser.add_argument("--problems-dir", type=Path, default=ROOT / "artifacts" / "sample_orz" / "problems")
    parser.add_argument("--problems", type=int, default=64)
    parser.add_argument("--batch-sizes", default="1,8,64,256")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--repeats", type=int, default=None, help="decodes per mode [evaluate.speedup.repeats]")
    parser.add_argument("--max-new-tokens", type=int, default=None, help="[evaluate.generation's]")
    args = parse_args(
        parser, None, checkpoint=ROOT / "models" / "tiny-instruct", problems=4, batch_sizes="1,4", repeats=1,
        max_new_tokens=64,
    )  # fmt: skip

    import torch

    from components.config import load_config
    from components.data.benchmarks import TINY_TEST, load_benchmark
    from components.evaluation.job import eval_job  # lazy: as measure_speedup
    from components.evaluation.runner import measure_speedup
    from components.models.loading import load_model
    from components.structure import TagIds

    torch.set_num_threads(args.threads)
    cfg = load_config(profile="tiny")
    problems = load_benchmark(TINY_TEST, cfg.evaluate.benchmark_dir, args.problems, args.problems_dir)
    model, tokenizer = load_model(args.checkpoint, cfg.models, cfg.run)
    tags = TagIds.from_tokenizer(tokenizer, cfg.schema_name)
    print(f"{args.checkpoint} on {len(problems)} tiny_test problems, {args.threads} thread(s)\n")
    print(
        "| batch | parallel tokens/s | sequential tokens/s | achieved | ideal | achieved / ideal | parallel taken |"
    )
    print("|---|---|---|---|---|---|---|")
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        run_cfg = cfg.model_copy(deep=True)
        run_cfg.evaluate.speedup.batch_size = batch
        if args.repeats is not None:
            run_cfg.evaluate.speedup.repeats = args.repeats
        if args.max_new_tokens is not None:
            run_cfg.evaluate.generation.max_new_tokens = args.max_new_tokens
        s, _, _ = measure_speedup(model, tokenizer, tags, problems, eval_job(run_cfg), "parallel")
        print(
            f"| {batch} | {s['parallel_tokens_per_s']:.0f} | {s['sequential_tokens_per_s']:.0f} | "
            f"{s['achieved_speedup']:.2f} | {s['ideal_speedup']:.2f} | {s['efficiency']:.2f} | "
            f"{100 * s['parallel_taken_rate']:.0f}% |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
