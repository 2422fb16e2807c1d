"""Batched decoding throughput: the engine's in-place KV cache and grouped-query attention vs the stock path.

Side by side in one run, same model, prompts and seed: (a) the engine as shipped; (b) the engine with
transformers' stock pieces put back — ``DynamicCache`` (``torch.cat`` per step) and the ``sdpa`` attention
(K/V heads copied whenever a mask is passed). Sequential sampling at temperature 1, the shape of RL
rollouts and distillation on the tiny profile. Prints tokens/s of both and the ratio (same tokens: the
two paths sample identical responses). A tiny-profile-sized model (hidden 192, 4 layers), random init, with
the tiny profile's tokenizer (the committed seed's, ``models/tiny-instruct``: the one
``train_tokenizer(tokenizer_corpus(cfg))`` builds, read instead of retrained in ~45 s).

    .venv/bin/python benchmarks/bench_decode.py [--batch 256] [--new-tokens 96] [--repeats 2] [--smoke]

``--smoke`` (benchmarks/_smoke.py): batch 4, 8 new tokens, one repeat, one thread.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import time
from pathlib import Path
from unittest import mock

import torch
from transformers import DynamicCache

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import components.engine.backends.torch_backend as torch_backend  # noqa: E402
import components.engine.decoder as decoder  # noqa: E402
from benchmarks._smoke import parse_args  # noqa: E402
from components.config import load_config  # noqa: E402
from components.engine import GenerationConfig, generate  # noqa: E402
from components.models.loading import load_tokenizer  # noqa: E402
from components.models.tiny import build_tiny_model  # noqa: E402


def stock_path() -> contextlib.ExitStack:
    """Patch the two engine changes out: DynamicCache and the model's own sdpa attention."""
    stack = contextlib.ExitStack()
    stack.enter_context(
        mock.patch.object(decoder, "growing_cache", lambda model, hint: DynamicCache(config=model.config))
    )
    stack.enter_context(
        mock.patch.object(torch_backend, "decode_attention", lambda m: contextlib.nullcontext())
    )
    return stack


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--new-tokens", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    args = parse_args(parser, None, batch=4, new_tokens=8, repeats=1, threads=1)
    torch.set_num_threads(args.threads)
    cfg = load_config(profile="tiny")
    tok = load_tokenizer(ROOT / "models" / "tiny-instruct")
    model = build_tiny_model(cfg.models.tiny, tok, 0, attn_implementation="sdpa")
    model.eval()
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"Compute ({k % 9 + 1} + {k % 7 + 1}) - ({k % 5 + 1} + 2)."}],
            tokenize=False,
            add_generation_prompt=True,
        )
        for k in range(args.batch)
    ]
    gen_cfg = GenerationConfig(
        mode="sequential", temperature=1.0, max_new_tokens=args.new_tokens, batch_size=args.batch, seed=0
    )
    results = {}
    for name, ctx in (("engine", contextlib.nullcontext), ("stock", stock_path)):
        best = float("inf")
        for _ in range(args.repeats):
            with ctx():
                start = time.perf_counter()
                gens = generate(model, tok, prompts, gen_cfg)
                best = min(best, time.perf_counter() - start)
        tokens = sum(len(g.token_ids) for g in gens)
        results[name] = (tokens, best, [g.token_ids for g in gens])
    same = results["engine"][2] == results["stock"][2]
    print(
        f"batch {args.batch}, up to {args.new_tokens} new tokens, {args.threads} threads, best of {args.repeats}"
    )
    print(f"{'path':<8} {'tokens':>8} {'seconds':>8} {'tokens/s':>9}")
    for name, (tokens, secs, _) in results.items():
        print(f"{name:<8} {tokens:>8} {secs:>8.2f} {tokens / secs:>9.0f}")
    ratio = results["stock"][1] / results["engine"][1]
    print(f"engine / stock throughput: {ratio:.2f}x; identical samples: {same}")


if __name__ == "__main__":
    main()
