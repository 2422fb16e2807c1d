"""The device smoke script runs on CPU (``--cpu``, small shapes) under the GPU node's constraints.

The node has no network and only torch, transformers, tokenizers, safetensors, accelerate (and their own
dependencies); the smoke brings the rest as the wheel bundle of ``benchmarks/smoke_gpu_wheels.py``. So the
first test builds a scratch virtual environment with just those packages (cached under
``~/.cache/npr-smoke-venv``, keyed by its contents; never the project's own environment), takes the packages
the node lacks out of it again, builds the bundle for its interpreter and runs the node's one command,
``bash benchmarks/smoke_gpu.sh --cpu``, from the checkout's root with the output folder outside it. CPython
3.12 is the node's; this machine has a CPU torch wheel only for 3.11 (/opt/wheels), so the test takes the
first interpreter, 3.12 then 3.11, for which a local CPU torch wheel exists, and skips (with the reason)
when there is none, or when the package registry cannot be reached for the rest.

The second test runs part 1 (the tiny chain's first stages through the stage runner), which needs the
project's whole environment, in this one. The third checks the bundle itself: one wheel of each, built for
the node's CPython 3.12, and the failure past what the device tool carries.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]
ROOT = Path(__file__).resolve().parents[3]
TORCH_WHEELS = Path("/opt/wheels")
# the node's preinstalled packages the smoke uses (their own dependencies come with them from the registry)
NODE = ["transformers==5.17.*", "tokenizers", "safetensors", "accelerate"]
CACHE = Path(os.environ.get("NPR_SMOKE_VENV_CACHE", Path.home() / ".cache" / "npr-smoke-venv"))


def _wheels_module():
    spec = importlib.util.spec_from_file_location("smoke_gpu_wheels", ROOT / "benchmarks" / "smoke_gpu_wheels.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _interpreter() -> tuple[str, Path, Path] | None:
    """(version, python, local CPU torch wheel) for the first of 3.12, 3.11 that has both here."""
    for version in ("3.12", "3.11"):
        python = shutil.which(f"python{version}")
        tag = "cp" + version.replace(".", "")
        found = sorted(TORCH_WHEELS.glob(f"torch-*-{tag}-{tag}-*linux*x86_64.whl"), key=lambda p: "+cpu" not in p.name)
        if python and found:
            return version, Path(python), found[0]
    return None


def _run(cmd: list[str], timeout: int = 1200, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)


def _node_like_venv() -> tuple[Path, Path, str]:
    """(python, wheel bundle, what it holds) of the cached scratch environment; skips when it cannot be built."""
    found = _interpreter()
    if found is None:
        pytest.skip(f"no python3.12/python3.11 with a local CPU torch wheel in {TORCH_WHEELS}")
    version, python, torch_wheel = found
    wheels = _wheels_module()
    pins = wheels.locked_versions()
    content = [version, torch_wheel.name, *NODE, *(f"{n}=={pins.get(n, '')}" for n in wheels.WHEELS)]
    key = hashlib.sha256("\n".join(content).encode()).hexdigest()[:16]
    venv = CACHE / f"py{version}-{key}"
    vpy, bundle = venv / "bin" / "python", venv / "smoke-wheels"
    CACHE.mkdir(parents=True, exist_ok=True)
    with (CACHE / f"py{version}-{key}.lock").open("w") as lock:  # one builder at a time per environment
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (venv / ".complete").exists():
            try:
                _build(venv, python, torch_wheel, version, content, wheels)
            except subprocess.TimeoutExpired as err:  # a registry that does not answer
                shutil.rmtree(venv, ignore_errors=True)
                pytest.skip(f"building the node-like environment timed out: {err.cmd[:6]}")
    return vpy, bundle, f"python {version}, {torch_wheel.name}"


def _build(venv: Path, python: Path, torch_wheel: Path, version: str, content: list[str], wheels) -> None:
    """The node's packages into a fresh venv, less what the node lacks; the bundle for its interpreter."""
    vpy, bundle = venv / "bin" / "python", venv / "smoke-wheels"
    shutil.rmtree(venv, ignore_errors=True)
    venv.parent.mkdir(parents=True, exist_ok=True)
    made = _run([str(python), "-m", "venv", str(venv)])
    assert made.returncode == 0, made.stderr[-2000:]
    pip = [str(vpy), "-m", "pip", "--disable-pip-version-check"]
    installed = _run([*pip, "install", "-q", str(torch_wheel), *NODE])
    if installed.returncode != 0:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.skip(f"the node's packages could not be installed (registry unreachable?): {installed.stderr[-600:]}")
    # what the node lacks must come from the bundle alone (transformers' typer pulls pydantic in here)
    removed = _run([*pip, "uninstall", "-y", *wheels.ABSENT_ON_NODE])
    assert removed.returncode == 0, removed.stderr[-2000:]
    built = _run([sys.executable, str(ROOT / "benchmarks" / "smoke_gpu_wheels.py"), "--python-version", version,
                  "--dest", str(bundle)])  # fmt: skip
    if built.returncode == 2:
        shutil.rmtree(venv, ignore_errors=True)
        pytest.skip(f"the wheel bundle could not be downloaded: {built.stderr[-600:]}")
    assert built.returncode == 0, built.stdout + built.stderr
    (venv / ".complete").write_text("\n".join(content) + "\n")


def _table(path: Path) -> dict[str, str]:
    text = path.read_text()
    return {line.split(" | ")[0].lstrip("| "): line for line in text.splitlines() if line.startswith("| ")}


def _field(row: str, name: str) -> float:
    return float(re.search(rf"{name} ([-0-9.e+]+)", row)[1])


def test_the_node_command_runs_the_smoke_on_cpu_in_a_node_like_environment(tmp_path):
    python, bundle, what = _node_like_venv()
    out = tmp_path / "out"
    assert ROOT not in out.parents  # the table lands outside the checkout, as on the node ($OUT)
    absent = ["verl", "sglang", "ray", "wandb", "great_expectations", "prefect", "dvc", "math_verify", "pydantic"]
    # from a folder of its own: the checkout's root holds a wandb/ folder of offline runs once a test ran a
    # stage, which the interpreter's cwd entry would offer as a namespace package
    probe = _run([str(python), "-c", f"import importlib.util as u; print([m for m in {absent!r} if u.find_spec(m)])"],
                 env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, cwd=tmp_path)  # fmt: skip
    assert probe.stdout.strip() == "[]", (what, probe.stdout, probe.stderr)  # none of them is on the node
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PYTHON=str(python), SMOKE_WHEELS=str(bundle), OUT=str(out), OMP_NUM_THREADS="1")
    proc = _run(["bash", "benchmarks/smoke_gpu.sh", "--cpu"], timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, what + "\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _table(out / "smoke.md")
    get = lambda prefix: next(v for k, v in rows.items() if k.startswith(prefix))  # noqa: E731
    shared = get("exact merge: engine shared_kv vs trainer isolated")
    reprefill = get("exact merge: engine reprefill vs trainer isolated")
    reread = get("exact merge: engine reprefill vs trainer reread")
    for row in (shared, reprefill, reread):
        assert "4/4 well-formed, 4 forked" in row, row
        assert _field(row, "pre-merge mean") < 1e-5, row  # before the merge every semantics is the same
    # fp32: the shared-KV merge is the trainer's isolated batch token for token, a re-prefill its reread one;
    # a re-prefill read under isolated semantics is visibly off after the merge
    assert _field(shared, "max") < 1e-4 and _field(reread, "max") < 1e-4, (shared, reread)
    assert _field(reprefill, "mean") > 100 * max(_field(shared, "mean"), 1e-7), reprefill
    for batch in (1, 64):
        assert f"forked {batch}/{batch}" in get(f"decode parallel, batch {batch} x"), rows
        assert float(get(f"decode parallel / sequential, batch {batch}").split(" | ")[1].rstrip("x")) > 0
    for key in ("parallel-mask SFT step", "PAPO update"):
        row = get(key)
        assert 0.5 <= _field(row, "measured/planned") <= 1.5, row  # the planner's estimate is the peak's size
    assert "verl absent" in get("PAPO update")
    assert "total wall time" in rows
    # the GPU's dtype on CPU: bf16 weights train through fp32 masters, and the merge is as exact as bf16 is
    env["OUT"] = str(tmp_path / "bf16")
    proc = _run(["bash", "benchmarks/smoke_gpu.sh", "--cpu", "--dtype", "bfloat16"], timeout=900, cwd=ROOT, env=env)
    assert proc.returncode == 0, what + "\n" + proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _table(tmp_path / "bf16" / "smoke.md")
    for key in ("parallel-mask SFT step", "PAPO update"):
        assert "bfloat16" in get(key) and "MasterWeightAdamW (fp32 masters)" in get(key), get(key)
    shared = get("exact merge: engine shared_kv vs trainer isolated")
    reprefill = get("exact merge: engine reprefill vs trainer isolated")
    reread = get("exact merge: engine reprefill vs trainer reread")
    assert _field(shared, "p99") < 1e-2 and _field(reread, "p99") < 1e-2, (shared, reread)
    assert _field(reprefill, "mean") > 10 * _field(shared, "mean"), (shared, reprefill)


def test_part_one_runs_the_first_stages_through_the_stage_runner(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    proc = _run([sys.executable, str(ROOT / "benchmarks" / "smoke_gpu.py"), "--cpu", "--stages", "sample_orz,seed",
                 "--out", str(tmp_path)], timeout=900, env=env, cwd=tmp_path)  # fmt: skip
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    rows = _table(tmp_path / "smoke.md")
    assert "stage sample_orz on cpu" in rows
    seed = rows["stage seed on cpu"]  # the committed seed model is found from the script's scratch folder
    assert "nan" not in seed and "accuracy" in seed, seed  # what the metrics hold, never a missing loss
    assert "PAPO update (small Qwen3" in "".join(rows)


def test_the_wheel_bundle_fails_when_the_tree_and_wheels_exceed_what_the_tool_carries(tmp_path):
    wheels = _wheels_module()
    assert wheels.tree_bytes() < 32 * 2**20  # the checkout leaves room for the wheels under 64 MiB
    proc = _run([sys.executable, str(ROOT / "benchmarks" / "smoke_gpu_wheels.py"), "--dest", str(tmp_path),
                 "--limit-mib", "4"], timeout=600)  # fmt: skip
    if proc.returncode == 2:
        pytest.skip(f"the wheel bundle could not be downloaded: {proc.stderr[-600:]}")
    assert proc.returncode == 1 and "too large for one device call" in proc.stderr, proc.stdout + proc.stderr
    names = sorted(p.name.split("-")[0].lower() for p in tmp_path.glob("*.whl"))
    assert names == sorted(n.replace("-", "_") for n in wheels.WHEELS), names  # one wheel each, nothing else
    assert any("cp312" in p.name for p in tmp_path.glob("pydantic_core-*.whl"))  # the node's interpreter
