"""FSDP SFT under torchrun (gloo on CPU): two ranks train exactly what one process trains, and resume.

Each case launches real processes (``torchrun --standalone --nproc_per_node=2``) running
``sft_fsdp_worker.py``; the reference is the same worker run alone.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from safetensors.torch import load_file

pytestmark = [pytest.mark.integration, pytest.mark.slow]

WORKER = Path(__file__).with_name("sft_fsdp_worker.py")
ROOT = Path(__file__).resolve().parents[3]


def _run(
    work: Path, out: Path, steps: int, mode: str, ranks: int, crash_after: int | None = None
) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    if ranks > 1:
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        cmd = [torchrun, "--standalone", f"--nproc_per_node={ranks}", str(WORKER)]
    else:
        cmd = [sys.executable, str(WORKER)]
    cmd += [str(work), str(out), str(steps), mode] + ([str(crash_after)] if crash_after else [])
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, check=False)


def _max_diff(a: Path, b: Path) -> float:
    x, y = load_file(str(a)), load_file(str(b))
    assert sorted(x) == sorted(y)
    return max((x[k] - y[k]).abs().max().item() for k in x)


@pytest.fixture(scope="module")
def single(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("sft_single")
    proc = _run(root / "work", root / "weights.safetensors", 3, "parallel", ranks=1)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return root


def test_two_fsdp_ranks_train_what_one_process_trains(single: Path, tmp_path: Path) -> None:
    proc = _run(tmp_path / "work", tmp_path / "w.safetensors", 3, "parallel", ranks=2)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert _max_diff(single / "weights.safetensors", tmp_path / "w.safetensors") <= 1e-5


def test_fsdp_run_resumes_from_its_checkpoint_and_refuses_a_single_process_resume(
    single: Path, tmp_path: Path
) -> None:
    work = tmp_path / "work"
    crashed = _run(work, tmp_path / "never.safetensors", 3, "parallel", ranks=2, crash_after=2)
    assert crashed.returncode != 0 and not (tmp_path / "never.safetensors").exists()
    assert [p.name for p in work.iterdir() if p.name.startswith("checkpoint-")] == ["checkpoint-00000002"]
    resumed = _run(work, tmp_path / "resumed.safetensors", 3, "parallel", ranks=2)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _max_diff(single / "weights.safetensors", tmp_path / "resumed.safetensors") <= 1e-5

    wrong = _run(work, tmp_path / "x.safetensors", 4, "parallel", ranks=1)
    assert wrong.returncode != 0 and "written by an FSDP (torchrun) run" in wrong.stderr
