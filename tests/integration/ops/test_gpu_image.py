"""The GPU image builds from what it names: its requirements are what `make lock` writes from pyproject.toml
(uv rerun here, for both locks), pip's own resolver finds that set closed and consistent with sglang's
requirements for the image's Python, its base carries the CUDA the locked torch is built for, the one
transformers override is the one pyproject.toml documents, and the build context leaves environments,
outputs and secrets out. Skipped, with the reason, where the registry, uv or a Python 3.12 is not there."""

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

from components import envlock

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


def _image_pins() -> dict[str, str]:
    return envlock.read_pins(GPU / "requirements.txt", applicable_only=False)


def _image_pin_lines() -> list[str]:
    """``name==version ; marker`` of each locked package the image installs (hashes left out)."""
    lines = []
    for line in (GPU / "requirements.txt").read_text().splitlines():
        match = envlock.PIN_LINE.match(line)
        if match:
            name, version, marker = match.groups()
            lines.append(f"{name}=={version}" + (f" ; {marker}" if marker else ""))
    return lines


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
    assert [str(r.specifier) for r in overridden] == ["==5.6.0"]  # the override pyproject.toml explains
    others = [
        str(Requirement(f"{r.name}{'[' + ','.join(sorted(r.extras)) + ']' if r.extras else ''}{r.specifier}"))
        for r in sglang_reqs
        if r.name != "transformers"
    ]
    (tmp_path / "sglang-reqs.txt").write_text("\n".join(others) + "\n")
    # the lock without sglang itself (the base's: its transformers pin is the override), plus sglang's other
    # requirements: one resolution by pip's resolver, which must add nothing and move nothing
    ours = [ln for ln in _image_pin_lines() if not ln.startswith("sglang==")]
    (tmp_path / "image.txt").write_text("\n".join(ours) + "\n")
    report = _dry_run(
        image_pip,
        ["-r", str(tmp_path / "image.txt"), "-r", str(tmp_path / "sglang-reqs.txt")],
        tmp_path / "all.json",
    )
    resolved = {envlock.normalize(i["metadata"]["name"]): i["metadata"]["version"] for i in report["install"]}
    expected = {}
    for line in ours:
        req = Requirement(line)
        if req.marker is None or req.marker.evaluate(IMAGE_ENVIRONMENT):
            expected[envlock.normalize(req.name)] = next(iter(req.specifier)).version
    assert resolved == expected
    assert resolved["torch"] == "2.11.0"
    # PyPI's torch 2.11.0 is a CUDA 13.0 build: its CUDA runtime is what the cu130 base provides
    assert resolved["nvidia-cuda-runtime"].startswith("13.0"), resolved.get("nvidia-cuda-runtime")
    transformers = resolved["transformers"]
    verl_transformers = next(r for r in verl_extra if r.name == "transformers" and not r.marker)
    assert verl_transformers.specifier.contains(transformers) and transformers != "5.6.0"
    assert resolved["verl"] == metadata.version("verl")
    assert resolved["transferqueue"] == metadata.version("TransferQueue")
    assert _image_pins()["sglang"] == sglang_version


@pytest.mark.parametrize("name", ["gpu", "cpu"])
def test_make_lock_writes_what_is_committed(name: str, tmp_path: Path) -> None:
    """uv, rerun on today's registry with the committed lock as its preference, changes no pin: the lock
    is the resolution of pyproject.toml's inputs for its platform, not a hand-kept list."""
    if not _pypi_reachable():
        pytest.skip("the package registry (pypi.org) is not reachable: cannot rerun the resolver")
    try:
        envlock._uv()
    except envlock.LockError as err:
        pytest.skip(str(err))
    tgt = envlock.target(name, ROOT)
    uv_args: list[str] = []
    if name == "cpu":  # the CPU torch build is the local wheel (pyproject.toml's [tool.npr.lock.cpu])
        if not Path("/opt/wheels").is_dir():
            pytest.skip("no /opt/wheels here: the CPU lock's torch build cannot be resolved")
        uv_args = ["--find-links", "/opt/wheels"]
    out = tmp_path / tgt.output.name
    envlock.compile_target(tgt, out, uv_args, ROOT)
    assert envlock.read_pins(out, False) == envlock.read_pins(tgt.output, False)
    assert envlock.recorded_digest(out) == envlock.recorded_digest(tgt.output) == envlock.input_digest(tgt)


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
    cpu_verl = envlock.read_pins(ROOT / "requirements.lock")["verl"]
    assert proc.stdout.strip() == _image_pins()["verl"] == cpu_verl
