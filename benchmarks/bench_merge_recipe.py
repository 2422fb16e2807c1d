"""Both merge semantics through the tiny recipe, side by side: NPR-Beta and a short PAPO trained each way.

From one workspace's upstream artifacts (``artifacts/seed``, ``artifacts/reject_filter``,
``artifacts/sample_orz``: run ``dvc repro reject_filter`` first), each arm runs the real stages in a scratch
workspace of its own (code and configs linked, upstream artifacts linked read-only), with the same seeds,
data and step counts; only the merge keys differ:

- ``isolated``: ``merge_semantics: isolated``, the torch engine's exact shared-KV merge (the tiny default);
- ``reread``: ``merge_semantics: reread``, the re-prefilled merge every stock server does (exact under it);
- ``isolated-served`` (``--served``): the isolated NPR-Beta trained by PAPO from re-prefilled rollouts with
  PAPO's post-merge correction and evaluated re-prefilled: what a stock SGLang serves an isolated policy.

Per arm: ``npr stage parallel_warmup`` (not for ``isolated-served``: it reuses the isolated NPR-Beta),
``npr stage papo_rl``, then ``npr eval`` of NPR-Beta and NPR on the validation split (never the test split)
for accuracy, format-valid, parallel rate and ideal/achieved speedup; PAPO's own correction metrics (the
post-merge rollout/trainer mismatch) come from its log. One table at the end; ``--json`` keeps the numbers.

    .venv/bin/python benchmarks/bench_merge_recipe.py [--from .] [--arms isolated,reread] [--served] \\
        [--papo-steps 8] [--k 1] [--val-n N] [--set section.key=value ...] [--json out.json] [--smoke]

``--set`` overrides params.yaml in every arm. ``--smoke`` (benchmarks/_smoke.py): the isolated and
isolated-served arms (a fresh NPR-Beta and a reused one), one SFT step, one PAPO step of 2 x 2 rollouts,
4 validation problems of up to 64 tokens (the speedup decode: 2 problems, once), one torch thread; the
workspace still needs the upstream artifacts.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import parse_args  # noqa: E402
from components.dag import ancestors, branch_order, chain_to, load_stages  # noqa: E402

LINKED = ("dvc.yaml", "configs", "prompts", "components", "flows", "eval", "models")
# The arms train the NPR branch (NPR-Beta's SFT, then PAPO: the stages of papo_rl's chain that NPR-Beta's
# inputs do not already need) from the workspace's artifacts of the stages that branch reads; both from
# dvc.yaml, so a renamed or added input moves with it.
_SPECS = load_stages(ROOT / "dvc.yaml")
TRAINED = [s for s in chain_to("papo_rl", ROOT / "dvc.yaml") if s not in ancestors(_SPECS, "parallel_warmup")]
UPSTREAM = [s for s in branch_order(_SPECS) if s not in TRAINED and any(s in _SPECS[t].upstream for t in TRAINED)]
PARALLEL_DECODES = ("papo_rl.merge_mode", "evaluate.generation.merge_mode", "pr1_rl.merge_mode")
ARMS: dict[str, list[str]] = {
    "isolated": ["merge_semantics=isolated"],
    "reread": ["merge_semantics=reread", *(f"{k}=reprefill" for k in PARALLEL_DECODES)],
    "isolated-served": ["merge_semantics=isolated", *(f"{k}=reprefill" for k in PARALLEL_DECODES)],
}
# --smoke's sizes: one step of each stage, small PAPO batches, short decodes
SMOKE_SETS = [
    "parallel_warmup.max_steps=1", "parallel_warmup.batch_size=4",
    "papo_rl.prompts_per_step=2", "papo_rl.group_size=2", "papo_rl.eval_n=4", "papo_rl.eval_samples=1",
    "papo_rl.max_new_tokens=64", "evaluate.generation.max_new_tokens=64",
    "evaluate.speedup.max_problems=2", "evaluate.speedup.repeats=1", "run.torch_threads=1",
]  # fmt: skip


def _npr(work: Path, args: list[str], sets: list[str], log: Path) -> float:
    """Run ``npr ARGS --set ...`` in ``work``; raise with the log's tail on failure; return the wall time."""
    cmd = [str(Path(sys.executable).parent / "npr"), *args]  # the console script beside this interpreter
    for s in sets:
        cmd += ["--set", s]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "WANDB_MODE": "offline"}
    start = time.perf_counter()
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        proc = subprocess.run(cmd, cwd=work, env=env, stdout=out, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        tail = log.read_text()[-3000:]
        raise RuntimeError(f"{' '.join(args)} failed in {work} (exit {proc.returncode}):\n{tail}")
    return time.perf_counter() - start


def _workspace(source: Path, scratch: Path, arm: str, beta_from: Path | None) -> Path:
    """The arm's workspace; an existing one (``--keep`` of an earlier run) is reused: its finished stages
    report their recorded runs and an interrupted one resumes from its checkpoint."""
    work = scratch / arm
    (work / "artifacts").mkdir(parents=True, exist_ok=True)
    links = {work / name: ROOT / name for name in LINKED}
    links.update({work / "artifacts" / s: (source / "artifacts" / s).resolve() for s in UPSTREAM})
    if beta_from is not None:
        links[work / "artifacts" / "parallel_warmup"] = beta_from.resolve()
    for link, target in links.items():
        if not link.is_symlink():
            link.symlink_to(target)
    if not (work / "params.yaml").exists():
        shutil.copy(source / "params.yaml", work / "params.yaml")
    return work


def _val_file(source: Path, out: Path, n: int | None = None) -> Path:
    from components.data.problems import load_tuning_split

    split, rows = load_tuning_split(source / "artifacts" / "sample_orz" / "problems")
    with out.open("w") as f:
        for r in rows[:n]:
            f.write(json.dumps({"id": r["id"], "problem": r["problem"], "answer": r["answer"]}) + "\n")
    return out


def _eval(work: Path, checkpoint: str, bench: Path, k: int, sets: list[str], log: Path) -> dict[str, Any]:
    out = work / "artifacts" / f"eval-{checkpoint}"
    _npr(
        work,
        ["eval", "--checkpoint", f"artifacts/{checkpoint}/model", "--benchmarks", str(bench),
         "--k", str(k), "--out", str(out)],
        sets,
        log,
    )  # fmt: skip
    metrics = json.loads((out / "metrics.json").read_text())
    ckpt = next(iter(metrics["checkpoints"].values()))
    b = ckpt["benchmarks"][bench.stem]
    thr = ckpt.get("throughput", {})
    return {
        "accuracy": b.get("accuracy"),
        "format_valid": b.get("format_valid", b.get("format_valid_rate")),
        "parallel_rate": b.get("parallel_rate"),
        "ideal_speedup": thr.get("speedup_ideal", thr.get("ideal_speedup")),
        "achieved_speedup": thr.get("achieved_speedup"),
        "merge": metrics["settings"].get("merge"),
    }


def _papo_log(work: Path) -> dict[str, float]:
    """Means over PAPO's steps of its post-merge correction metrics (metrics.jsonl in its work dir)."""
    path = work / "artifacts" / "papo_rl" / "work" / "metrics.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []
    keys = ("rollout_corr/post_merge_abs_logp_diff_mean", "rollout_corr/post_merge_abs_logp_diff_p99",
            "rollout_corr/post_merge_is_weight_mean", "rollout_corr/post_merge_token_frac")  # fmt: skip
    out = {}
    for key in keys:
        vals = [r[key] for r in rows if isinstance(r.get(key), (int, float))]
        if vals:
            out[key.split("/", 1)[1]] = sum(vals) / len(vals)
    return out


def run_arm(arm: str, source: Path, scratch: Path, bench: Path, args: argparse.Namespace,
            beta_from: Path | None) -> dict[str, Any]:  # fmt: skip
    sets = [*ARMS[arm], f"papo_rl.steps={args.papo_steps}", "tracking.mode=disabled", *args.sets]
    work = _workspace(source, scratch, arm, beta_from)
    log = scratch / f"{arm}.log"
    result: dict[str, Any] = {"arm": arm, "sets": sets, "wall_s": {}}
    if beta_from is None:
        result["wall_s"]["parallel_warmup"] = _npr(work, ["stage", "parallel_warmup"], sets, log)
    result["wall_s"]["papo_rl"] = _npr(work, ["stage", "papo_rl"], sets, log)
    papo = json.loads((work / "artifacts" / "papo_rl" / "metrics.json").read_text())
    result["papo_final"] = {k: papo.get(f"final/{k}") for k in ("accuracy", "format_valid", "parallel_rate")}
    result["correction"] = _papo_log(work)
    for name in TRAINED:
        result[name] = _eval(work, name, bench, args.k, sets, log)
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--from", dest="source", type=Path, default=Path("."),
                        help="workspace whose artifacts hold sample_orz, seed and reject_filter")  # fmt: skip
    parser.add_argument("--arms", default="isolated,reread")
    parser.add_argument("--served", action="store_true", help="also the isolated-served arm")
    parser.add_argument("--papo-steps", type=int, default=8)
    parser.add_argument("--k", type=int, default=1, help="samples per validation problem")
    parser.add_argument(
        "--keep", type=Path, default=None, help="keep the scratch workspaces here (a rerun reuses them)"
    )
    parser.add_argument("--val-n", type=int, default=None, help="the first N validation problems [all]")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="section.key=value, every arm")
    parser.add_argument("--json", type=Path, default=None)
    args = parse_args(
        parser, argv, arms="isolated", served=True, papo_steps=1, val_n=4, sets=SMOKE_SETS
    )
    source = args.source.resolve()
    missing = [s for s in UPSTREAM if not (source / "artifacts" / s).exists()]
    if missing:
        parser.error(f"{source}/artifacts lacks {missing}: run `dvc repro reject_filter` there first")
    arms = [a for a in args.arms.split(",") if a] + (["isolated-served"] if args.served else [])
    unknown = [a for a in arms if a not in ARMS]
    if unknown:
        parser.error(f"unknown arms {unknown}: choose from {', '.join(ARMS)}")
    scratch = Path(tempfile.mkdtemp(prefix="npr-merge-recipe-")) if args.keep is None else args.keep
    scratch.mkdir(parents=True, exist_ok=True)
    bench = _val_file(source, scratch / "tiny_val.jsonl", args.val_n)
    results = []
    for arm in arms:
        beta = scratch / "isolated" / "artifacts" / "parallel_warmup" if arm == "isolated-served" else None
        if beta is not None and not beta.exists():
            parser.error("the isolated-served arm reuses the isolated arm's NPR-Beta: list isolated first")
        results.append(run_arm(arm, source, scratch, bench, args, beta))
        print(f"{arm}: done ({sum(results[-1]['wall_s'].values()):.0f} s)", flush=True)
    print_table(results, args)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1, default=str))
    if args.keep is None:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def print_table(results: list[dict[str, Any]], args: argparse.Namespace) -> None:
    def pct(x: Any) -> str:
        return "-" if x is None else f"{100 * x:.1f}"

    def num(x: Any, f: str = ".2f") -> str:
        return "-" if x is None else format(x, f)

    print(f"\nvalidation split, {args.k} sample(s) per problem; PAPO {args.papo_steps} steps; same seeds and data")
    print("| arm | checkpoint | accuracy | format-valid | parallel rate | ideal speedup | achieved | exact decode |")
    print("|---|---|---|---|---|---|---|---|")
    for r in results:
        for name, label in (("parallel_warmup", "NPR-Beta"), ("papo_rl", "NPR")):
            e = r[name]
            exact = e["merge"]["exact"] if e.get("merge") else None
            print(f"| {r['arm']} | {label} | {pct(e['accuracy'])} | {pct(e['format_valid'])} | "
                  f"{pct(e['parallel_rate'])} | {num(e['ideal_speedup'])} | {num(e['achieved_speedup'])} | "
                  f"{exact} |")  # fmt: skip
    print("\n| arm | PAPO post-merge mean abs dlogp | p99 | weight mean | post-merge token share | wall s |")
    print("|---|---|---|---|---|---|")
    for r in results:
        c = r["correction"]
        print(f"| {r['arm']} | {num(c.get('post_merge_abs_logp_diff_mean'), '.2e')} | "
              f"{num(c.get('post_merge_abs_logp_diff_p99'), '.2e')} | {num(c.get('post_merge_is_weight_mean'), '.4f')} | "
              f"{num(c.get('post_merge_token_frac'), '.3f')} | {sum(r['wall_s'].values()):.0f} |")  # fmt: skip


if __name__ == "__main__":
    raise SystemExit(main())
