"""Every script in ``benchmarks/`` runs, at its smoke size, and prints its table (issue 46).

docs/results.md and the README cite numbers from these scripts; a script that cannot run can no longer
check them. Each runs here as a user runs it (``.venv/bin/python benchmarks/<script> --smoke``, a
subprocess from the checkout's root) and must exit 0 and print its table's header and rows. ``--smoke``
(``benchmarks/_smoke.py``) keeps each script's whole path (every function and lazy import its full run
reaches) on a few items with one repeat, so a removed import target or a renamed function fails here.

The scripts that read a finished run get ``small_run``: a workspace holding, small, what they read of one
(sample_orz's problems, the committed seed as ``seed`` and as NPR-Beta, reject_filter's accepted traces,
an ``npr eval`` of NPR-Beta with its per-sample records).

``test_every_benchmark_is_run_by_the_suite`` is the one place that says every file in ``benchmarks/`` is
covered: here (``SMOKES``) or, for the GPU node's smoke and its wheel bundle, by the test named in
``COVERED_ELSEWHERE``. A new file without an entry fails it, and ``test_benchmark_smoke`` is parametrized
over the folder's files, not over ``SMOKES``, so a new script fails there too.

The scripts' imports (torch, transformers, verl) are compiled once into a scratch folder for the module
(``PYTHONPYCACHEPREFIX``) instead of once per script where the environment says not to write bytecode. Every
smoke runs on one torch thread, so the two longest (``BESIDE``: the merge recipe's seven ``npr`` calls and
verl's job, whose Ray workers leave a core mostly idle while they start) run one after the other in a second
lane beside the rest, as test_verl_main_ppo runs its jobs two at a time. Their timeouts add up to less than
the suite's per-test one.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from components.artifacts import write_shards
from components.config import dump_yaml, load_config
from components.data import synthetic

# xdist_group("ray"): the test files that start Ray clusters run on one worker (tests/conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.xdist_group("ray")]

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "benchmarks"
SEED = ROOT / "models" / "tiny-instruct"


@dataclass(frozen=True)
class Smoke:
    """How a script runs here: its arguments after ``--smoke`` (``{run}``: the ``small_run`` workspace) and
    the lines its output must hold (regular expressions, one per line of the table: header and rows)."""

    table: tuple[str, ...]
    args: tuple[str, ...] = ()
    timeout_s: int = 600

    @property
    def needs_run(self) -> bool:
        return any("{run}" in a for a in self.args)


SMOKES: dict[str, Smoke] = {
    "bench_data.py": Smoke(
        table=(r'"same_failure_counts": true', r"^sample_orz on \d+ real ORZ rows: .* GX checks are [\d.]+x"),
    ),
    "bench_decode.py": Smoke(
        table=(r"^path\s+tokens\s+seconds\s+tokens/s$", r"^engine\s+\d+\s", r"^stock\s+\d+\s",
               r"^engine / stock throughput: [\d.]+x; identical samples: True$"),
    ),  # fmt: skip
    "bench_dvc_noop.py": Smoke(
        table=(r"^# dvc no-op timing", r"^dvc --version \(start-up\)\s+[\d.]+ s", r"^dvc status\s+[\d.]+ s",
               r"^dvc repro \(no-op\)\s+[\d.]+ s", r"^dvc repro no-op / target 3.0 s = [\d.]+"),
    ),  # fmt: skip
    "bench_engine.py": Smoke(
        table=(r"^ K\s+tokens\s+critical\s+ideal x\s+measured x\s+fraction$",
               *(rf"^ {k}\s+\d+\s+\d+\s+[\d.]+\s+[\d.]+\s+[\d.]+$" for k in (2, 3, 4, 5)),
               r"^branches \| sequential tok/s \| NPR engine tok/s \| speedup$",
               *(rf"^\s+{k} \|\s+[\d.]+ \|\s+[\d.]+ \|\s+[\d.]+x$" for k in (2, 3, 4, 5))),
    ),  # fmt: skip
    "bench_eval.py": Smoke(
        table=(r"^scenario\s+rtol\s+wilson\s+bootstrap", r"^no change\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
               r"^regression\s+[\d.]+\s+[\d.]+\s+[\d.]+$", r"^detection, wilson / rtol: "),
    ),  # fmt: skip
    "bench_grading.py": Smoke(
        args=("--regrade", "{run}/artifacts/evaluate/records"),
        table=(r"^== regrade: \d+ records", r"^parallel_warmup\s+[\d.]+\s+[\d.]+\s+[-+][\d.]+",
               r"^split\s+kind\s+n\s+ours\s+plain math-verify",
               *(rf"^{s}\s+{k}\s+\d+\s+\d+ =\s+[\d.]+%" for s in ("tune", "heldout", "blind")
                 for k in ("answers", "responses", "all")),
               r"^== throughput ==$", r"^batch path: ", r"^ratio batch / sequential \(wall\): "),
    ),  # fmt: skip
    "bench_merge.py": Smoke(
        args=("--problems", "{run}/artifacts/sample_orz/problems"),
        table=(r"^\| backend \| merge mode \| trainer semantics \| post-merge tokens \|",
               *(rf"^\| {b} \| {m} \| {s} \| \d+ \|" for b, m in (("torch", "shared_kv"),
                 ("torch-reprefill", "reprefill"), ("async", "reprefill"), ("sglang", "reprefill"))
                 for s in ("isolated", "reread")),
               r"^merge mode\s+merged\s+class\s+tokens", r"^reprefill\s+[\d.]+\s+post_merge\s+\d+",
               r"^shared_kv\s+responses: correct-and-valid", r"^reprefill post-merge weight",
               r"^PAPO run\s+steps\s+reward by step", r"^shared_kv\s+1\s", r"^reprefill\s+1\s"),
    ),  # fmt: skip
    "bench_merge_recipe.py": Smoke(
        args=("--from", "{run}"),
        table=(r"^\| arm \| checkpoint \| accuracy \| format-valid \|",
               *(rf"^\| {a} \| {c} \| [\d.]+ \|" for a in ("isolated", "isolated-served")
                 for c in ("NPR-Beta", "NPR")),
               r"^\| arm \| PAPO post-merge mean abs dlogp \|", r"^\| isolated \| ", r"^\| isolated-served \| "),
        timeout_s=500,
    ),  # fmt: skip
    "bench_padding.py": Smoke(
        table=(r"^SFT seed step, \d+ examples", *(rf"^  {n} pass\(es\):\s+[\d.]+ ms" for n in (1, 2, 4)),
               r"^RL update \(npr_zero, causal rows\), \d+ rollouts",
               r"^RL update \(papo_rl, parallel layout\), \d+ rollouts",
               r"^  one batch\s+[\d.]+ ms\s+micro-batches of \d+\s+[\d.]+ ms\s+ratio [\d.]+x$"),
    ),  # fmt: skip
    "bench_precision.py": Smoke(
        table=(r"^\| kind \| torch capability \| native bf16 \| auto picks \| why \|$",
               r"^\| native \| \w+ \| (True|False) \| \w+ \|", r"^\| avx2 \| \w+ \| (True|False) \| \w+ \|",
               r"^\| kind \| matmul fp32 ms \|", r"^\| native \| [\d.]+ \| [\d.]+ \|", r"^\| avx2 \| [\d.]+ \|",
               r"^auto's step on avx2 / native: [\d.]+x$"),
    ),  # fmt: skip
    "bench_recipe.py": Smoke(
        args=("--artifacts", "{run}/artifacts"),
        table=(r"^# Recipe on tiny_test$", r"^\| checkpoint \| stage \| mode \| avg@2 \|",
               r"^\| NPR-Beta \| parallel_warmup \| parallel \| [\d.]+ \[", r"^\| claim \(paper\) \|",
               r"^# Every benchmark of the run \(tiny_test\)$", r"^\| parallel_warmup \| parallel \| [\d.]+ \|",
               r"^# Stage wall times", r"^\| evaluate \| ", r"^\| sum \| \d+ \|$"),
    ),  # fmt: skip
    "bench_rl_forward.py": Smoke(
        table=(r"^model [\d.]+M params, batch \d+", r"^batched \(one call, 4D mask \[B,1,L,L\]\):\s+[\d.]+ ms$",
               r"^per-sample loop \(\d+ calls\):\s+[\d.]+ ms$", r"^speedup: [\d.]+x"),
    ),  # fmt: skip
    "bench_sft.py": Smoke(
        table=(r"^SFT step, batch \d+, \d+ tokens", r"^  parallel [\d.]+ ms\s+causal [\d.]+ ms\s+ratio [\d.]+x",
               r"^  parallel\s+[\d.]+x faster\s+loss relative difference", r"^  sequential [\d.]+x faster",
               r"^\s+L\s+segments\s+dense bool\s+dense float\s+float/bool$", r"^\s+512\s+[\d.]+ \("),
    ),  # fmt: skip
    "bench_speedup.py": Smoke(
        args=("--problems-dir", "{run}/artifacts/sample_orz/problems"),
        table=(r"^\| batch \| parallel tokens/s \| sequential tokens/s \| achieved \| ideal \|",
               r"^\| 1 \| \d+ \| \d+ \| [\d.]+ \| [\d.]+ \|", r"^\| 4 \| \d+ \| \d+ \| [\d.]+ \| [\d.]+ \|"),
    ),  # fmt: skip
    "bench_speedup_repeats.py": Smoke(
        args=("--problems-dir", "{run}/artifacts/sample_orz/problems"),
        table=(r"with bursts of other work$", r"^\| trial \| checkpoint \| ideal \|", r"^\| 0 \| .*tiny-instruct \|",
               r"^\| estimator \| min \| median \| max \| spread \|", r"^\| 1 decode \| [\d.]+ \|",
               r"^\| fastest of 2 \| [\d.]+ \|"),
    ),  # fmt: skip
    "bench_structure.py": Smoke(
        table=(r"^format_score on [\d.]+ MB", r"^  benign: valid NPR blocks\s+[\d.]+ ms", r"^  lone '<' flood\s+",
               r"^  L = 1024$", *(rf"^    {m}\s+[\d.]+ ms" for m in ("segments", "bool-dense", "float32-dense")),
               r"^    float32 dense / bool dense held: [\d.]+x$"),
    ),  # fmt: skip
    "bench_verl_backend.py": Smoke(
        table=(r"^local run 1:", r"^verl  run 1:", r"^backend\s+wall s\s+accuracy\s+format-valid$",
               r"^local\s+[\d.]+\s+[\d.]+\s+[\d.]+$", r"^verl\s+[\d.]+\s+[\d.]+\s+[\d.]+$",
               r"^verl / local wall time: [\d.]+x$"),
        timeout_s=800,
    ),  # fmt: skip
}
# run in the second lane, in this order, from the module's first smoke on (each is waited for where the
# parametrized order reaches it: the merge recipe comes first there)
BESIDE = ("bench_merge_recipe.py", "bench_verl_backend.py")
# the GPU node's smoke (its CPU shapes are its smoke size) and its wheel bundle: run by their own tests
COVERED_ELSEWHERE = {
    "smoke_gpu.py": "tests/integration/training/test_smoke_gpu.py",
    "smoke_gpu.sh": "tests/integration/training/test_smoke_gpu.py",
    "smoke_gpu_wheels.py": "tests/integration/training/test_smoke_gpu.py",
}


def benchmark_files() -> list[str]:
    """Every file in benchmarks/ but helper modules (``_*.py``) and caches."""
    return sorted(
        p.name for p in BENCHMARKS.iterdir() if p.is_file() and not p.name.startswith(("_", ".")) and p.suffix != ".pyc"
    )


def test_every_benchmark_is_run_by_the_suite() -> None:
    files = set(benchmark_files())
    assert not (missing := files - SMOKES.keys() - COVERED_ELSEWHERE.keys()), (
        f"benchmarks without a smoke run: {sorted(missing)}; give each --smoke (benchmarks/_smoke.py) and an "
        "entry in SMOKES"
    )
    assert not (gone := (SMOKES.keys() | COVERED_ELSEWHERE.keys()) - files), f"entries for no script: {sorted(gone)}"
    assert not SMOKES.keys() & COVERED_ELSEWHERE.keys()
    for script, test in COVERED_ELSEWHERE.items():
        assert script in (ROOT / test).read_text(), f"{test} does not run {script}"


def _pycache(factory: pytest.TempPathFactory) -> Path:
    return factory.getbasetemp() / "bench-pycache"


def _env(factory: pytest.TempPathFactory) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONDONTWRITEBYTECODE", "NPR_BENCH_SMOKE")}
    env.update(
        PYTHONPYCACHEPREFIX=str(_pycache(factory)),
        OMP_NUM_THREADS="1",
        NPR_TORCH_THREADS="1",
        NPR_PROGRESS="off",
        HF_HUB_OFFLINE="1",
        WANDB_MODE="offline",
    )
    return env


def _accepted(n: int) -> list[dict]:
    """reject_filter's accepted records: correct, well-formed parallel traces of synthetic problems."""
    rng = random.Random(0)
    return [
        {"problem_id": rec["id"], "sample_idx": 0, "problem": rec["problem"], "answer": rec["answer"],
         "prompt": "", "response": synthetic.render_solution(rec, "parallel", rng), "correct": True, "valid": True}
        for rec in synthetic.generate_problems(n, 5, {"easy": 1.0})
    ]  # fmt: skip


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A workspace with what the benchmarks read of a finished tiny run, small."""
    run = tmp_path_factory.mktemp("bench-run")
    for name in ("configs", "prompts", "models", "eval"):
        (run / name).symlink_to(ROOT / name)
    shutil.copy(ROOT / "dvc.yaml", run / "dvc.yaml")
    (run / "params.yaml").write_text(dump_yaml(load_config(profile="tiny", root=ROOT)))
    problems = synthetic.generate_problems(36, 3, None)
    out = run / "artifacts" / "sample_orz" / "problems"
    for split, rows in (("train", problems[:24]), ("val", problems[24:32]), ("test", problems[32:])):
        write_shards(out, [dict(p, split=split) for p in rows], 1, stem=split)
    for stage in ("seed", "parallel_warmup"):
        shutil.copytree(SEED, run / "artifacts" / stage / "model")
    write_shards(run / "artifacts" / "reject_filter" / "accepted", _accepted(8), 1)
    sets = ["evaluate.generation.max_new_tokens=64", "evaluate.speedup.repeats=1"]
    cmd = [str(Path(sys.executable).with_name("npr")), "eval", "--checkpoint", "artifacts/parallel_warmup/model",
           "--benchmarks", "tiny_test", "--k", "2", "--out", "artifacts/evaluate", *(a for s in sets for a in ("--set", s))]  # fmt: skip
    proc = subprocess.run(cmd, cwd=run, env=_env(tmp_path_factory), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert list((run / "artifacts" / "evaluate" / "records" / "parallel_warmup").glob("tiny_test-*.jsonl"))
    return run


@dataclass(frozen=True)
class Ran:
    returncode: int | None  # None: killed at its timeout
    stdout: str
    stderr: str
    seconds: float


def _smoke(script: str, run: Path | None, env: dict[str, str]) -> Ran:
    """``python benchmarks/<script> --smoke ARGS`` from the checkout's root; at its timeout the script and
    everything it started (npr stages, Ray) are killed."""
    smoke = SMOKES[script]
    cmd = [sys.executable, str(BENCHMARKS / script), "--smoke", *(a.format(run=run) for a in smoke.args)]
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # fmt: skip
    try:
        out, err = proc.communicate(timeout=smoke.timeout_s)
        returncode = proc.returncode
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        returncode = None
    return Ran(returncode, out, err, time.perf_counter() - start)


@pytest.fixture(scope="module")
def beside(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Future]]:
    """The second lane: the selected scripts of ``BESIDE``, started one after the other."""
    selected = {
        item.callspec.params.get("script")
        for item in request.session.items
        if item.module is request.module and hasattr(item, "callspec")
    }
    env = _env(tmp_path_factory)
    with ThreadPoolExecutor(max_workers=1) as lane:
        futures = {}
        for script in (s for s in BESIDE if s in selected):
            run = request.getfixturevalue("small_run") if SMOKES[script].needs_run else None
            futures[script] = lane.submit(_smoke, script, run, env)
        yield futures
        lane.shutdown(wait=True, cancel_futures=True)


@pytest.mark.parametrize("script", [f for f in benchmark_files() if f not in COVERED_ELSEWHERE])
def test_benchmark_smoke(script: str, request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    smoke = SMOKES.get(script)
    assert smoke is not None, f"benchmarks/{script} has no smoke run: give it --smoke and an entry in SMOKES"
    lane = request.getfixturevalue("beside")
    if script in lane:
        ran = lane[script].result()
    else:
        run = request.getfixturevalue("small_run") if smoke.needs_run else None
        ran = _smoke(script, run, _env(tmp_path_factory))
    print(f"benchmarks/{script} --smoke: {ran.seconds:.1f} s")
    out = ran.stdout
    assert ran.returncode is not None, f"not done within {smoke.timeout_s} s\n{out[-3000:]}\n{ran.stderr[-5000:]}"
    assert ran.returncode == 0, f"exit {ran.returncode}\n{out[-3000:]}\n{ran.stderr[-5000:]}"
    missing = [line for line in smoke.table if not re.search(line, out, re.MULTILINE)]
    assert not missing, f"benchmarks/{script} --smoke printed no line matching {missing}:\n{out[-5000:]}"
