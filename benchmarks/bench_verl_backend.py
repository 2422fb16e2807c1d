"""A tiny RL stage through verl's main_ppo on CPU against the local trainer, side by side in one run.

The same stage, the same starting model (the committed seed ``models/tiny-instruct``, for every stage),
the same problems (``npr stage sample_orz`` of the tiny profile, run once here) and the same settings from the tiny
profile, run with ``<stage>.backend: local`` and ``verl`` through ``npr stage`` in two scratch
repositories, alternately, ``--repeats`` times. Prints per backend the stage's wall time (median), its
held-out accuracy and format-valid rate after training (verl: its own validation; local: the trainer's
evaluation; both on the val split, ``eval_n`` x ``eval_samples``), and the time ratio verl / local.

    .venv/bin/python benchmarks/bench_verl_backend.py [--stage npr_zero] [--steps N] [--repeats 1] \\
        [--set section.key=value ...] [--smoke]

``--set`` overrides the tiny profile in both repositories. ``--smoke`` (benchmarks/_smoke.py): one step of 2
prompts x 2 rollouts (no dynamic sampling), 4 held-out problems once, from a 240-problem ``sample_orz``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks._smoke import parse_args  # noqa: E402
from components.config import dump_yaml, load_config, rl_stages  # noqa: E402

# --smoke's sizes ({stage}: the benchmarked stage)
SMOKE_SETS = [
    "{stage}.prompts_per_step=2", "{stage}.group_size=2", "{stage}.eval_n=4", "{stage}.eval_samples=1",
    "{stage}.dynamic_sampling=false",
    "sample_orz.n=200", "sample_orz.val_n=20", "sample_orz.test_n=20", "sample_orz.synthetic_pool=400",
]  # fmt: skip


def make_repo(root: Path, stage: str, backend: str, extra: list[str], problems: Path | None) -> Path:
    """A repository with the stage's inputs: the tiny profile's problems (``npr stage sample_orz`` here
    when ``problems`` is None) and the committed seed as the starting model."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    (root / "prompts").symlink_to(REPO / "prompts")
    (root / "models").symlink_to(REPO / "models")
    cfg = load_config(profile="tiny", overrides=[f"{stage}.backend={backend}", *extra])
    (root / "params.yaml").write_text(dump_yaml(cfg))
    if problems is None:
        run(root, "sample_orz")
    else:
        shutil.copytree(problems, root / "artifacts" / "sample_orz" / "problems")
    # the committed seed stands in for the model the stage starts from (its own init_from)
    init_from = getattr(cfg, stage).init_from
    shutil.copytree(REPO / "models" / "tiny-instruct", root / "artifacts" / init_from / "model")
    return root


def run(root: Path, stage: str) -> tuple[float, dict]:
    env = {k: v for k, v in os.environ.items() if k not in ("WANDB_API_KEY", "RAY_ADDRESS")}
    env.update(PYTHONPATH=str(REPO), WANDB_MODE="offline", WANDB_DIR=str(root / "wandb"), OMP_NUM_THREADS="1",
               NPR_TORCH_THREADS="1", HF_HUB_OFFLINE="1", NPR_PROGRESS="off")
    start = time.perf_counter()
    proc = subprocess.run([str(Path(sys.executable).with_name("npr")), "stage", stage], cwd=root, env=env,
                          capture_output=True, text=True)
    wall = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{stage} failed in {root}:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    return wall, json.loads((root / "artifacts" / stage / "metrics.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", default="npr_zero", choices=sorted(rl_stages()))
    parser.add_argument("--steps", type=int, default=None, help="training steps (default: the tiny profile's)")
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--set", dest="sets", action="append", default=[], help="section.key=value, both backends")
    args = parse_args(parser, None, steps=1)
    extra = [] if args.steps is None else [f"{args.stage}.steps={args.steps}", f"{args.stage}.eval_every={args.steps}"]
    if args.smoke:
        extra += [s.format(stage=args.stage) for s in SMOKE_SETS]
    extra += args.sets
    results: dict[str, list[tuple[float, dict]]] = {"local": [], "verl": []}
    problems: Path | None = None
    with tempfile.TemporaryDirectory(prefix="bench-verl-") as tmp:
        for r in range(args.repeats):
            for backend in ("local", "verl"):
                root = make_repo(Path(tmp) / f"{backend}-{r}", args.stage, backend, extra, problems)
                problems = problems or root / "artifacts" / "sample_orz" / "problems"
                results[backend].append(run(root, args.stage))
                wall, metrics = results[backend][-1]
                print(f"{backend:5s} run {r + 1}: {wall:7.1f} s, accuracy {metrics.get('final/accuracy')}, "
                      f"format-valid {metrics.get('final/format_valid')}", flush=True)
    med = {b: statistics.median(w for w, _ in runs) for b, runs in results.items()}
    print(f"\n{args.stage}, {args.repeats} run(s) each, tiny profile, 2 cores")
    print(f"{'backend':8s} {'wall s':>8s} {'accuracy':>9s} {'format-valid':>13s}")
    for backend, runs in results.items():
        acc = statistics.mean(m.get("final/accuracy", float("nan")) for _, m in runs)
        fv = statistics.mean(m.get("final/format_valid", float("nan")) for _, m in runs)
        print(f"{backend:8s} {med[backend]:8.1f} {acc:9.3f} {fv:13.3f}")
    print(f"\nverl / local wall time: {med['verl'] / med['local']:.2f}x")


if __name__ == "__main__":
    main()
