"""Native parallel decoding vs sequential decoding of the SAME traces, on the tiny random-init model.

For K = 2..5 branches: the engine decodes a one-block trace in parallel mode (prompt, a forced guideline of
K plans, K branches of ``--step-tokens`` tokens, the takeaway); then the same flattened trace is decoded
sequentially, one token per step (forced, so it is token for token the same work). Printed side by side:
the ideal (Amdahl) speedup of those traces, total tokens / critical-path tokens, the measured speedup,
and the fraction of the ideal achieved (target >= 0.90 at K = 4); then a tokens/s table shaped like the
paper's Table 3 (sequential vs parallel tokens/s and the ratio).

    .venv/bin/python benchmarks/bench_engine.py [--batch 1] [--step-tokens 48] [--repeats 3] [--smoke]

``--smoke`` (benchmarks/_smoke.py): 8-token branches, 2 takeaway tokens, one repeat.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402
from components.engine import GenerationConfig, generate  # noqa: E402
from components.models.tiny import tiny_test_world  # noqa: E402
from components.structure import TagIds  # noqa: E402


def _guideline(k: int) -> str:
    return "<guideline>" + "".join(f"<plan>{i}: part {i}</plan>" for i in range(1, k + 1)) + "</guideline>"


def _best_time(fn, repeats: int):
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1, help="prompts decoded together")
    parser.add_argument(
        "--step-tokens", type=int, default=48, help="tokens per branch (a forced </step> ends it)"
    )
    parser.add_argument("--takeaway-tokens", type=int, default=4, help="tokens after <takeaway>")
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, None, step_tokens=8, takeaway_tokens=2, repeats=1)
    torch.set_num_threads(1)  # stack-ml.md §3: 2 threads stall small decode kernels on this machine
    model, tok = tiny_test_world(seed=0)
    tags = TagIds.from_tokenizer(tok, "npr")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 12+34? Think in parallel."}],
        tokenize=False,
        add_generation_prompt=True,
    )
    rows = []
    for k in (2, 3, 4, 5):
        prefix = _guideline(k)
        prefix_len = len(tok.encode(prefix, add_special_tokens=False))
        budget = prefix_len + k * args.step_tokens + 1 + args.takeaway_tokens
        par_cfg = GenerationConfig(
            mode="parallel", temperature=1.0, max_new_tokens=budget, max_step_tokens=args.step_tokens,
            step_repetition_penalty=1.0, batch_size=args.batch, seed=k,
        )  # fmt: skip
        prompts, prefixes = [prompt] * args.batch, [prefix] * args.batch
        t_par, gens = _best_time(lambda: generate(model, tok, prompts, par_cfg, tags, prefixes), args.repeats)  # noqa: B023
        assert all(g.parallel_taken for g in gens), "every trace must really branch"
        traces = [g.text for g in gens]
        seq_cfg = GenerationConfig(
            mode="sequential", temperature=1.0, max_new_tokens=max(g.total_tokens for g in gens),
            batch_size=args.batch, seed=k,
        )  # fmt: skip
        t_seq, seq = _best_time(lambda: generate(model, tok, prompts, seq_cfg, None, traces), args.repeats)  # noqa: B023
        total = sum(g.total_tokens for g in gens)
        critical = sum(g.critical_path_tokens for g in gens)
        seq_total = sum(g.total_tokens for g in seq)
        ideal = total / critical
        measured = (t_seq / seq_total * total) / t_par  # same token count on both sides
        rows.append(
            (
                k,
                total // args.batch,
                critical // args.batch,
                ideal,
                measured,
                total / t_par,
                seq_total / t_seq,
            )
        )
    print(f"batch={args.batch} step_tokens={args.step_tokens} (best of {args.repeats}, 1 thread)\n")
    print(f"{'K':>2} {'tokens':>7} {'critical':>8} {'ideal x':>8} {'measured x':>10} {'fraction':>8}")
    for k, total, critical, ideal, measured, _, _ in rows:
        print(f"{k:>2} {total:>7} {critical:>8} {ideal:>8.2f} {measured:>10.2f} {measured / ideal:>8.2f}")
    print("\nTable 3 shape: decoding throughput, same traces")
    print(f"{'branches':>8} | {'sequential tok/s':>16} | {'NPR engine tok/s':>16} | {'speedup':>7}")
    for k, _, _, _, _, par_tps, seq_tps in rows:
        print(f"{k:>8} | {seq_tps:>16.1f} | {par_tps:>16.1f} | {par_tps / seq_tps:>6.2f}x")


if __name__ == "__main__":
    main()
