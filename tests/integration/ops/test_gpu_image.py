"""The GPU image builds from what it names: its requirements resolve (pip's resolver against the package
registry, for the image's Python), its base carries the CUDA the resolved torch is built for, the one
transformers override is the one requirements.txt documents, and the build context leaves environments,
outputs and secrets out. Skipped, with the reason, where the registry or a Python 3.12 is not reachable."""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement

pytestmark = [pytest.mark.integration, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[3]
GPU = ROOT / "infra" / "gpu"
IMAGE_PYTHON = "3.12"  # lmsysorg/sglang release images run Python 3.12
INDEX = "https://pypi.org/simple"
IMAGE_ENVIRONMENT = {  # PEP 508 markers of the image (linux x86_64, CPython 3.12)
    "sys_platform": "linux",
    "platform_system": "Linux",
    "platform_machine": "x86_64",
    "os_name": "posix",
    "python_version": IMAGE_PYTHON,
    "python_full_version": f"{IMAGE_PYTHON}.0",
    "implementation_name": "cpython",
    "platform_python_implementation": "CPython",
    "extra": "",
}


def _base_image() -> str:
    match = re.search(r"^FROM\s+(\S+)", (GPU / "Dockerfile").read_text(), re.M)
    assert match, "infra/gpu/Dockerfile has no FROM line"
    return match.group(1)


def _pins(lines: list[str]) -> dict[str, str]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        exact = [s.version for s in req.specifier if s.operator == "=="]
        if exact:
            out[req.name.lower()] = exact[0]
    return out


def _requirements() -> list[str]:
    return [ln for ln in (GPU / "requirements.txt").read_text().splitlines() if ln.split("#", 1)[0].strip()]


def _pypi_reachable() -> bool:
    try:
        with socket.create_connection(("pypi.org", 443), timeout=3):
            return True
    except OSError:
        return False


def _python312() -> str | None:
    found = shutil.which(f"python{IMAGE_PYTHON}")
    candidates = [found] if found else []
    candidates += sorted(
        glob.glob(os.path.expanduser(f"~/.pyenv/versions/{IMAGE_PYTHON}*/bin/python{IMAGE_PYTHON}"))
    )
    for path in candidates:
        if (
            path
            and subprocess.run([path, "-c", "import venv, ensurepip"], capture_output=True).returncode == 0
        ):
            return path
    return None


@pytest.fixture(scope="module")
def image_pip(tmp_path_factory) -> list[str]:
    """pip of a fresh Python 3.12 venv, isolated from this machine's pip config (local wheel dirs, caps)."""
    if not _pypi_reachable():
        pytest.skip("the package registry (pypi.org) is not reachable: cannot run the resolver")
    python = _python312()
    if python is None:
        pytest.skip(f"no Python {IMAGE_PYTHON} here to resolve for the image's interpreter")
    venv = tmp_path_factory.mktemp("py312") / "venv"
    subprocess.run([python, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip"]
    # the pip this project uses (a bundled pip 23 fetches metadata about twice as slowly)
    subprocess.run(
        [*pip, "install", "--quiet", "--index-url", INDEX, f"pip=={metadata.version('pip')}"],
        env=_isolated_env(),
        check=True,
        timeout=300,
    )
    return pip


def _isolated_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    return env


def _dry_run(pip: list[str], args: list[str], report: Path) -> dict:
    cmd = [
        *pip,
        "install",
        "--dry-run",
        "--ignore-installed",
        "--quiet",
        "--index-url",
        INDEX,
        "--report",
        str(report),
        *args,
    ]
    proc = subprocess.run(cmd, env=_isolated_env(), capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, f"pip's resolver failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(report.read_text())


def test_requirements_resolve_with_sglangs_own_and_match_the_base_cuda(image_pip, tmp_path):
    verl_extra = [Requirement(r) for r in metadata.requires("verl") or []]
    sglang_pin = next(r for r in verl_extra if r.name == "sglang" and r.marker and "sglang" in str(r.marker))
    sglang_version = next(iter(sglang_pin.specifier)).version
    assert _base_image() == f"lmsysorg/sglang:v{sglang_version}-cu130"  # the release verl 0.9.1 pins
    # sglang's own requirements (from its published metadata), as the base image holds them
    sglang_meta = _dry_run(image_pip, ["--no-deps", f"sglang=={sglang_version}"], tmp_path / "sglang.json")
    sglang_reqs = [Requirement(r) for r in sglang_meta["install"][0]["metadata"]["requires_dist"]]
    sglang_reqs = [r for r in sglang_reqs if not r.marker or r.marker.evaluate(IMAGE_ENVIRONMENT)]
    overridden = [r for r in sglang_reqs if r.name == "transformers"]
    assert [str(r.specifier) for r in overridden] == ["==5.6.0"]  # the override requirements.txt explains
    others = [
        str(Requirement(f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}{r.specifier}"))
        for r in sglang_reqs
        if r.name != "transformers"
    ]
    (tmp_path / "sglang-reqs.txt").write_text("\n".join(others) + "\n")
    # one resolution of both: a solution of the union is one of requirements.txt alone
    report = _dry_run(
        image_pip,
        ["-r", str(GPU / "requirements.txt"), "-r", str(tmp_path / "sglang-reqs.txt")],
        tmp_path / "all.json",
    )
    resolved = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in report["install"]}
    assert resolved["torch"] == "2.11.0"
    # PyPI's torch 2.11.0 is a CUDA 13.0 build: its CUDA runtime is what the cu130 base provides
    assert resolved["nvidia-cuda-runtime"].startswith("13.0"), resolved.get("nvidia-cuda-runtime")
    transformers = resolved["transformers"]
    verl_transformers = next(r for r in verl_extra if r.name == "transformers" and not r.marker)
    assert verl_transformers.specifier.contains(transformers) and transformers != "5.6.0"
    assert resolved["verl"] == metadata.version("verl")


def test_shared_pins_equal_the_cpu_sets():
    """Orchestration, storage and tracking run in both environments: the same versions."""
    pyproject = (ROOT / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)^\]", pyproject, re.S | re.M).group(1)
    cpu = _pins([m.group(1) for m in re.finditer(r'"([^"]+)"', deps)])
    gpu = _pins(_requirements())
    shared = sorted((set(cpu) & set(gpu)) - {"torch", "transformers"})
    assert {"prefect", "dvc", "wandb", "verl", "datasets", "boto3"} <= set(shared)
    assert {k: gpu[k] for k in shared} == {k: cpu[k] for k in shared}
    assert gpu["torch"] != cpu["torch"]  # the GPU set keeps the base image's CUDA torch


def test_image_needs_no_download_at_run_time_and_keeps_state_out():
    dockerfile = (GPU / "Dockerfile").read_text()
    assert "HF_HUB_OFFLINE=1" in dockerfile
    assert "RAY_AUTH_MODE=token" in dockerfile  # token auth for every Ray node and client of the image
    ignored = [
        ln.strip()
        for ln in (ROOT / ".dockerignore").read_text().splitlines()
        if ln.strip() and not ln.startswith("#")
    ]
    for path in (
        ".venv",
        "artifacts",
        "dvc-remote",
        "wandb",
        ".dvc/cache",
        ".dvc/config.local",
        ".prefect",
        "data",
    ):
        assert path in ignored, path
    from components.config import load_config

    assert load_config(profile="qwen3-4b").models.attn_implementation == "sdpa"  # no kernel to fetch


def test_the_training_stack_imports_where_it_is_installed():
    """On this CPU machine verl is installed from the same pin: its import works offline (no hub)."""
    code = "import verl, transformers; print(verl.__version__)"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, "HF_HUB_OFFLINE": "1"},
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == _pins(_requirements())["verl"]
