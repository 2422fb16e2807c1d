"""End to end: a fresh clone runs every stage of the tiny profile through Prefect and DVC.

The stages run for real (same code, same files, same checks) with smaller budgets than `make run` so the
suite stays within CI time: the full-size run and its learning targets are `make run`'s job (its metrics
are reported per stage). After the run, `dvc repro` must find nothing to do, and changing one stage's
param must make exactly that stage stale.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

# The suite's per-test timeout (1500 s) is too tight for this run on 2 AVX2 cores, where the trainers compute
# in fp32 (run.autocast: auto) and the whole run is slower than on AVX512-BF16 cores (issue 43); CI stops at
# 90 minutes, and this test has its own limits below.
pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(3300)]

BIN = Path(sys.executable).parent
# Smaller budgets, same stages. The seed is the committed tiny instruct checkpoint (the stage materialises
# it), so even a short run yields accepted trajectories for the warmup stages.
SMALL = [
    "sample_orz.n=600",
    "sample_orz.test_n=40",
    "sample_orz.val_n=40",
    "sample_orz.synthetic_pool=2000",
    "seed.eval_n=40",
    "npr_zero.steps=3",
    "npr_zero.eval_n=40",
    "npr_zero.eval_every=3",
    "npr_zero.save_every=3",
    "distill.n_problems=120",
    "distill.target_accepted=40",
    "distill.k=2",
    "reject_filter.min_acceptance_rate=0.0",
    "parallel_warmup.max_steps=2",
    "sequential_warmup.max_steps=2",
    "papo_rl.steps=2",
    "papo_rl.eval_n=40",
    "papo_rl.eval_every=2",
    "papo_rl.save_every=2",
    "sr_rl.steps=2",
    "sr_rl.eval_n=40",
    "sr_rl.eval_every=2",
    "sr_rl.save_every=2",
    "evaluate.speedup.max_problems=8",
    "pr1_coldstart.max_steps=4",
    "pr1_coldstart.data.n=128",
    "pr1_rl.steps=2",
    "pr1_rl.eval_n=40",
    "pr1_rl.eval_every=2",
    "pr1_rl.save_every=2",
]


def _run(cmd: list[str], cwd: Path, timeout: int = 1800) -> subprocess.CompletedProcess:
    # a fresh user's shell: Prefect's API is the one `npr run` starts (the clone's own PREFECT_HOME), never a
    # server the suite's process was pointed at
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", PREFECT_HOME=str(cwd / ".prefect"))
    proc = subprocess.run(cmd, cwd=cwd, env=env, text=True, capture_output=True, timeout=timeout, check=False)
    assert proc.returncode == 0, f"{' '.join(cmd)} failed:\n{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
    return proc


def _stale(repo: Path) -> set[str]:
    out = _run([str(BIN / "dvc"), "status", "--json"], repo).stdout
    return {name.split(":")[-1] for name in json.loads(out or "{}")}


@pytest.fixture(scope="module")
def clone(tmp_path_factory: pytest.TempPathFactory, repo_root: Path) -> Path:
    repo = tmp_path_factory.mktemp("e2e") / "repo"
    _run(["git", "clone", "-q", str(repo_root), str(repo)], repo_root)
    yield repo
    shutil.rmtree(repo, ignore_errors=True)


def test_tiny_pipeline_end_to_end(clone: Path) -> None:
    _run([str(BIN / "npr"), "data", "fetch"], clone)
    overrides = [a for o in SMALL for a in ("--set", o)]
    proc = _run([str(BIN / "npr"), "run", "--profile", "tiny", *overrides], clone, timeout=3000)
    stages = list(yaml.safe_load((clone / "dvc.yaml").read_text())["stages"])
    for name in stages:
        assert (clone / "artifacts" / name / "metrics.json").exists(), f"{name} wrote no metrics"
    assert f"Task run 'stage-{stages[-1]}" in proc.stdout + proc.stderr
    assert "report: artifacts/evaluate/report/report.md" in proc.stdout
    report = (clone / "artifacts/evaluate/report/report.md").read_text()
    assert "papo_rl" in report and "pr1_rl" in report and "tiny_test" in report
    _check_metrics_and_plots(clone, stages)

    # nothing to do the second time
    assert _stale(clone) == set()
    rerun = _run([str(BIN / "dvc"), "repro"], clone)
    assert "Running stage" not in rerun.stdout

    # one param changed: DVC reports exactly that stage (nothing upstream); the stages after it rerun
    # because their deps, its outputs, then change
    params = yaml.safe_load((clone / "params.yaml").read_text())
    params["distill"]["k"] = 3  # any value but the run's
    (clone / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    assert _stale(clone) == {"distill"}

    # every stage's outputs reached the default (local) remote
    assert json.loads((clone / ".dvc/tmp/npr-unpushed.json").read_text())["unpushed"] == {}


# The stages that train in this run: the tiny profile's seed stage materialises the committed checkpoint
# (its train curve is an empty file; with models.base_model: tiny it trains and has one).
TRAINING_STAGES = ("npr_zero", "parallel_warmup", "sequential_warmup", "papo_rl", "sr_rl")


def _check_metrics_and_plots(clone: Path, stages: list[str]) -> None:
    """Every stage wrote its flat DVC metrics; every training stage its curves; `npr plots` renders offline."""
    for name in stages:
        assert (clone / "metrics" / (name if name == "evaluate" else f"{name}.json")).exists(), name
    shown = json.loads(_run([str(BIN / "dvc"), "metrics", "show", "--json"], clone).stdout)[""]["data"]

    def keys(d: dict, prefix: str = "") -> set[str]:
        return {
            k2
            for k, v in d.items()
            for k2 in (keys(v, f"{prefix}{k}.") if isinstance(v, dict) else {prefix + k})
        }

    files = {path: v["data"] for path, v in shown.items() if "data" in v}
    assert len(files) == len(stages) - 1 + len(list((clone / "metrics/evaluate").glob("*.json")))
    columns = set().union(*(keys(d) for d in files.values()))
    assert len(columns) < 45, sorted(columns)  # one readable table, not 1,257 columns
    for name in TRAINING_STAGES:
        assert json.loads((clone / "plots" / name / "train.json").read_text()), name
    assert json.loads((clone / "plots/seed/train.json").read_text()) == []  # materialised, not trained
    assert json.loads((clone / "plots/papo_rl/eval.json").read_text())
    _run([str(BIN / "npr"), "plots", "show", "-o", "plots_html"], clone)
    page = (clone / "plots_html/index.html").read_text()
    assert "<script src" not in page and "papo_rl" in page
