"""How long `dvc repro` takes when nothing changed (target <= 3 s), next to `dvc status` and a bare
`dvc --version` (process start-up), measured side by side in one run.

Run from the repository root after `make run` (then it times the real, complete pipeline in place), or on
a fresh checkout (then it runs `sample_orz` once in a temporary clone and times the no-op there).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

DVC = str(Path(sys.executable).with_name("dvc"))
TARGET_S = 3.0
REPEATS = 3


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


def workdir() -> tuple[Path, list[str], Path | None]:
    here = Path.cwd()
    if Path("artifacts/evaluate/metrics.json").exists() and up_to_date(here):
        return here, [], None
    tmp = Path(tempfile.mkdtemp(prefix="bench-dvc-"))
    subprocess.run(["git", "clone", "-q", str(here), str(tmp / "repo")], check=True)
    repo = tmp / "repo"
    env_bin = str(Path(sys.executable).parent)
    subprocess.run(f"PATH={env_bin}:$PATH npr data fetch && PATH={env_bin}:$PATH {DVC} repro sample_orz",
                   shell=True, cwd=repo, check=True, capture_output=True)
    return repo, ["sample_orz"], tmp


def main() -> None:
    repo, targets, cleanup = workdir()
    try:
        scope = "whole pipeline" if not targets else f"stage(s) {', '.join(targets)} in a temp clone"
        rows = {
            "dvc --version (start-up)": [timed([DVC, "--version"], repo) for _ in range(REPEATS)],
            "dvc status": [timed([DVC, "status", *targets], repo) for _ in range(REPEATS)],
            "dvc repro (no-op)": [timed([DVC, "repro", *targets], repo) for _ in range(REPEATS)],
        }
        print(f"# dvc no-op timing ({scope}), median of {REPEATS}")
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
