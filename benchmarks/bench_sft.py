"""SFT cost of parallel training, measured side by side in one run.

1. Step time: a parallel SFT step (4D bool mask + parallel positions, sdpa) vs a causal SFT step on the
   same token ids, same model, same batch; forward + backward (no optimizer step, so every timed step
   sees the same weights). Target ratio <= 1.25x.
2. Compute precision (``run.autocast``): the same parallel and causal steps with bf16 autocast over the fp32
   weights vs fp32 throughout, and the relative difference of the step's loss.
3. Memory of the attention inputs of one L-token trace (L = 4k, 16k), each built in a fresh subprocess
   (resident-set growth while the result is held, and the tensors' own bytes): the O(L) segment form, the
   dense bool mask the trainer uses, and the dense float additive mask a naive implementation (NPR's
   collator) would hold. The bool mask is built in row chunks, so its transient peak is the mask itself.

Usage: .venv/bin/python benchmarks/bench_sft.py [--repeats 5] [--batch 16] [--threads 2] [--lengths 4096 16384]
[--smoke]; ``--smoke`` (benchmarks/_smoke.py): batch 2, one repeat, one thread, one 512-token trace.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._smoke import parse_args  # noqa: E402

MEMORY_CHILD = r"""
import json, resource, sys
import torch
from components.structure import TagIds, parallel_segments, to_additive_mask
from components.structure import get_schema
length, form = int(sys.argv[1]), sys.argv[2]
schema = get_schema("npr")
tags = TagIds(schema=schema, ids={t: i for i, t in enumerate(schema.tags, start=1)})
g, gc, p, pc, s, sc, t, tc = (tags.ids[x] for x in schema.tags)
FILL = 100
ids = [FILL] * 16
while True:
    block = [g, p, FILL, pc, p, FILL, pc, gc] + [s] + [FILL] * 40 + [sc] + [s] + [FILL] * 40 + [sc] + [t, FILL, tc]
    if len(ids) + len(block) + 4 > length:
        break
    ids += block
ids += [FILL] * (length - len(ids))
ids_t = torch.tensor(ids)
def resident_mib():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20
before = resident_mib()
segs = parallel_segments(ids_t, tags, start=16)
held = [segs.position_ids, segs.block_ids, segs.step_ids]
if form in ("bool", "float"):
    held = [segs.dense_mask()]
if form == "float":
    held = [to_additive_mask(held[0], torch.float32)]
grown = resident_mib() - before
tensor_mib = sum(t.numel() * t.element_size() for t in held) / 2**20
print(json.dumps({"resident_mib": grown, "tensor_mib": tensor_mib}))
"""


def step_time_ratio(repeats: int, batch: int) -> dict[str, float]:
    from components.data import synthetic
    from components.models.config import TinyArchitecture
    from components.models.tiny import build_tiny_model, synthetic_corpus, train_tokenizer
    from components.structure import TagIds
    from components.training.precision import compute_autocast
    from components.training.sft import token_nll
    from components.training.sft_data import collate, encode_example

    arch = TinyArchitecture()  # the tiny profile's calibrated architecture
    tokenizer = train_tokenizer(synthetic_corpus(2000, 0), arch.tokenizer_vocab_size, "npr")
    model = build_tiny_model(arch, tokenizer, 0)
    tags = TagIds.from_tokenizer(tokenizer, "npr")
    rng = random.Random(0)
    examples = []
    for rec in synthetic.generate_problems(batch, 0, {"medium": 1.0}):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": rec["problem"]}], tokenize=False, add_generation_prompt=True
        )
        examples.append(encode_example(tokenizer, prompt, synthetic.render_solution(rec, "parallel", rng)))
    losses: dict[tuple[str, str | None], float] = {}

    def one_step(mode: str, autocast: str | None = None) -> float:
        t0 = time.perf_counter()
        b = collate(examples, mode, tokenizer.pad_token_id, tags if mode == "parallel" else None)
        with compute_autocast(autocast, "cpu"):
            nll, n = token_nll(model, b)
        (nll / n).backward()
        losses[mode, autocast] = float(nll.detach()) / n
        # no optimizer step: every timed step then sees the same weights, so the losses compare
        model.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    variants = [(m, a) for m in ("parallel", "sequential") for a in (None, "bfloat16")]
    for v in variants:  # warm-up
        one_step(*v)
    times: dict[tuple[str, str | None], list[float]] = {v: [] for v in variants}
    for _ in range(repeats):  # interleaved so machine load hits every variant alike
        for v in variants:
            times[v].append(one_step(*v))
    med = {v: statistics.median(t) for v, t in times.items()}
    par, seq = med["parallel", None], med["sequential", None]
    tokens = sum(len(e.input_ids) for e in examples)
    return {
        "tokens_per_step": tokens,
        "parallel_s": par,
        "causal_s": seq,
        "ratio": par / seq,
        **{
            f"{mode}_bf16_speedup": med[mode, None] / med[mode, "bfloat16"]
            for mode in ("parallel", "sequential")
        },
        **{
            f"{mode}_bf16_loss_rel_diff": abs(losses[mode, "bfloat16"] / losses[mode, None] - 1)
            for mode in ("parallel", "sequential")
        },
    }


def mask_memory(length: int, form: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", MEMORY_CHILD, str(length), form],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--lengths", type=int, nargs="+", default=[4096, 16384])
    args = parse_args(parser, None, repeats=1, batch=2, threads=1, lengths=[512])
    torch.set_num_threads(args.threads)

    r = step_time_ratio(args.repeats, args.batch)
    print(f"SFT step, batch {args.batch}, {r['tokens_per_step']} tokens, median of {args.repeats}:")
    print(
        f"  parallel {r['parallel_s'] * 1e3:.1f} ms   causal {r['causal_s'] * 1e3:.1f} ms   "
        f"ratio {r['ratio']:.3f}x (target <= 1.25x)"
    )
    print("  bf16 autocast over fp32 weights (run.autocast) vs fp32, step time ratio and loss difference:")
    for mode in ("parallel", "sequential"):
        print(
            f"  {mode:<10} {r[f'{mode}_bf16_speedup']:.2f}x faster   "
            f"loss relative difference {r[f'{mode}_bf16_loss_rel_diff']:.1e}"
        )
    print(
        "Memory of one trace's attention inputs, MiB: resident growth while held (tensor bytes), fresh process:"
    )
    print(f"  {'L':>6} {'segments':>18} {'dense bool':>18} {'dense float':>18} {'float/bool':>11}")
    for length in args.lengths:
        cells = [mask_memory(length, form) for form in ("segments", "bool", "float")]
        text = "".join(f"{c['resident_mib']:>9.1f} ({c['tensor_mib']:>6.1f})" for c in cells)
        print(f"  {length:>6} {text} {cells[2]['tensor_mib'] / cells[1]['tensor_mib']:>11.2f}")


if __name__ == "__main__":
    main()
