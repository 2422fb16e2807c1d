"""The merge approximation, measured: the torch engine's exact shared-KV merge vs a re-prefilled merge.

A stock SGLang server (the GPU profile's distill/evaluate, verl's rollouts) cannot merge a parallel block
exactly: it re-reads the branches as one sequential text, so every token after the first merge is sampled
from a context the trainer (canonical mask and positions) does not reproduce. The torch engine can do
both (``merge_mode``), so on one checkpoint, the same prompts and the same seed this measures:

1. per token class, |log p_rollout - log p_trainer| where the trainer's log-probs are
   ``components.training.rl_batch.response_log_probs`` (the parallel mask the trainer uses): tokens before
   the first merge (plans and the first block's branches: exact in both modes, ~0) and after it (exact in
   ``shared_kv``; the approximation in ``reprefill``), mean and p99;
2. the distribution of the truncated weight ``min(exp(log p_trainer - log p_rollout), C)`` the PAPO loss
   gives post-merge tokens (``components.training.papo.post_merge_is_weights``);
3. what the sampled responses score in each mode (the same prompts and seed: identical up to the first
   merge): correct-and-valid, accuracy, format-valid (``components.grading.judge``);
4. a short local PAPO run from the checkpoint in each mode (same seed, steps and data), the re-prefill one
   with that correction: reward, held-out accuracy, and the correction's own metrics.

    .venv/bin/python benchmarks/bench_merge.py [--checkpoint artifacts/parallel_warmup/model] \\
        [--n 256] [--papo-steps 6] [--threshold 2.0] [--json out.json] [--smoke]

Defaults: the tiny profile's trained NPR-Beta and its validation problems (``artifacts/sample_orz/problems``);
synthetic problems when that directory is absent. ``--smoke`` (benchmarks/_smoke.py): 2 prompts x 1 sample
of up to 96 tokens through every backend and one PAPO step of 2 x 2 rollouts per mode, from the committed seed
``models/tiny-instruct`` unless ``--checkpoint`` names one.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import parse_args  # noqa: E402

MERGE_SEMANTICS = ("isolated", "reread")
# torch: the engine's shared-KV merge; torch-reprefill: the same engine re-prefilling as a server does;
# async: the async driver over an in-process token server (verl's agent-loop shape); sglang: SGLang's
# native /generate API, served by the protocol stand-in (tests/support/sglang_standin.py) in a subprocess
BACKENDS = ("torch", "torch-reprefill", "async", "sglang")


def decode(
    backend: str, model: Any, tok: Any, prompts: list[str], cfg: Any, tags: Any, checkpoint: Path
) -> list:
    """Parallel generations of ``prompts`` from one token backend (same controller, seed and settings)."""
    from components.engine import generate

    if backend in ("torch", "torch-reprefill"):
        return generate(model, tok, prompts, cfg, tags)
    if backend == "async":
        import asyncio

        from components.engine.async_driver import generate_async
        from components.engine.backends.torch_tokens import TorchTokenGenerator
        from components.engine.controller import end_of_turn_ids

        server = TorchTokenGenerator(model, end_of_turn_ids(tok), deterministic=True).as_async()
        return asyncio.run(generate_async(tok, prompts, cfg, tags, server))
    if backend != "sglang":
        raise ValueError(f"unknown backend {backend!r}: choose from {', '.join(BACKENDS)}")
    import tempfile

    import yaml

    from components.engine.serving import launched

    with tempfile.TemporaryDirectory(prefix="npr-bench-sglang-") as work:
        tmp = Path(work)
        spec = tmp / "server.yaml"
        spec.write_text(yaml.safe_dump({
            "python": sys.executable, "module": "tests.support.sglang_standin", "model_path": "unused",
            "port": 0, "tp_size": 1, "context_length": 4096, "random_seed": 0,
            "enable_deterministic_inference": True,
            "env": {"SGLANG_RETURN_ORIGINAL_LOGPROB": "1", "PYTHONPATH": str(ROOT)},
        }))  # fmt: skip
        # the stand-in serves one request per thread: a few in flight (it is a protocol model, not a server)
        server_cfg = cfg.model_copy(update={"backend": "sglang", "server_spec": str(spec), "batch_size": 8})
        with launched(checkpoint, server_cfg, tmp) as url:
            return generate(None, tok, prompts, server_cfg.model_copy(update={"server_url": url}), tags)


def _prompts(cfg: Any, tokenizer: Any, problems_dir: Path, n: int, seed: int) -> tuple[list[str], list[dict]]:
    from components.data.problems import load_tuning_split
    from components.data.synthetic import generate_problems
    from components.prompts import render_prompt

    try:
        # the validation split: these numbers choose settings, so the test split stays unread
        problems = load_tuning_split(problems_dir)[1]
    except FileNotFoundError:
        problems = generate_problems(n, seed=seed + 1)
    problems = problems[:n]
    return [render_prompt(tokenizer, p["problem"], cfg.prompts, "parallel") for p in problems], problems


def token_deviations(
    model: Any, tokenizer: Any, tags: Any, gens: list[Any], threshold: float, merge: str = "isolated"
) -> dict[str, Any]:
    """Rollout vs trainer log-probs of well-formed generations, split at the first merge; the trainer
    teacher-forces under the merge semantics ``merge`` (``components.structure.merge``)."""
    from components.structure import StructureError, post_merge_mask
    from components.training.papo import post_merge_is_weights
    from components.training.rl_batch import Rollout, build_policy_batch, response_log_probs

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    rows: list[tuple[Rollout, list[float], np.ndarray, np.ndarray]] = []
    malformed = 0
    for g in gens:
        stop = [g.stop_token_id] if g.stop_token_id is not None else []
        ids = list(g.token_ids) + stop
        r = Rollout("b", "p", "0", list(g.prompt_ids), ids, g.text, g.finish_reason, g.parallel_taken)
        try:
            post = post_merge_mask(r.prompt_ids + r.response_ids, tags, len(r.prompt_ids))
        except StructureError:
            malformed += 1  # the trainer filters it
            continue
        branch = np.zeros(len(ids), dtype=bool)
        first = next((b for b in g.blocks if b.merged and b.n_branches >= 2), None)
        if first is not None:
            branch[first.start : first.start + sum(first.branch_tokens)] = True
        lps = list(g.logprobs) + ([g.stop_logprob] if stop else [])
        rows.append((r, lps, post, branch))
    out: dict[str, Any] = {"generations": len(gens), "malformed": malformed, "well_formed": len(rows)}
    pre_d, post_d, branch_d, weights, truncated = [], [], [], [], []
    for lo in range(0, len(rows), 32):
        chunk = rows[lo : lo + 32]
        batch = build_policy_batch([r for r, *_ in chunk], pad, tags, merge)
        with torch.no_grad():
            trainer_lp, _ = response_log_probs(model, batch)
        rollout_lp = torch.full_like(trainer_lp, float("nan"))
        post = torch.zeros(trainer_lp.shape, dtype=torch.bool)
        branch = torch.zeros(trainer_lp.shape, dtype=torch.bool)
        for b, (_, lps, pm, br) in enumerate(chunk):
            rollout_lp[b, : len(lps)] = torch.tensor(lps)
            post[b, : pm.size] = torch.from_numpy(pm)
            branch[b, : br.size] = torch.from_numpy(br)
        valid = batch.response_mask.bool() & torch.isfinite(rollout_lp)
        delta = (trainer_lp - rollout_lp).abs()
        pre_d.append(delta[valid & ~post])
        post_d.append(delta[valid & post])
        branch_d.append(delta[valid & branch])
        w, _ = post_merge_is_weights(trainer_lp, rollout_lp, batch.response_mask, post, threshold)
        raw = torch.exp((trainer_lp - rollout_lp).clamp(max=20.0))
        weights.append(w[valid & post])
        truncated.append((raw > threshold)[valid & post])
    cat = lambda xs: torch.cat(xs) if xs else torch.zeros(0)  # noqa: E731
    pre, post_all, br_all, w_all, tr_all = (
        cat(pre_d),
        cat(post_d),
        cat(branch_d),
        cat(weights),
        cat(truncated),
    )
    out["tokens"] = {
        "pre_merge": int(pre.numel()),
        "branch": int(br_all.numel()),
        "post_merge": int(post_all.numel()),
    }
    out["merged_rate"] = sum(bool(pm.any()) for *_, pm, _ in rows) / max(1, len(rows))
    out["pre_merge"] = _stats(pre)
    out["branch"] = _stats(br_all)
    out["post_merge"] = _stats(post_all)
    out["weights"] = {
        "mean": float(w_all.mean()) if w_all.numel() else math.nan,
        "quantiles": {
            f"p{int(q * 100):02d}": float(torch.quantile(w_all, q)) if w_all.numel() else math.nan
            for q in (0.01, 0.1, 0.5, 0.9, 0.99)
        },
        "truncated_frac": float(tr_all.float().mean()) if tr_all.numel() else math.nan,
        "below_half_frac": float((w_all < 0.5).float().mean()) if w_all.numel() else math.nan,
        "threshold": threshold,
    }
    return out


def _stats(x: torch.Tensor) -> dict[str, float]:
    if x.numel() == 0:
        return {"mean": math.nan, "p99": math.nan, "max": math.nan}
    return {
        "mean": float(x.mean()),
        "p99": float(torch.quantile(x.float(), 0.99)),
        "max": float(x.max()),
    }


def papo_run(
    cfg: Any,
    checkpoint: Path,
    problems_dir: Path,
    merge_mode: str,
    steps: int,
    seed: int,
    sizes: dict[str, int] | None = None,
) -> dict[str, Any]:
    """A short local PAPO run from ``checkpoint`` (the tiny profile's papo_rl recipe, ``steps`` steps;
    ``sizes`` replaces some of its papo_rl sizes, e.g. ``prompts_per_step``)."""
    import tempfile

    from components.data.problems import load_problems, load_tuning_split
    from components.data.synthetic import generate_problems
    from components.models.loading import load_model
    from components.training.job import rl_job  # lazy: with the trainer (torch, verl)
    from components.training.rl import RLTrainer

    sc = cfg.papo_rl.model_copy(
        update={
            "merge_mode": merge_mode,
            "steps": steps,
            "eval_every": steps,
            "eval_before_train": False,
            "seed": seed,
            **(sizes or {}),
        }
    )
    run_cfg = cfg.model_copy(update={"papo_rl": sc})
    run_cfg.tracking.mode = "disabled"
    try:
        train, test = load_problems(problems_dir, "train"), load_tuning_split(problems_dir)[1]
    except FileNotFoundError:
        ps = generate_problems(600, seed=seed + 2)
        train, test = ps[:400], ps[400:]
    torch.manual_seed(seed)
    model, tokenizer = load_model(checkpoint, cfg.models, cfg.run, for_training=True)
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as work:
        result = RLTrainer(rl_job("papo_rl", run_cfg), model, tokenizer, train, test, Path(work)).run()
    history = result.history
    keys = [
        "rollout_corr/pre_merge_abs_logp_diff_max",
        "rollout_corr/post_merge_abs_logp_diff_mean",
        "rollout_corr/post_merge_abs_logp_diff_p99",
        "rollout_corr/post_merge_is_weight_mean",
        "rollout_corr/post_merge_is_truncated_frac",
        "rollout_corr/post_merge_token_frac",
    ]
    reward = [h.get("reward/mean", h.get("train/reward_mean", math.nan)) for h in history]
    out = {
        "merge_mode": merge_mode,
        "steps": len(history),
        "wall_s": time.perf_counter() - start,
        "reward_by_step": [float(x) for x in reward],
        "final": {
            k: result.metrics.get(f"final/{k}")
            for k in ("format_valid", "accuracy", "correct_and_valid", "parallel_rate")
        },
        "correction": {
            k.split("/", 1)[1]: float(np.nanmean([h.get(k, math.nan) for h in history]))
            for k in keys
            if any(k in h for h in history)
        },
    }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", type=Path, default=Path("artifacts/parallel_warmup/model"))
    parser.add_argument("--problems", type=Path, default=Path("artifacts/sample_orz/problems"))
    parser.add_argument("--n", type=int, default=256, help="held-out prompts decoded in each mode")
    parser.add_argument("--samples", type=int, default=2, help="samples per prompt")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threshold", type=float, default=None, help="C (default: papo_rl's is_threshold)")
    parser.add_argument("--papo-steps", type=int, default=6, help="0 skips the PAPO runs")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help=f"token backends to decode with (of {','.join(BACKENDS)}); sglang = the protocol stand-in server",
    )
    parser.add_argument("--max-new-tokens", type=int, default=None, help="decode budget [papo_rl's]")
    parser.add_argument(
        "--papo-prompts", type=int, default=None, help="PAPO prompts per step [the profile's]"
    )
    parser.add_argument("--papo-group", type=int, default=None, help="PAPO group size [the profile's]")
    parser.add_argument(
        "--papo-eval-n", type=int, default=None, help="PAPO held-out problems [the profile's]"
    )
    parser.add_argument("--json", type=Path, default=None, help="also write the numbers here")
    args = parse_args(
        parser,
        None,
        checkpoint=ROOT / "models" / "tiny-instruct",
        n=2,
        samples=1,
        max_new_tokens=96,
        papo_steps=1,
        papo_prompts=2,
        papo_group=2,
        papo_eval_n=2,
    )
    sizes = {
        key: value
        for key, value in (
            ("prompts_per_step", args.papo_prompts),
            ("group_size", args.papo_group),
            ("eval_n", args.papo_eval_n),
            ("max_new_tokens", args.max_new_tokens),
        )
        if value is not None
    }
    torch.set_num_threads(args.threads)

    from components.config import load_config
    from components.engine import GenerationConfig
    from components.models.loading import load_model
    from components.structure import TagIds

    cfg = load_config(profile="tiny")
    threshold = args.threshold or cfg.papo_rl.rollout_correction.is_threshold
    model, tokenizer = load_model(args.checkpoint, cfg.models, cfg.run)
    tags = TagIds.from_tokenizer(tokenizer, cfg.schema_name)
    from components.grading.judge import judge_many, summarize

    prompts, problems = _prompts(cfg, tokenizer, args.problems, args.n, args.seed)
    prompts = [p for p in prompts for _ in range(args.samples)]
    golds = [str(p["answer"]) for p in problems for _ in range(args.samples)]
    sc = cfg.papo_rl
    results: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "prompts": len(prompts),
        "threshold": threshold,
    }
    for backend in args.backends.split(","):
        mode = "shared_kv" if backend == "torch" else "reprefill"
        gen_cfg = GenerationConfig(
            mode="parallel",
            temperature=sc.temperature,
            top_p=sc.top_p,
            max_new_tokens=args.max_new_tokens or sc.max_new_tokens,
            batch_size=256,
            step_repetition_penalty=1.0,
            seed=args.seed,
            merge_mode=mode,
        )
        start = time.perf_counter()
        gens = decode(backend, model, tokenizer, prompts, gen_cfg, tags, args.checkpoint)
        wall = time.perf_counter() - start
        scores = summarize(judge_many([g.text for g in gens], golds, cfg.schema_name, cfg.grading))
        for merge in MERGE_SEMANTICS:
            stats = token_deviations(model, tokenizer, tags, gens, threshold, merge)
            stats["decode_s"] = wall
            stats["merge_mode"] = mode
            stats["scores"] = {k: scores[k] for k in ("correct_and_valid", "accuracy", "format_valid")}
            results.setdefault("pairs", {})[f"{backend}|{merge}"] = stats
        if backend in ("torch", "torch-reprefill"):
            results[mode] = results["pairs"][f"{backend}|isolated"]  # the PAPO section's two modes
    if args.papo_steps > 0:
        results["papo"] = {
            mode: papo_run(cfg, args.checkpoint, args.problems, mode, args.papo_steps, args.seed, sizes)
            for mode in ("shared_kv", "reprefill")
        }
    _print(results)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2, default=float))


def _print_pairs(r: dict[str, Any]) -> None:
    """The (semantics x backend) table: rollout vs teacher-forced log-probs of post-merge tokens."""
    print(
        "| backend | merge mode | trainer semantics | post-merge tokens | mean abs dlogp | p99 | max | pre-merge max |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for key, m in r.get("pairs", {}).items():
        backend, merge = key.split("|")
        s, pre = m["post_merge"], m["pre_merge"]
        print(
            f"| {backend} | {m['merge_mode']} | {merge} | {m['tokens']['post_merge']} | {s['mean']:.2e} | "
            f"{s['p99']:.2e} | {s['max']:.2e} | {pre['max']:.2e} |"
        )


def _print(r: dict[str, Any]) -> None:
    print(f"checkpoint {r['checkpoint']}: {r['prompts']} samples per backend, C = {r['threshold']}")
    _print_pairs(r)
    if "shared_kv" not in r or "reprefill" not in r:
        return
    print(
        f"{'merge mode':<10} {'merged':>7} {'class':<11} {'tokens':>7} {'mean |dlogp|':>13} {'p99':>9} {'max':>9}"
    )
    for mode in ("shared_kv", "reprefill"):
        m = r[mode]
        for cls in ("branch", "pre_merge", "post_merge"):
            s = m[cls]
            print(
                f"{mode:<10} {m['merged_rate']:>7.2f} {cls:<11} {m['tokens'][cls]:>7} "
                f"{s['mean']:>13.2e} {s['p99']:>9.2e} {s['max']:>9.2e}"
            )
    for mode in ("shared_kv", "reprefill"):
        sc = r[mode]["scores"]
        print(
            f"{mode:<10} responses: correct-and-valid {sc['correct_and_valid']:.3f}, accuracy "
            f"{sc['accuracy']:.3f}, format-valid {sc['format_valid']:.3f}"
        )
    w = r["reprefill"]["weights"]
    q = w["quantiles"]
    print(
        f"reprefill post-merge weight min(exp(dlogp), C): mean {w['mean']:.4f}, p01 {q['p01']:.3f}, "
        f"p10 {q['p10']:.3f}, p50 {q['p50']:.3f}, p90 {q['p90']:.3f}, p99 {q['p99']:.3f}; "
        f"truncated at C {w['truncated_frac']:.4f}, below 0.5 {w['below_half_frac']:.4f}"
    )
    if "papo" in r:
        print(
            f"{'PAPO run':<10} {'steps':>5} {'reward by step':<40} {'final c&v':>9} {'final fmt':>9} {'wall s':>7}"
        )
        for mode, p in r["papo"].items():
            rewards = " ".join(f"{x:+.2f}" for x in p["reward_by_step"])
            f = p["final"]
            print(
                f"{mode:<10} {p['steps']:>5} {rewards:<40} {f['correct_and_valid'] or 0:>9.3f} "
                f"{f['format_valid'] or 0:>9.3f} {p['wall_s']:>7.0f}"
            )
            if p["correction"]:
                print(
                    "           correction: " + ", ".join(f"{k} {v:.4g}" for k, v in p["correction"].items())
                )


if __name__ == "__main__":
    main()
