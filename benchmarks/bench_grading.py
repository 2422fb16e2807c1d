"""Answer grading: agreement with the public graders next to plain math-verify, and throughput.

Three parts, each printed side by side in one run:

1. **corpus** (``tests/data/grading``, see ``components/grading/corpus.py``): our verdicts and plain
   math-verify's (``verify(parse(gold), parse(pred))``, default settings, this process's main thread) on the
   same cases, per split (tuning, held-out, blind) and kind (bare answers, whole responses), counted on the cases
   whose verdict is not one library's option;
2. **throughput**: N (default 65,536) (response, gold) pairs built from the real answers of every benchmark
   in shared/data (responses that box the gold itself, reformatted versions of it and wrong versions,
   sampled with repetition as RL groups repeat answers), graded the way the evaluate stage grades
   (``extract_final`` with the ``evaluation`` settings, then ``grade_many``: fast path, then the math-verify
   pool at ``--workers``), caches cold, pool already warm (its spin-up is printed separately); next to
   sequential plain math-verify on a sample of the same pairs (``--sequential``, default 600), projected to N.
   Target: 65,536 pairs in <= 180 s on 2 cores; because a shared machine's wall time depends on its other
   load, the idle-core time from CPU time (parent + pool workers) is printed too;
3. ``--regrade DIR``: re-grade an evaluate stage's per-sample records (``artifacts/evaluate/records``) with
   the current rules and print each checkpoint's accuracy as recorded and as re-graded, with the reasons
   verdicts changed (truncated, no explicit answer, an equivalence rule).

Run: ``.venv/bin/python benchmarks/bench_grading.py [--pairs 65536] [--workers 2] [--sequential 600]
[--skip-corpus] [--skip-throughput] [--regrade artifacts/evaluate/records] [--corpus-cases N] [--smoke]``;
``--smoke`` (benchmarks/_smoke.py): the first 12 answers and 12 responses of each corpus split, 256 pairs,
16 sequential, one worker.
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
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402

TARGET_PAIRS = 65_536
TARGET_SECONDS = 180.0
DATA = Path(__file__).resolve().parents[2] / "shared" / "data" / "benchmarks"
_SINGLE_FRAC = re.compile(r"^(-?)\\frac\{([^{}]+)\}\{([^{}]+)\}$")
_INT_ROOT = re.compile(r"^(\d+)\\sqrt\{(\d+)\}$")


# ----------------------------------------------------------------------------------------- corpus
def corpus_section(workers: int, limit: int | None = None) -> None:
    from components.grading.config import GradingConfig
    from components.grading.corpus import SPLITS, agreement, load_cases, math_verify_verdicts, our_verdicts

    cfg = GradingConfig(workers=workers, timeout_s=30.0)
    print("== corpus: agreement with the expected verdicts (cases without a library option) ==")
    print(
        f"{'split':8} {'kind':9} {'n':>4} {'ours':>14} {'plain math-verify':>18}   flagged (ours / math-verify)"
    )
    for split in SPLITS:  # every corpus split (components.grading.corpus.SPLITS)
        cases = load_cases(split)
        if limit is not None:  # the first ``limit`` of each kind, so that every row has cases
            cases = [c for kind in ("answer", "response") for c in [c for c in cases if c.kind == kind][:limit]]
        start = time.perf_counter()
        ours = agreement(cases, our_verdicts(cases, cfg))
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        plain = agreement(cases, math_verify_verdicts(cases))
        plain_s = time.perf_counter() - start
        for key, kind in (
            ("counted_answer", "answers"),
            ("counted_response", "responses"),
            ("counted", "all"),
        ):
            o, p = ours[key], plain[key]
            flagged = f"{ours['flagged']['agree']}/{ours['flagged']['n']} / {plain['flagged']['agree']}/{plain['flagged']['n']}"
            print(
                f"{split:8} {kind:9} {o['n']:>4} {o['agree']:>5} = {o['rate']:6.1%} {p['agree']:>8} = {p['rate']:6.1%}"
                f"   {flagged if kind == 'all' else ''}"
            )
        print(f"{split:8} time: ours {ours_s:.1f} s (pool of {workers}), plain math-verify {plain_s:.1f} s")
        if ours["misses"]:
            print(f"{split:8} our misses: {', '.join(ours['misses'])}")


# ----------------------------------------------------------------------------------------- throughput
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

    same = [gold, f"${gold}$", gold.replace("\\frac", "\\dfrac")]
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
    else:
        same.append(" ".join(gold.replace(",", ", ").split()))
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


def throughput_section(n_pairs: int, workers: int, n_sequential: int, seed: int) -> None:
    from components.grading.answers import extract_final
    from components.grading.config import GradingConfig
    from components.grading.equivalence import clear_caches, grade_many_verdicts
    from components.grading.verify_pool import get_pool, shutdown_pool

    if not DATA.exists():
        sys.exit(f"benchmark answers not found at {DATA}")
    pairs = build_pairs(n_pairs, seed)
    cfg = GradingConfig(workers=workers)
    extraction = cfg.extraction.evaluation

    start = time.perf_counter()
    pool = get_pool(cfg.workers, cfg.pool_start_timeout_s)
    pool.warm()
    spin_up = time.perf_counter() - start
    pairs_before = pool.stats.pairs

    clear_caches()
    start, cpu_start = time.perf_counter(), time.process_time()
    preds = [extract_final(response, extraction, "stop").answer for response, _ in pairs]
    verdicts = grade_many_verdicts(list(zip(preds, (g for _, g in pairs), strict=True)), cfg)
    batch_s, parent_cpu = time.perf_counter() - start, time.process_time() - cpu_start
    methods = Counter(v.method for v in verdicts)
    pool_pairs = pool.stats.pairs - pairs_before
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    shutdown_pool()  # joins the workers, so their CPU time is now in RUSAGE_CHILDREN
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    worker_cpu = usage.ru_utime + usage.ru_stime - before.ru_utime - before.ru_stime  # incl. start-up

    sample = random.Random(seed + 1).sample(pairs, min(n_sequential, len(pairs)))
    cpu_start = time.process_time()
    sequential_s = sequential_math_verify(sample)
    sequential_cpu = time.process_time() - cpu_start

    batch_rate = len(pairs) / batch_s
    sequential_rate = len(sample) / sequential_s
    fast = sum(count for method, count in methods.items() if method not in ("math_verify", "failed"))
    print("== throughput ==")
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


# ----------------------------------------------------------------------------------------- regrade
def regrade_section(records_dir: Path, workers: int) -> None:
    """Each checkpoint's evaluate accuracy as recorded and re-graded with the current rules."""
    from components.artifacts import read_jsonl
    from components.evaluation.metrics import avg_at_n, group_by_problem
    from components.grading.config import GradingConfig
    from components.grading.judge import judge_many

    paths = sorted(p for p in Path(records_dir).glob("*/*.jsonl") if ".sequential-" not in p.name)
    if not paths:
        sys.exit(f"no evaluate records (<checkpoint>/<benchmark>-NNNNN.jsonl) under {records_dir}")
    records = [rec for path in paths for rec in read_jsonl(path)]
    cfg = GradingConfig(workers=workers)
    judgements = judge_many(
        [r["response"] for r in records],
        [r["answers"] for r in records],
        "npr",
        cfg,
        purpose="evaluation",
        finish_reasons=[r.get("finish_reason") for r in records],
    )
    reasons: Counter[str] = Counter()
    by_ckpt: dict[str, dict[str, list[dict[str, Any]]]] = defaultdict(lambda: defaultdict(list))
    for rec, j in zip(records, judgements, strict=True):
        new = dict(rec, correct=j.correct)
        by_ckpt[rec["checkpoint"]][rec["benchmark"]].append((rec, new))
        if bool(rec["correct"]) != j.correct:
            why = (
                "truncated"
                if j.truncated
                else "no explicit answer"
                if j.pred is None
                else "equivalence rules"
            )
            reasons[f"{'lost' if rec['correct'] else 'gained'} credit: {why}"] += 1
    print(
        f"== regrade: {len(records)} records under {records_dir} (evaluation extraction, finish reasons) =="
    )
    print(
        f"{'checkpoint':20} {'recorded':>9} {'re-graded':>10} {'change':>8}   per benchmark (recorded -> re-graded)"
    )
    for ckpt, benches in by_ckpt.items():
        old_acc = {
            b: avg_at_n(group_by_problem([o for o, _ in rows], "correct")) for b, rows in benches.items()
        }
        new_acc = {
            b: avg_at_n(group_by_problem([n for _, n in rows], "correct")) for b, rows in benches.items()
        }
        old_avg = sum(old_acc.values()) / len(old_acc)
        new_avg = sum(new_acc.values()) / len(new_acc)
        changed = ", ".join(
            f"{b} {old_acc[b]:.3f}->{new_acc[b]:.3f}" for b in benches if abs(old_acc[b] - new_acc[b]) > 1e-12
        )
        print(
            f"{ckpt:20} {old_avg:9.4f} {new_avg:10.4f} {new_avg - old_avg:+8.4f}   {changed or 'unchanged'}"
        )
    print("verdicts changed:", dict(reasons) or "none")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, default=TARGET_PAIRS)
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument(
        "--sequential", type=int, default=600, help="pairs for the plain math-verify baseline"
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--skip-corpus", action="store_true")
    parser.add_argument("--skip-throughput", action="store_true")
    parser.add_argument("--regrade", type=Path, default=None, help="an evaluate stage's records directory")
    parser.add_argument(
        "--corpus-cases", type=int, default=None, help="the first N answers and N responses of each split [all]"
    )
    args = parse_args(parser, None, pairs=256, sequential=16, workers=1, corpus_cases=12)

    if args.regrade is not None:
        regrade_section(args.regrade, args.workers)
    if not args.skip_corpus:
        corpus_section(args.workers, args.corpus_cases)
    if not args.skip_throughput:
        throughput_section(args.pairs, args.workers, args.sequential, args.seed)


if __name__ == "__main__":  # required: the spawn-context pool re-imports __main__ in every worker
    main()
