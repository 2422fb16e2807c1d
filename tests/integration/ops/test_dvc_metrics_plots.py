"""What a user compares and looks at, through DVC's own commands on a copy of this repository.

- A real stage (sample_orz, the cheapest) through `dvc repro`, then an experiment through
  `dvc exp run -S ...`: the flat metrics file is committed with the experiment, `dvc exp show` and
  `dvc metrics diff` show the change, and `dvc metrics show` is a small table (no provenance columns).
- `dvc plots show` over rows written by our writers (training curves from trainer logs, the evaluation's
  per-checkpoint bars): one HTML file with no external script, the data inside; in headless Chromium
  (when installed; `apt-get install -y chromium`) every plot is drawn as SVG with its labels.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from ops_testing import VENV_BIN, copy_checkout, git_commit, run

pytestmark = [pytest.mark.integration, pytest.mark.slow]

SMALL = ["sample_orz.synthetic_pool=1500", "sample_orz.n=400", "sample_orz.test_n=50", "sample_orz.val_n=20"]


def _dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    return run([str(VENV_BIN / "dvc"), *args], repo)


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = copy_checkout(tmp_path_factory.mktemp("dvc_metrics") / "repo")
    run([str(VENV_BIN / "npr"), "data", "fetch"], root)
    run([str(VENV_BIN / "npr"), "config", "use", "tiny", *[a for o in SMALL for a in ("--set", o)]], root)
    _dvc(root, "repro", "sample_orz")
    git_commit(root, "sample_orz baseline")
    return root


def test_stage_writes_a_flat_git_tracked_metrics_file(repo: Path) -> None:
    flat = json.loads((repo / "metrics/sample_orz.json").read_text())
    assert flat["n_train"] == 400 and flat["n_test"] == 50 and flat["rows_in"] == 1500
    assert all(isinstance(v, int | float) for v in flat.values()), flat  # flat numbers only
    assert "wall_time_s" in flat and "provenance" not in flat
    record = json.loads((repo / "artifacts/sample_orz/metrics.json").read_text())
    assert record["provenance"]["stage"] == "sample_orz"  # provenance stays in the stage's record
    tracked = run(["git", "ls-files", "metrics"], repo).stdout.split()
    # committed with dvc.lock, as DVC's example project does: every stage's file (the repository's make run)
    assert "metrics/sample_orz.json" in tracked and "metrics/papo_rl.json" in tracked
    shown = json.loads(_dvc(repo, "metrics", "show", "--json").stdout)
    files = {path: v for path, v in shown[""]["data"].items() if "data" in v}
    assert files["metrics/sample_orz.json"]["data"]["n_train"] == 400  # this repro's, committed just now
    assert len(files["metrics/sample_orz.json"]["data"]) < 12  # a readable row, not 1,257 columns


def test_exp_run_then_exp_show_and_metrics_diff_show_the_change(repo: Path) -> None:
    _dvc(repo, "exp", "run", "-S", "sample_orz.n=300", "sample_orz")
    exps = json.loads(_dvc(repo, "exp", "show", "--json").stdout)
    # the baseline commit and its experiment, each with its own committed metrics
    values = {}
    for commit in exps:
        for exp in [commit, *(e for ex in commit.get("experiments") or [] for e in ex["revs"])]:
            data = exp.get("data") or {}
            row = data.get("metrics", {}).get("metrics/sample_orz.json", {}).get("data")
            if row is not None and exp.get("rev") != "workspace":
                values[exp["rev"]] = (
                    data["params"]["params.yaml"]["data"]["sample_orz"]["n"],
                    row["n_train"],
                )
    assert sorted(values.values()) == [(300, 300), (400, 400)], exps
    exp_name = _dvc(repo, "exp", "list", "--name-only").stdout.split()[0]
    diff = json.loads(_dvc(repo, "metrics", "diff", "HEAD", exp_name, "--json").stdout)
    change = diff["metrics/sample_orz.json"]["n_train"]
    assert (change["old"], change["new"], change["diff"]) == (400, 300, -100)
    text = _dvc(repo, "metrics", "diff", "HEAD", exp_name).stdout
    assert "n_train" in text and "-100" in text


def _plot_rows(repo: Path) -> None:
    """Plot rows for every plot dvc.yaml defines, from our own writers and trainer-shaped logs."""
    from components.evaluation.plots import write_plot_data
    from components.reporting import write_training_curves

    for stage in ("seed", "parallel_warmup", "sequential_warmup"):
        work = repo / "work" / stage
        work.mkdir(parents=True)
        history = [{"step": s, "loss": 3.0 / s, "lr": 1e-3, "grad_norm": 1.0} for s in range(1, 6)]
        (work / "train_metrics.json").write_text(json.dumps({"settings": {}, "history": history}))
        write_training_curves(work, repo / "plots" / stage)
    for k, stage in enumerate(("npr_zero", "papo_rl", "sr_rl")):
        work = repo / "work" / stage
        work.mkdir(parents=True)
        lines = [{"step": 0, "eval": {"step": 0, "accuracy": 0.1, "format_valid": 0.2}}]
        for s in range(1, 4):
            # sr_rl's step 2 made no update (every group dropped): no reward, no loss that step
            no_update = stage == "sr_rl" and s == 2
            rec = {} if no_update else {"reward/mean": -1 + 0.1 * s + k, "actor/pg_loss": 0.01 * s}
            rec["step"] = s
            rec |= {"rollout/format_valid": 0.3 * s, "rollout/correct_and_valid": 0.1 * s}
            lines.append(
                rec | ({"eval": {"step": s, "accuracy": 0.2, "format_valid": 0.5}} if s == 3 else {})
            )
        (work / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines))
        write_training_curves(work, repo / "plots" / stage)
    bench = {"tiny_test": {"accuracy": 0.5}}
    evaluation = {
        "checkpoints": {
            "checkpoint_alpha": {"mode": "sequential", "average_accuracy": 0.25, "benchmarks": bench,
                                 "throughput": {}},
            "checkpoint_beta": {"mode": "parallel", "average_accuracy": 0.75, "benchmarks": bench,
                                "throughput": {"achieved_speedup": 1.8, "ideal_speedup": 2.5,
                                               "tokens_per_s": 900.0, "sequential_tokens_per_s": 500.0}},
        }
    }  # fmt: skip
    write_plot_data(evaluation, repo / "plots" / "evaluate")


def _chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")


def test_plots_show_is_self_contained_and_draws_every_plot(
    repo: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import yaml

    from components.ops.plots_html import ensure_offline_template

    monkeypatch.chdir(repo)
    _plot_rows(repo)
    ensure_offline_template(repo)  # what every stage run (and `make install`, `npr plots`) does
    out = _dvc(repo, "plots", "show", "-o", "plots_html").stdout
    page = (repo / "plots_html" / "index.html").read_text()
    assert "index.html" in out
    assert "<script src" not in page and "cdn.jsdelivr" not in page  # nothing fetched when opened
    assert "checkpoint_beta" in page and "1.8" in page  # the data is in the page
    titles = [next(iter(item)) for item in yaml.safe_load((repo / "dvc.yaml").read_text())["plots"]]
    assert page.count("vegaEmbed('#") == len(titles)  # none dropped for a field missing in some rows

    browser = _chromium()
    if browser is None:
        pytest.skip("no chromium on this machine (apt-get install -y chromium): the page was not rendered")
    dom = subprocess.run(
        [browser, "--headless", "--no-sandbox", "--disable-gpu", "--virtual-time-budget=20000",
         "--dump-dom", (repo / "plots_html" / "index.html").as_uri()],
        capture_output=True, text=True, timeout=120, check=True, env={**os.environ, "HOME": str(repo)},
    ).stdout  # fmt: skip
    assert dom.count('class="marks"') == len(titles), dom[-3000:]  # every plot drawn (Vega's SVG root)
    for label in ("checkpoint_alpha", "checkpoint_beta", "achieved_speedup", "step", "reward"):
        assert label in dom, label  # axis labels and categories rendered as SVG text
