"""How long `dvc repro` takes when nothing changed (target <= 3 s), next to `dvc status` and a bare
`dvc --version` (process start-up), measured side by side in one run.

Run from the repository root after `make run` (then it times the real, complete pipeline in place), or on
a fresh checkout (then it runs `sample_orz` once in a temporary clone and times the no-op there):
``.venv/bin/python benchmarks/bench_dvc_noop.py [--repeats 3]``; ``--smoke`` (benchmarks/_smoke.py): one
repeat, and a temporary clone's `sample_orz` samples 240 problems instead of the profile's 8,400.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._smoke import parse_args  # noqa: E402

DVC = str(Path(sys.executable).with_name("dvc"))
TARGET_S = 3.0
# --smoke: a temporary clone's sample_orz, small
SMALL_SAMPLE = ["sample_orz.n=200", "sample_orz.val_n=20", "sample_orz.test_n=20", "sample_orz.synthetic_pool=400"]


def timed(cmd: list[str], cwd: Path) -> float:
    start = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{proc.stdout}\n{proc.stderr}")
    return elapsed


def up_to_date(cwd: Path) -> bool:
    proc = subprocess.run([DVC, "status", "--json"], cwd=cwd, capture_output=True, text=True, check=False)
    return proc.returncode == 0 and proc.stdout.strip() in ("{}", "")


def workdir(small: bool = False) -> tuple[Path, list[str], Path | None]:
    here = Path.cwd()
    if Path("artifacts/evaluate/metrics.json").exists() and up_to_date(here):
        return here, [], None
    tmp = Path(tempfile.mkdtemp(prefix="bench-dvc-"))
    subprocess.run(["git", "clone", "-q", str(here), str(tmp / "repo")], check=True)
    repo = tmp / "repo"
    if small:
        from components.config import load_config, write_params

        params = repo / "params.yaml"
        write_params(load_config(params, overrides=SMALL_SAMPLE, root=repo), params)
    env_bin = str(Path(sys.executable).parent)
    subprocess.run(f"PATH={env_bin}:$PATH npr data fetch && PATH={env_bin}:$PATH {DVC} repro sample_orz",
                   shell=True, cwd=repo, check=True, capture_output=True)
    return repo, ["sample_orz"], tmp


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parse_args(parser, None, repeats=1)
    repeats = args.repeats
    repo, targets, cleanup = workdir(small=args.smoke)
    try:
        scope = "whole pipeline" if not targets else f"stage(s) {', '.join(targets)} in a temp clone"
        rows = {
            "dvc --version (start-up)": [timed([DVC, "--version"], repo) for _ in range(repeats)],
            "dvc status": [timed([DVC, "status", *targets], repo) for _ in range(repeats)],
            "dvc repro (no-op)": [timed([DVC, "repro", *targets], repo) for _ in range(repeats)],
        }
        print(f"# dvc no-op timing ({scope}), median of {repeats}")
        base = statistics.median(rows["dvc --version (start-up)"])
        for name, times in rows.items():
            med = statistics.median(times)
            print(f"{name:<28} {med:6.2f} s   x{med / base:5.2f} of start-up")
        noop = statistics.median(rows["dvc repro (no-op)"])
        verdict = "OK" if noop <= TARGET_S else "OVER TARGET"
        print(f"dvc repro no-op / target {TARGET_S:.1f} s = {noop / TARGET_S:.2f}  [{verdict}]")
    finally:
        if cleanup:
            shutil.rmtree(cleanup, ignore_errors=True)


if __name__ == "__main__":
    main()
