"""benchmarks/bench_recipe.py --seeds / --from-dirs on a stand-in repository whose `make run` writes a
metrics.json from its SET in a blink: the clones, the seed overrides, resume after a failure, the aggregate."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parents[3] / "benchmarks" / "bench_recipe.py"

# `make run` of the stand-in: avg@2 of papo_rl = 0.40 + 0.02 x npr_zero's seed (0 when SET has none);
# FAKE_FAIL=K fails the run whose seed is K
FAKE_RUN = """
import json, os, pathlib, sys
sets = dict(item.split("=", 1) for item in os.environ.get("SET", "").split())
seed = int(sets.get("npr_zero.seed", 0))
pathlib.Path("set.txt").write_text(os.environ.get("SET", ""))
if os.environ.get("FAKE_FAIL") == str(seed):
    sys.exit(3)
bench = {"n_problems": 200, "n_samples": 2, "accuracy": 0.40 + 0.02 * seed, "format_valid_rate": 0.99,
         "parallel_rate": 0.99, "ideal_speedup": 2.1}
metrics = {"settings": {"sampling": {"seed": 0}}, "recipe": {"benchmark": "tiny_test"},
           "checkpoints": {"papo_rl": {"benchmarks": {"tiny_test": bench}, "speedup": {"achieved_speedup": 2.0}}}}
out = pathlib.Path("artifacts/evaluate")
out.mkdir(parents=True, exist_ok=True)
(out / "metrics.json").write_text(json.dumps(metrics))
"""
MAKEFILE = "PROFILE ?= tiny\nSET ?=\nexport SET\nrun:\n\tpython3 fake_run.py\n"


def _bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_recipe", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture()
def repo(tmp_path: Path, repo_root: Path) -> Path:
    """A git repository with the tiny profile (and its prompts) and the stand-in `make run`."""
    repo = tmp_path / "repo"
    (repo / "configs").mkdir(parents=True)
    shutil.copy(repo_root / "configs" / "tiny.yaml", repo / "configs" / "tiny.yaml")
    shutil.copytree(repo_root / "prompts", repo / "prompts")
    (repo / "fake_run.py").write_text(FAKE_RUN)
    (repo / "Makefile").write_text(MAKEFILE)
    (repo / ".gitignore").write_text("artifacts/\nset.txt\n")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "stand-in"], cwd=repo, check=True)
    return repo


def _spread(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def test_seeds_run_fresh_clones_with_shifted_seeds_and_aggregate(tmp_path: Path, repo: Path) -> None:
    bench = _bench()
    work, out = tmp_path / "work", tmp_path / "spread.json"
    args = ["--seeds", "3", "--workdir", str(work), "--repo", str(repo), "--json", str(out)]
    assert bench.main(args) == 0
    spread = _spread(out)
    acc = spread["checkpoints"]["papo_rl"]["metrics"]["accuracy"]
    assert acc["values"] == pytest.approx([0.40, 0.42, 0.44])
    assert acc["mean"] == pytest.approx(0.42) and acc["spread"] == pytest.approx(0.04)
    assert [r["offset"] for r in spread["runs"]] == [0, 1, 2]
    assert all(r["make_run_minutes"] is not None for r in spread["runs"])
    records = [json.loads((work / f"seed-{i}.run.json").read_text()) for i in range(3)]
    assert records[0]["overrides"] == []  # seed 0 is the committed recipe
    assert "npr_zero.seed=1" in records[1]["overrides"] and "run.seed=1" in records[1]["overrides"]
    assert not any(o.startswith(("sample_orz.", "evaluate.")) for o in records[2]["overrides"])
    # without --keep the clones are gone, their metrics.json kept; a second call reruns nothing
    assert not (work / "seed-0").exists() and (work / "seed-0.metrics.json").exists()
    logs = [(work / f"seed-{i}.log").read_text() for i in range(3)]
    assert bench.main(args) == 0
    assert [(work / f"seed-{i}.log").read_text() for i in range(3)] == logs
    assert _spread(out) == spread


def test_a_failed_seed_resumes_in_its_clone_and_from_dirs_aggregates_kept_ones(
    tmp_path: Path, repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bench = _bench()
    work = tmp_path / "work"
    args = ["--seeds", "3", "--workdir", str(work), "--repo", str(repo), "--keep"]
    monkeypatch.setenv("FAKE_FAIL", "1")
    assert bench.main(args) == 1
    assert (work / "seed-0" / "artifacts/evaluate/metrics.json").exists()
    assert (
        json.loads((work / "seed-1.run.json").read_text())["attempts"][0]["returncode"] == 2
    )  # make, its recipe failing
    assert not (work / "seed-2").exists()
    monkeypatch.delenv("FAKE_FAIL")
    assert bench.main(args) == 0
    assert len(json.loads((work / "seed-0.run.json").read_text())["attempts"]) == 1  # reused
    assert len(json.loads((work / "seed-1.run.json").read_text())["attempts"]) == 2  # resumed
    assert (work / "seed-1" / "set.txt").read_text().startswith("run.seed=1 ")
    out = tmp_path / "from-dirs.json"
    dirs = [str(work / f"seed-{i}") for i in range(3)]
    assert bench.main(["--from-dirs", *dirs, "--json", str(out)]) == 0
    spread = _spread(out)
    assert spread["checkpoints"]["papo_rl"]["metrics"]["accuracy"]["values"] == pytest.approx(
        [0.40, 0.42, 0.44]
    )
    assert [r["offset"] for r in spread["runs"]] == [0, 1, 2]  # from the records beside the workspaces
    assert all(len(r["commit"]) == 40 for r in spread["runs"])


def test_from_dirs_names_a_workspace_without_an_evaluation(tmp_path: Path, capsys: Any) -> None:
    assert _bench().main(["--from-dirs", str(tmp_path)]) == 1
    assert f"{tmp_path}: no finished evaluation" in capsys.readouterr().err
