"""The device smoke script runs on CPU (``--cpu``, small shapes): the shaped-model part in full (decode
parallel vs sequential through the engine, a parallel-mask SFT step and a PAPO update, each beside the
planner's estimate) and the first two stages of the tiny chain through the stage runner (run from outside the checkout, as on
the GPU node); one table."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]


def test_the_smoke_script_runs_on_cpu_and_prints_one_table(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "smoke_gpu.py"), "--cpu", "--stages", "sample_orz,seed", "--out", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=900, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    table = (tmp_path / "smoke.md").read_text()
    for row in (
        "stage sample_orz on cpu",
        "stage seed on cpu",  # the committed seed model is found from the script's scratch folder
        "decode sequential",
        "decode parallel",
        "decode parallel / sequential",
        "parallel-mask SFT step",
        "PAPO update",
        "total wall time",
    ):
        assert f"| {row}" in table, row
    lines = {line.split(" | ")[0].lstrip("| "): line for line in table.splitlines() if line.startswith("| ")}
    parallel = next(v for k, v in lines.items() if k.startswith("decode parallel,"))
    assert "forked 4/4" in parallel  # the engine really forked at the forced </guideline>
    for key in ("parallel-mask SFT step", "PAPO update"):
        row = next(v for k, v in lines.items() if k.startswith(key))
        ratio = float(row.split("measured/planned ")[1].split(";")[0])
        assert 0.5 <= ratio <= 1.5, row  # the planner's estimate is the measured peak's size
