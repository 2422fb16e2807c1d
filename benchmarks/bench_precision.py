"""Compute precision on two kinds of CPU core, measured side by side in one run (issue 43).

The tiny profile trains with ``run.autocast: auto``: bf16 matmuls only where the CPU computes bf16
natively (AVX512-BF16/AMX), fp32 elsewhere (``components.training.precision.native_bf16``). This script
runs, in one child process per kind of core,

- ``native``: the machine as it is;
- ``avx2``: the same machine capped to AVX2 (``ATEN_CPU_CAPABILITY=avx2``, ``ONEDNN_MAX_CPU_ISA=AVX2``), the
  common server and laptop core without native bf16, reproducible on any x86 machine;

and in each: a 512x512 matmul in fp32 and bf16, then training steps of the parallel warmup stage
(forward + backward + AdamW of a parallel SFT batch, the committed tiny seed at the profile's shapes)
with ``run.autocast`` bfloat16, null (fp32) and auto, and what auto picked there and why. The last table
gives each kind's bf16 / fp32 ratios and the step time auto gets against the faster of the two.

On a machine without native bf16 both kinds are the same core (the native row says so). Usage:
  .venv/bin/python benchmarks/bench_precision.py [--steps 3] [--batch 16] [--size 512] [--smoke]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from _smoke import parse_args  # noqa: E402

KINDS = {
    "native": {},
    "avx2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
}
SETTINGS = ("bfloat16", None, "auto")


def matmul_ms(size: int, dtype, repeats: int) -> float:
    import torch

    a, b = torch.randn(size, size).to(dtype), torch.randn(size, size).to(dtype)
    a @ b  # warm-up: first-call dispatch and packing
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 1000 * statistics.median(times)


def sft_steps_s(steps: int, batch: int) -> dict[str, float]:
    """Median seconds of a parallel-warmup training step per ``run.autocast`` setting (interleaved, so the
    machine's load hits each alike), on the committed seed with fresh AdamW state per setting."""
    import torch

    from components.config import load_config
    from components.data import synthetic
    from components.models.loading import load_model
    from components.structure import TagIds
    from components.training.precision import build_adamw, compute_autocast
    from components.training.sft import token_nll
    from components.training.sft_data import collate, encode_example

    cfg = load_config(profile="tiny")
    model, tokenizer = load_model(REPO / "models" / "tiny-instruct", cfg.models, cfg.run)
    tags = TagIds.from_tokenizer(tokenizer, cfg.schema_name)
    rng = random.Random(0)
    examples = []
    for rec in synthetic.generate_problems(batch, 0, {"medium": 1.0}):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": rec["problem"]}], tokenize=False, add_generation_prompt=True
        )
        examples.append(encode_example(tokenizer, prompt, synthetic.render_solution(rec, "parallel", rng)))
    data = collate(examples, "parallel", tokenizer.pad_token_id, tags)
    state = {k: v.clone() for k, v in model.state_dict().items()}

    def one_step(setting: str | None, optimizer: torch.optim.Optimizer) -> float:
        t0 = time.perf_counter()
        with compute_autocast(setting, "cpu"):
            nll, n = token_nll(model, data)
        (nll / n).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return time.perf_counter() - t0

    times: dict[str | None, list[float]] = {s: [] for s in SETTINGS}
    optimizers = {s: build_adamw(model, lr=1e-5, betas=(0.9, 0.98)) for s in SETTINGS}
    for step in range(steps + 1):  # step 0 warms up
        for setting in SETTINGS:
            model.load_state_dict(state)  # every setting steps from the same weights
            elapsed = one_step(setting, optimizers[setting])
            if step:
                times[setting].append(elapsed)
    return {str(s): statistics.median(t) for s, t in times.items()}


def child(args: argparse.Namespace) -> None:
    import torch

    from components.training.precision import native_bf16, resolve_autocast

    torch.set_num_threads(args.threads)
    native, evidence = native_bf16("cpu")
    repeats = max(1, args.steps)
    out = {
        "capability": torch.backends.cpu.get_cpu_capability(),
        "native_bf16": native,
        "evidence": evidence,
        "auto_picks": resolve_autocast("auto", "cpu").dtype or "float32",
        "matmul_fp32_ms": matmul_ms(args.size, torch.float32, repeats),
        "matmul_bf16_ms": matmul_ms(args.size, torch.bfloat16, repeats),
        "step_s": sft_steps_s(args.steps, args.batch),
    }
    print(json.dumps(out))


def run_kind(kind: str, args: argparse.Namespace) -> dict:
    env = {**os.environ, **KINDS[kind]}
    cmd = [sys.executable, __file__, "--child", "--steps", str(args.steps), "--batch", str(args.batch),
           "--size", str(args.size), "--threads", str(args.threads)]  # fmt: skip
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{kind} child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed training steps per setting")
    parser.add_argument("--batch", type=int, default=16, help="parallel SFT examples per step")
    parser.add_argument("--size", type=int, default=512, help="matmul size")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parse_args(parser, argv, steps=1, batch=2, size=128)
    if args.child:
        child(args)
        return
    rows = {kind: run_kind(kind, args) for kind in KINDS}
    print(f"steps={args.steps} batch={args.batch} matmul={args.size}x{args.size} threads={args.threads}")
    print("| kind | torch capability | native bf16 | auto picks | why |")
    print("|---|---|---|---|---|")
    for kind, r in rows.items():
        print(f"| {kind} | {r['capability']} | {r['native_bf16']} | {r['auto_picks']} | {r['evidence']} |")
    print()
    print("| kind | matmul fp32 ms | matmul bf16 ms | bf16/fp32 | step fp32 s | step bf16 s | bf16/fp32 "
          "| step auto s | auto / best |")
    print("|---|---|---|---|---|---|---|---|---|")
    for kind, r in rows.items():
        s = r["step_s"]
        best = min(s["None"], s["bfloat16"])
        print(
            f"| {kind} | {r['matmul_fp32_ms']:.2f} | {r['matmul_bf16_ms']:.2f} | "
            f"{r['matmul_bf16_ms'] / r['matmul_fp32_ms']:.1f}x | {s['None']:.3f} | {s['bfloat16']:.3f} | "
            f"{s['bfloat16'] / s['None']:.2f}x | {s['auto']:.3f} | {s['auto'] / best:.2f} |"
        )
    native, avx2 = rows["native"]["step_s"]["auto"], rows["avx2"]["step_s"]["auto"]
    print(f"\nauto's step on avx2 / native: {avx2 / native:.2f}x")


if __name__ == "__main__":
    main()
