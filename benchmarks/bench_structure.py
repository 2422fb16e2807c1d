"""Structure module costs, measured side by side in one run and printed as ratios.

1. Format scorer on 1 MB of adversarial text (tag floods, unbalanced nesting, a lone '<' flood) next to
   1 MB of benign text (valid NPR blocks): linear time means the ratio stays near 1, not ~10^5.
2. Mask building for a canonical NPR trace of 4k and 16k tokens, three ways: the O(L) segment form
   (``parallel_segments``), the dense bool L x L (``parallel_attention_inputs``) and a dense float32
   additive L x L (what the reference collator materialises). Each measurement runs in a fresh
   subprocess so its peak RSS is its own; tracemalloc adds the Python/numpy-side peak.

Run: ``.venv/bin/python benchmarks/bench_structure.py [--sizes 4096 16384] [--repeats 3] [--scorer-bytes N]``;
``--smoke`` (benchmarks/_smoke.py): 20 kB texts, one 1024-token trace, one repeat.
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402

MB = 1_000_000


def _benign_text(size: int) -> str:
    block = (
        "<guideline><plan>1: add the numbers directly</plan><plan>2: check by counting up</plan></guideline>"
        "<step>1: 17 + 25 = 42, carrying the one</step><step>2: counting 25 up from 17 reaches 42</step>"
        "<takeaway>both routes give 42, so the sum is 42</takeaway>\n"
    )
    answer = " so the answer is \\boxed{42}"
    body = block * ((size - len(answer)) // len(block))
    return body + " " * (size - len(body) - len(answer)) + answer


def _adversarial_texts(size: int) -> dict[str, str]:
    def fill(unit: str) -> str:
        return unit * (size // len(unit))

    return {
        "open-tag flood <guideline><plan>": fill("<guideline><plan>"),
        "unbalanced nesting <step><guideline>": fill("<step><guideline><plan>1: x"),
        "near-miss '<guidelin' prefixes": fill("<guidelin<pla<ste"),
        "lone '<' flood": fill("<"),
        "stray closing tags </step>": fill("</step>"),
    }


def _best_time(fn, repeats: int) -> float:  # noqa: ANN001
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def bench_scorer(repeats: int, size: int = MB) -> None:
    from components.structure import format_score

    benign = _benign_text(size)
    assert format_score(benign) == 0.0
    base = _best_time(lambda: format_score(benign), repeats)
    print(f"format_score on {size / MB:g} MB (best of {repeats})")
    print(f"  {'benign: valid NPR blocks':40s} {base * 1e3:8.1f} ms   1.00x")
    for name, text in _adversarial_texts(size).items():
        t = _best_time(lambda text=text: format_score(text), repeats)
        print(f"  {name:40s} {t * 1e3:8.1f} ms   {t / base:.2f}x benign   score {format_score(text):+.1f}")


def canonical_ids(length: int) -> tuple[list[int], object]:
    """A canonical-layout NPR trace of exactly ``length`` tokens: blocks of 4 steps, plus a tail."""
    from components.structure import NPR, TagIds

    tags = TagIds(NPR, {t: 1000 + i for i, t in enumerate(NPR.tags)})
    t = tags.ids
    ids: list[int] = [7] * 64  # prompt
    step_lengths = [40, 90, 60, 120]
    while True:
        block = [t["<guideline>"]]
        for _ in step_lengths:
            block += [t["<plan>"], *([5] * 12), t["</plan>"]]
        block.append(t["</guideline>"])
        for n in step_lengths:
            block += [t["<step>"], *([3] * n), t["</step>"]]
        block += [t["<takeaway>"], *([4] * 30), t["</takeaway>"], *([9] * 20)]
        if len(ids) + len(block) > length:
            break
        ids += block
    ids += [8] * (length - len(ids))
    return ids, tags


def worker(method: str, length: int, repeats: int) -> dict[str, float]:
    """One measurement in this (fresh) process: best time, peak RSS increase, tracemalloc peak."""
    import torch

    from components.structure import parallel_attention_inputs, parallel_segments, to_additive_mask

    torch.set_num_threads(1)
    ids, tags = canonical_ids(length)
    parallel_segments(canonical_ids(1024)[0], tags)  # warm imports and caches outside the measurement

    def run() -> object:
        if method == "segments":
            segs = parallel_segments(ids, tags)
            return segs
        mask, pos = parallel_attention_inputs(ids, tags)
        if method == "float32-dense":
            return to_additive_mask(mask, torch.float32)
        return mask

    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    tracemalloc.start()
    result = run()
    _, py_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    rss_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if method == "segments":
        held = sum(
            x.numel() * x.element_size() for x in (result.position_ids, result.block_ids, result.step_ids)
        )
    else:
        held = result.numel() * result.element_size()
    del result
    seconds = _best_time(run, repeats)
    return {
        "seconds": seconds,
        "rss_peak_delta": max(0, rss_peak - rss_before),
        "py_peak": py_peak,
        "held": held,
    }


def bench_masks(sizes: list[int], repeats: int) -> None:
    methods = ["segments", "bool-dense", "float32-dense"]
    print(
        "\nmask + positions for a canonical NPR trace (fresh process per cell; best time of "
        f"{repeats}; peak = RSS increase, py = tracemalloc peak, held = result bytes)"
    )
    for length in sizes:
        rows = {}
        for method in methods:
            out = subprocess.run(
                [sys.executable, __file__, "--worker", method, str(length), "--repeats", str(repeats)],
                capture_output=True,
                text=True,
                check=True,
            )
            rows[method] = json.loads(out.stdout.strip().splitlines()[-1])
        base = rows["segments"]
        print(f"  L = {length}")
        for method in methods:
            r = rows[method]
            print(
                f"    {method:14s} {r['seconds'] * 1e3:8.1f} ms ({r['seconds'] / base['seconds']:6.1f}x)   "
                f"peak {r['rss_peak_delta'] / 2**20:8.1f} MiB   py {r['py_peak'] / 2**20:6.1f} MiB   "
                f"held {r['held'] / 2**20:8.2f} MiB ({r['held'] / base['held']:8.0f}x segments)"
            )
        ratio = rows["float32-dense"]["held"] / rows["bool-dense"]["held"]
        print(f"    float32 dense / bool dense held: {ratio:.1f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4096, 16384])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--scorer-bytes", type=int, default=MB, help="size of each format-scorer text")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "LENGTH"))
    args = parse_args(parser, None, sizes=[1024], repeats=1, scorer_bytes=20_000)
    if args.worker:
        print(json.dumps(worker(args.worker[0], int(args.worker[1]), args.repeats)))
        return
    bench_scorer(args.repeats, args.scorer_bytes)
    bench_masks(args.sizes, args.repeats)


if __name__ == "__main__":
    main()
