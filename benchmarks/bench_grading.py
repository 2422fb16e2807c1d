"""Answer grading throughput: the batch path (fast path + math-verify pool) next to plain math-verify.

Builds N (default 65,536) (response, gold) pairs from the real answers of every benchmark in
shared/data: responses that box the gold itself, reformatted versions of it (``$..$``, ``\\dfrac``,
spacing, ``a/b``, decimals, ``\\text{}`` units, ``(a)/(b)``, ``\\sqrt{a^2 b}``) and wrong versions (the
number + 1, a foreign gold), sampled with repetition as RL groups repeat answers. Then, in one run:

1. batch path: ``extract_answer`` + ``grade_many`` with the pool at ``--workers`` (default: all cores),
   caches cold, pool already warm (its spin-up is printed separately);
2. sequential math-verify: ``parse`` + ``verify`` in this process's main thread, no fast path, on a
   random sample of the same pairs (``--sequential``, default 600), projected to N.

Prints pairs/second, the fast-path share, the projected time for 65,536 pairs (target <= 180 s on 2 cores)
and the speed ratio batch / sequential, in wall time and, because a shared machine's wall time depends on
its other load, from CPU time (parent + pool workers) as the time on idle cores.

Run: ``.venv/bin/python benchmarks/bench_grading.py [--pairs 65536] [--workers 2] [--sequential 600]``.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import resource
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

TARGET_PAIRS = 65_536
TARGET_SECONDS = 180.0
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"
_SINGLE_FRAC = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_INT_ROOT = re.compile(r"^(\d+)\\sqrt\{(\d+)\}$")


def load_golds(root: Path) -> list[Any]:
    from components.grading.answers import extract_answer

    golds: list[Any] = []
    for path in sorted(root.rglob("*.json*")):
        text = path.read_text(encoding="utf-8")
        records = (
            [json.loads(x) for x in text.splitlines() if x.strip()]
            if path.suffix == ".jsonl"
            else json.loads(text)
        )
        for record in records:
            gold = record.get("answer", record.get("final_answer"))
            golds.append(gold if gold is not None else extract_answer(record["solution"], []))
    return golds


def variants(gold: str, foreign: str) -> list[str]:
    """Same-answer rewrites of ``gold``, then wrong answers."""
    from components.grading.normalize import normalize_answer, read_number

    same = [gold, f"${gold}$", gold.replace("\\frac", "\\dfrac"), " ".join(gold.replace(",", ", ").split())]
    wrong = [foreign]
    value = read_number(normalize_answer(gold))
    if value is not None:
        same.append(f"{value.numerator}/{value.denominator}" if value.denominator != 1 else f"{value}.0")
        if value.denominator != 1 and (value * 10**6).denominator == 1:
            same.append(str(float(value)))
        same.append(f"{gold}\\text{{ units}}")
        plus_one = value + 1
        wrong.append(
            str(plus_one.numerator)
            if plus_one.denominator == 1
            else f"{plus_one.numerator}/{plus_one.denominator}"
        )
    if m := _SINGLE_FRAC.match(gold):
        same.append(f"{m.group(1)}({m.group(2)})/({m.group(3)})")
    if m := _INT_ROOT.match(gold):
        same.append(f"\\sqrt{{{int(m.group(1)) ** 2 * int(m.group(2))}}}")
    return same + wrong


def build_pairs(n: int, seed: int) -> list[tuple[str, Any]]:
    from components.grading.normalize import gold_candidates

    rng = random.Random(seed)
    golds = load_golds(DATA)
    pool: list[tuple[str, Any]] = []
    for gold in golds:
        candidate = gold_candidates(gold)[0]
        foreign = gold_candidates(rng.choice(golds))[0]
        for answer in variants(candidate, foreign):
            pool.append(
                (f"Working through the cases gives the result.\n\nThe answer is $\\boxed{{{answer}}}$.", gold)
            )
    return [rng.choice(pool) for _ in range(n)]


def sequential_math_verify(pairs: list[tuple[str, Any]]) -> float:
    """Seconds for plain math-verify on ``pairs`` in this (main) thread: the baseline without our paths."""
    from math_verify import parse, verify

    from components.grading.normalize import gold_candidates

    start = time.perf_counter()
    for response, gold in pairs:
        predicted = parse(response)
        any(verify(parse("\\boxed{" + g + "}"), predicted) for g in gold_candidates(gold))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=TARGET_PAIRS)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--sequential", type=int, default=600, help="pairs for the plain math-verify baseline"
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    from components.grading.answers import extract_answer
    from components.grading.config import GradingConfig
    from components.grading.equivalence import clear_caches, grade_many_verdicts
    from components.grading.verify_pool import get_pool, shutdown_pool

    if not DATA.exists():
        sys.exit(f"benchmark answers not found at {DATA}")
    pairs = build_pairs(args.pairs, args.seed)
    cfg = GradingConfig(workers=args.workers)

    start = time.perf_counter()
    pool = get_pool(cfg.workers, cfg.pool_start_timeout_s)
    pool.warm()
    spin_up = time.perf_counter() - start

    clear_caches()
    start, cpu_start = time.perf_counter(), time.process_time()
    preds = [extract_answer(response, cfg.fallbacks) for response, _ in pairs]
    verdicts = grade_many_verdicts(list(zip(preds, (g for _, g in pairs), strict=True)), cfg)
    batch_s, parent_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    methods = Counter(v.method for v in verdicts)
    pool_pairs = pool.stats.pairs
    shutdown_pool()  # joins the workers, so their CPU time is now in RUSAGE_CHILDREN
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = usage.ru_utime + usage.ru_stime  # includes each worker's start-up import

    sample = random.Random(args.seed + 1).sample(pairs, min(args.sequential, len(pairs)))
    cpu_start = time.process_time()
    sequential_s = sequential_math_verify(sample)
    sequential_cpu = time.process_time() - cpu_start

    batch_rate = len(pairs) / batch_s
    sequential_rate = len(sample) / sequential_s
    fast = sum(count for method, count in methods.items() if method not in ("math_verify", "failed"))
    print(
        f"pairs: {len(pairs):,} built from {len(load_golds(DATA)):,} benchmark answers; workers: {cfg.workers}"
    )
    print(f"pool spin-up (once per process): {spin_up:.1f} s")
    print(
        f"batch path: {batch_s:.1f} s = {batch_rate:,.0f} pairs/s; "
        f"projected {TARGET_PAIRS:,} pairs: {TARGET_PAIRS / batch_rate:.1f} s (target <= {TARGET_SECONDS:.0f} s)"
    )
    print(
        f"  fast-path share: {fast / len(pairs):.1%} ({dict(methods)}); "
        f"unique pairs sent to math-verify: {pool_pairs:,}; equal: {sum(v.equal for v in verdicts) / len(pairs):.1%}"
    )
    print(
        f"sequential math-verify (main thread, no fast path): {len(sample)} pairs in {sequential_s:.1f} s = "
        f"{sequential_rate:,.0f} pairs/s; projected {TARGET_PAIRS:,}: {TARGET_PAIRS / sequential_rate:.0f} s"
    )
    print(f"ratio batch / sequential (wall): {batch_rate / sequential_rate:.1f}x")
    # Wall time depends on what else the machine runs; CPU time does not. On idle cores the parent's
    # fast path runs first, then the workers share the math-verify work.
    idle_batch = parent_cpu + worker_cpu / cfg.workers
    idle_sequential = sequential_cpu / len(sample) * len(pairs)
    print(
        f"CPU time: parent {parent_cpu:.1f} s + workers {worker_cpu:.1f} s; on {cfg.workers} idle cores "
        f"{len(pairs):,} pairs would take ~{idle_batch:.0f} s vs ~{idle_sequential:.0f} s sequential "
        f"(ratio {idle_sequential / idle_batch:.1f}x); load average now {os.getloadavg()[0]:.1f} on "
        f"{os.cpu_count()} cores"
    )


if __name__ == "__main__":  # required: the spawn-context pool re-imports __main__ in every worker
    main()
