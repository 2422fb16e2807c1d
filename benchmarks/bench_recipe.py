"""The recipe table of a finished run: every checkpoint in the paper's order and the paper's claims with
paired bootstrap intervals over problems, recomputed from the evaluation's per-sample records.

Reads ``<artifacts>/evaluate/metrics.json`` (modes, pass@k, format-valid rates, the speedup decode) and
``<artifacts>/evaluate/records/<checkpoint>/<benchmark>-NNNNN.jsonl`` (one record per sample) without
re-running anything; ``--resamples`` and ``--confidence`` change the intervals only. Parallel-R1's
checkpoints are rows too, and NPR vs Parallel-R1 a comparison. Also prints the accuracy table of every
benchmark of the run and each stage's wall time from its metrics.json.

Run after ``make run``: ``.venv/bin/python benchmarks/bench_recipe.py [--artifacts artifacts]
[--benchmark tiny_test] [--resamples 2000] [--confidence 0.95]``; ``--smoke`` (benchmarks/_smoke.py): 50
resamples (it reads a finished run; ``--artifacts`` names a small one).

The seed spread (issue 27; ``components/evaluation/spread.py``): how far training alone moves these numbers.
``--seeds N --workdir DIR [--repo PATH] [--keep]`` clones the repository's committed HEAD into
``DIR/seed-<i>`` for i = 0..N-1 and times ``make run SET="<training_seed_overrides(cfg, i)>"`` in each (the
install included; seed 0 = no overrides = the committed recipe; output in ``DIR/seed-<i>.log``, the run's
record in ``DIR/seed-<i>.run.json``). A clone whose ``artifacts/evaluate/metrics.json`` exists is finished
and reused, an unfinished one is resumed, so an interrupted benchmark picks up where it stopped. Without
``--keep`` a finished clone is removed after the aggregate (its metrics.json kept as
``DIR/seed-<i>.metrics.json``). ``--from-dirs D1 D2 ...`` aggregates workspaces that already finished, running
nothing. Both print, per checkpoint of the recipe benchmark, each run's value, the mean and the spread
(max - min) of avg@n, format-valid, parallel rate, ideal and achieved speedup, and each run's `make run`
minutes; ``--json PATH`` writes the aggregate (``evaluate.seed_spread`` names the committed one):

    .venv/bin/python benchmarks/bench_recipe.py --seeds 3 --workdir ../seed-runs --json eval/seed_spread/tiny-bfloat16.json
    .venv/bin/python benchmarks/bench_recipe.py --from-dirs ../seed-runs/seed-0 ../seed-runs/seed-1 \
        ../seed-runs/seed-2 --json eval/seed_spread/tiny-bfloat16.json
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._smoke import parse_args  # noqa: E402
from components.artifacts import read_shards  # noqa: E402
from components.config import ConfigError, load_config, training_seed_overrides, training_seeds  # noqa: E402
from components.dag import load_stages  # noqa: E402
from components.evaluation.recipe import Recipe, recipe_markdown, recipe_summary  # noqa: E402
from components.evaluation.report import accuracy_table, benchmark_names  # noqa: E402
from components.evaluation.spread import (  # noqa: E402
    SeedSpreadError,
    SpreadRun,
    aggregate,
    spread_markdown,
    training_precision,
    write_seed_spread,
)

METRICS_JSON = Path("artifacts") / "evaluate" / "metrics.json"
# what the child `make run` must not inherit from this process (this checkout's code or virtualenv)
CHILD_ENV_DROP = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "MAKEFLAGS", "MAKELEVEL")


class BenchError(Exception):
    """A seed run that cannot go on: printed as one line, exit status 1."""


# ------------------------------------------------------------------------------------------- seed spread
def _git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _head(path: Path) -> str | None:
    """The commit checked out in ``path`` (None when it is not a git checkout)."""
    try:
        return _git(path, "rev-parse", "HEAD") if (path / ".git").exists() else None
    except subprocess.CalledProcessError:
        return None


def _record_path(workspace: Path) -> Path:
    return workspace.parent / f"{workspace.name}.run.json"


def _read_record(workspace: Path) -> dict[str, Any]:
    path = _record_path(workspace)
    return json.loads(path.read_text()) if path.exists() else {}


def _write_record(workspace: Path, record: dict[str, Any]) -> None:
    _record_path(workspace).write_text(json.dumps(record, indent=2) + "\n")


def _seeds_of(workspace: Path) -> dict[str, int] | None:
    """The training seeds a workspace ran with (its params.yaml), None when it cannot be read."""
    try:
        return training_seeds(load_config(workspace / "params.yaml", root=workspace))
    except ConfigError as err:
        print(f"note: {workspace}: training seeds not read ({err})", file=sys.stderr)
        return None


def _clone(repo: Path, commit: str, dest: Path) -> None:
    """A fresh clone of ``repo`` at ``commit`` in ``dest``; an existing clone of it is kept (resumed)."""
    if dest.exists():
        head = _head(dest)
        if head == commit:
            return
        if head is not None:
            raise BenchError(
                f"{dest} holds commit {head[:10]}, not {commit[:10]}: remove it or use another --workdir"
            )
        shutil.rmtree(dest)  # an interrupted clone
    subprocess.run(["git", "clone", "--quiet", str(repo), str(dest)], check=True)
    _git(dest, "reset", "--quiet", "--hard", commit)


def _make_run(clone: Path, profile: str, overrides: Sequence[str], log_path: Path) -> int:
    """``make run`` in ``clone`` (under /usr/bin/time -v where there is one), its output appended to
    ``log_path``; returns the exit status. The environment is this one less this checkout's Python paths."""
    cmd = ["make", "run", f"PROFILE={profile}", f"SET={' '.join(overrides)}"]
    timer = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    env = {k: v for k, v in os.environ.items() if k not in CHILD_ENV_DROP}
    with log_path.open("a") as log:
        log.write(f"$ cd {clone} && {shlex.join(cmd)}\n")
        log.flush()
        return subprocess.run(
            timer + cmd, cwd=clone, stdout=log, stderr=subprocess.STDOUT, env=env
        ).returncode


def _timed_run(
    clone: Path, profile: str, overrides: Sequence[str], log_path: Path, record: dict[str, Any]
) -> int:
    """``_make_run``, its wall time and exit status appended to ``record["attempts"]`` and saved, also when
    it is interrupted (a resumed run's minutes are the sum of its attempts)."""
    rc: int | None = None
    start = time.monotonic()
    try:
        rc = _make_run(clone, profile, overrides, log_path)
    finally:
        wall = time.monotonic() - start
        record["attempts"].append({"wall_s": round(wall, 1), "returncode": rc})
        with log_path.open("a") as log:
            log.write(f"# make run: exit {rc}, wall {wall / 60:.1f} min\n")
        _write_record(clone, record)
    return rc


def run_seeds(
    n: int, workdir: Path, repo: Path, profile: str, keep: bool
) -> tuple[list[dict[str, Any]], list[SpreadRun], list[Path]]:
    """The N seed runs (each reused when finished, resumed when started); returns their metrics, their
    descriptions and, without ``keep``, the finished clones to remove once the aggregate is out."""
    commit = _git(repo, "rev-parse", "HEAD")
    if _git(repo, "status", "--porcelain", "--untracked-files=no"):
        print(f"note: {repo} has uncommitted changes; the clones run its HEAD {commit[:10]}", file=sys.stderr)
    workdir.mkdir(parents=True, exist_ok=True)
    metrics, runs, clones = [], [], []
    for i in range(n):
        clone = workdir / f"seed-{i}"
        kept_metrics = workdir / f"seed-{i}.metrics.json"
        log_path = workdir / f"seed-{i}.log"
        record = _read_record(clone)
        if (
            kept_metrics.exists() and not clone.exists()
        ):  # finished, its clone removed by an earlier benchmark
            if record.get("commit") != commit:
                raise BenchError(
                    f"{kept_metrics} is of commit {str(record.get('commit'))[:10]}, not {commit[:10]}: "
                    "remove it or use another --workdir"
                )
            print(f"seed {i}: finished earlier ({kept_metrics})", file=sys.stderr)
        elif (clone / METRICS_JSON).exists() and _head(clone) == commit:
            print(f"seed {i}: finished earlier ({clone})", file=sys.stderr)
        else:
            _clone(repo, commit, clone)
            overrides = training_seed_overrides(
                load_config(clone / "configs" / f"{profile}.yaml", root=clone), i
            )
            earlier = record.get("attempts", []) if record.get("commit") == commit else []
            record = {"offset": i, "commit": commit, "overrides": overrides, "attempts": earlier}
            print(f"seed {i}: make run SET={shlex.quote(' '.join(overrides))} in {clone}", file=sys.stderr)
            rc = _timed_run(clone, profile, overrides, log_path, record)
            if rc != 0 or not (clone / METRICS_JSON).exists():
                raise BenchError(f"seed {i}: make run exited {rc}, no {METRICS_JSON} (see {log_path})")
        if clone.exists():
            shutil.copyfile(clone / METRICS_JSON, kept_metrics)
            if record.get("seeds") is None:  # the seeds it trained with, as its params.yaml says
                record["seeds"] = _seeds_of(clone)
                _write_record(clone, record)
            if not keep:
                clones.append(clone)
        metrics.append(json.loads(kept_metrics.read_text()))
        runs.append(_spread_run(clone, record, metrics[-1]))
    return metrics, runs, clones


def _spread_run(workspace: Path, record: dict[str, Any], eval_metrics: dict[str, Any]) -> SpreadRun:
    walls = [a["wall_s"] for a in record.get("attempts", []) if a.get("wall_s") is not None]
    return SpreadRun(
        # the workdir and the clone's name, not this machine's absolute path (the file is committed)
        source=f"{workspace.parent.name}/{workspace.name}",
        offset=record.get("offset"),
        commit=record.get("commit") or _head(workspace),
        make_run_minutes=round(sum(walls) / 60, 2) if walls else None,
        seeds=record.get("seeds"),
        precision=training_precision(eval_metrics),
    )


def from_dirs(dirs: Sequence[Path]) -> tuple[list[dict[str, Any]], list[SpreadRun]]:
    """Finished workspaces' metrics and descriptions (a ``<dir>.run.json`` beside one, as ``--seeds`` writes
    it, gives its seed offset and `make run` minutes); runs nothing."""
    metrics, runs = [], []
    for d in dirs:
        path = d / METRICS_JSON
        if not path.exists():
            raise BenchError(f"{d}: no finished evaluation ({path} does not exist)")
        metrics.append(json.loads(path.read_text()))
        record = _read_record(d)
        if "seeds" not in record and (d / "params.yaml").exists():
            record["seeds"] = _seeds_of(d)
        run = _spread_run(d, record, metrics[-1])
        runs.append(run.model_copy(update={"commit": _head(d) or run.commit}))
    return metrics, runs


def _notes(runs: Sequence[SpreadRun]) -> None:
    """What a reader of the spread should know about the runs (stderr)."""
    commits = {r.commit for r in runs if r.commit}
    if len(commits) > 1:
        print(
            f"note: the runs are of {len(commits)} commits; the spread holds code changes too",
            file=sys.stderr,
        )
    for i, a in enumerate(runs):
        for b in runs[i + 1 :]:
            if a.seeds is not None and a.seeds == b.seeds:
                print(f"note: {a.source} and {b.source} trained with the same seeds", file=sys.stderr)


def _recipe() -> Recipe:
    """The paper's comparison as this checkout's params.yaml states it (evaluate.recipe_*)."""
    return Recipe.of(load_config(ROOT / "params.yaml", root=ROOT).evaluate)


def spread_main(args: argparse.Namespace) -> int:
    clones: list[Path] = []
    try:
        if args.from_dirs:
            metrics, runs = from_dirs(args.from_dirs)
        else:
            metrics, runs, clones = run_seeds(args.seeds, args.workdir, args.repo, args.profile, args.keep)
        benchmark = args.benchmark or (metrics[0].get("recipe") or {}).get("benchmark")
        if benchmark is None:
            raise BenchError("the first run's metrics.json names no recipe benchmark: pass --benchmark")
        spread = aggregate(metrics, benchmark, _recipe(), runs)
    except (BenchError, SeedSpreadError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 1
    _notes(runs)
    print(f"# Seed spread of the recipe on {benchmark}\n")
    print(spread_markdown(spread))
    if args.json is not None:
        write_seed_spread(spread, args.json)
        print(f"\nwrote {args.json}", file=sys.stderr)
    for clone in clones:  # finished, their metrics.json kept beside them
        shutil.rmtree(clone)
        print(f"removed {clone} (--keep keeps it)", file=sys.stderr)
    return 0


def _parse(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--artifacts", type=Path, default=ROOT / "artifacts")
    parser.add_argument(
        "--benchmark", default=None, help="default: tiny_test; the spread: the runs' recipe benchmark"
    )
    parser.add_argument("--resamples", type=int, default=2000)
    parser.add_argument("--confidence", type=float, default=0.95)
    parser.add_argument("--seed", type=int, default=0)
    spread = parser.add_argument_group("seed spread (issue 27)")
    spread.add_argument(
        "--seeds", type=int, help="train and evaluate N fresh clones with shifted training seeds"
    )
    spread.add_argument("--workdir", type=Path, help="where --seeds puts its clones, logs and records")
    spread.add_argument("--repo", type=Path, default=ROOT, help="whose committed HEAD --seeds clones")
    spread.add_argument("--profile", default="tiny", help="the profile --seeds runs (make run PROFILE=...)")
    spread.add_argument("--keep", action="store_true", help="keep the clones of --seeds after the aggregate")
    spread.add_argument(
        "--from-dirs", nargs="+", type=Path, help="aggregate finished workspaces, run nothing"
    )
    spread.add_argument(
        "--json", type=Path, help="write the aggregate here (e.g. eval/seed_spread/tiny-bfloat16.json)"
    )
    args = parse_args(parser, argv, resamples=50)
    if args.seeds is not None and args.from_dirs:
        parser.error("--seeds and --from-dirs exclude each other")
    if args.seeds is not None and (args.seeds < 1 or args.workdir is None):
        parser.error("--seeds needs N >= 1 and --workdir DIR")
    if args.seeds is None and (args.workdir is not None or args.keep):
        parser.error("--workdir and --keep go with --seeds")
    if args.json is not None and args.seeds is None and not args.from_dirs:
        parser.error("--json writes the aggregate of --seeds or --from-dirs")
    return args


# ------------------------------------------------------------------------------------------ one finished run
def main(argv: Sequence[str] | None = None) -> int:
    args = _parse(argv)
    if args.seeds is not None or args.from_dirs:
        return spread_main(args)
    args.benchmark = args.benchmark or "tiny_test"
    metrics_path = args.artifacts / "evaluate" / "metrics.json"
    if not metrics_path.exists():
        print(
            f"no finished evaluation at {metrics_path}: run `make run` (or `dvc repro`) first",
            file=sys.stderr,
        )
        return 2
    metrics = json.loads(metrics_path.read_text())
    records_dir = args.artifacts / "evaluate" / "records"
    records = {
        name: {args.benchmark: read_shards(records_dir / name, stem=args.benchmark)}
        for name in metrics["checkpoints"]
        if list((records_dir / name).glob(f"{args.benchmark}-*.jsonl"))
    }
    summary = recipe_summary(
        metrics, records, args.benchmark, _recipe(), args.confidence, args.resamples, args.seed
    )
    print(f"# Recipe on {args.benchmark}\n")
    print(recipe_markdown(summary))
    print(f"\n# Every benchmark of the run ({', '.join(benchmark_names(metrics))})\n")
    print(accuracy_table(metrics))
    print("\n# Stage wall times (each stage's metrics.json)\n")
    print("| stage | wall s |\n|---|---|")
    total = 0.0
    for stage in load_stages(ROOT / "dvc.yaml"):  # every stage of the DAG, in its order
        path = args.artifacts / stage / "metrics.json"
        if path.exists():
            wall = json.loads(path.read_text()).get("wall_time_s")
            if wall is not None:
                total += float(wall)
            print(f"| {stage} | {'–' if wall is None else f'{float(wall):.0f}'} |")
    print(f"| sum | {total:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
