"""The wheels the device smoke (benchmarks/smoke_gpu.py) needs beyond what the GPU node has installed.

    python benchmarks/smoke_gpu_wheels.py                 # -> .smoke-wheels/ (git-ignored), for CPython 3.12
    python benchmarks/smoke_gpu_wheels.py --python-version 3.11 --dest DIR   # another interpreter's bundle

The node (the device tool's nvidia-h100-x1 / nvidia-h200) has no network and brings Python 3.12 with torch,
triton, transformers, tokenizers, safetensors, accelerate and their own dependencies (numpy, pyyaml, regex,
huggingface-hub, packaging, tqdm, jinja2, sympy, filelock, fsspec, networkx, psutil, ...). What the smoke
imports beyond that is pydantic (``components.config`` and every config model), with its compiled core and
its three small dependencies; typing-extensions comes too, since pydantic needs a newer one than torch does.
Nothing else: part 2 of the smoke avoids verl (Ray), W&B, Great Expectations, Prefect, DVC and math-verify
(see the smoke's docstring).

The wheels are downloaded with ``pip download --no-deps --only-binary=:all:`` for the target interpreter on
manylinux x86_64, at the versions pinned in requirements.lock, into a folder that git ignores (it travels
to the node through the device tool's ``carry``). The script prints each wheel's size, the working tree's
(``git ls-files -co --exclude-standard``: what the tool copies) and the sum, and fails when the sum exceeds
what the tool carries (64 MiB). ``benchmarks/smoke_gpu.sh`` installs them on the node with ``--no-index``.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEST = ROOT / ".smoke-wheels"
LIMIT_MIB = 64
# distribution -> why the smoke needs it (each is absent from the node, or too old there)
WHEELS = {
    "pydantic": "components.config and every stage/engine config model",
    "pydantic-core": "pydantic's compiled core",
    "annotated-types": "a dependency of pydantic",
    "typing-inspection": "a dependency of pydantic",
    "typing-extensions": "pydantic needs >= 4.16; the node's torch asks for less",
}
# the ones the node lacks altogether (a node-like test environment leaves them out)
ABSENT_ON_NODE = ("pydantic", "pydantic-core", "annotated-types", "typing-inspection")
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


def locked_versions(lock: Path = ROOT / "requirements.lock") -> dict[str, str]:
    """``{name: version}`` of the lock's pins (names normalised: lower case, '-' for '_' and '.')."""
    pins = {}
    for line in lock.read_text().splitlines():
        m = re.match(r"^([A-Za-z0-9_.-]+)==([^\s;\\]+)", line)
        if m:
            pins[re.sub(r"[-_.]+", "-", m.group(1)).lower()] = m.group(2)
    return pins


def tree_bytes(root: Path = ROOT) -> int:
    """Bytes of the files the device tool copies: tracked and untracked-not-ignored (links as links)."""
    out = subprocess.run(
        ["git", "ls-files", "-co", "--exclude-standard", "-z"], cwd=root, capture_output=True, check=True
    ).stdout
    total = 0
    for name in filter(None, out.split(b"\0")):
        path = root / os.fsdecode(name)
        if os.path.lexists(path):  # a tracked file deleted in the work tree is not copied
            total += os.lstat(path).st_size
    return total


def requirements_of(wheel: Path) -> list[str]:
    """The wheel's unconditional ``Requires-Dist`` names (extras and other platforms' markers left out)."""
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        lines = z.read(meta).decode().splitlines()
    names = []
    for line in lines:
        if line.startswith("Requires-Dist:") and "extra ==" not in line and "python_version <" not in line:
            names.append(
                re.sub(r"[-_.]+", "-", re.match(r"[A-Za-z0-9_.-]+", line.split(":", 1)[1].strip())[0]).lower()
            )
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--dest", type=Path, default=DEST, help="folder for the wheels (default .smoke-wheels)"
    )
    parser.add_argument("--python-version", default="3.12", help="the node's Python (default 3.12)")
    parser.add_argument("--limit-mib", type=float, default=LIMIT_MIB, help="what the device tool carries")
    args = parser.parse_args(argv)
    pins = locked_versions()
    specs = [f"{name}=={pins[name]}" if name in pins else name for name in WHEELS]
    args.dest.mkdir(parents=True, exist_ok=True)
    for old in args.dest.glob("*.whl"):  # one version of each: two would stop the install on the node
        old.unlink()
    abi = "cp" + args.python_version.replace(".", "")
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--disable-pip-version-check",
           "--python-version", args.python_version, "--implementation", "cp", "--abi", abi, "--abi", "abi3",
           "--abi", "none", *(x for p in PLATFORMS for x in ("--platform", p)), "--platform", "any",
           "-d", str(args.dest), *specs]  # fmt: skip
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        print(proc.stdout[-2000:] + proc.stderr[-2000:], file=sys.stderr)
        print(f"could not download {' '.join(specs)} (is the package registry reachable?)", file=sys.stderr)
        return 2
    wheels = sorted(args.dest.glob("*.whl"))
    have = {re.sub(r"[-_.]+", "-", w.name.split("-")[0]).lower() for w in wheels}
    wheel_bytes = 0
    for w in wheels:
        size = w.stat().st_size
        wheel_bytes += size
        print(f"{size / 2**20:8.2f} MiB  {w.name}")
    node_side = {"torch", "numpy", "packaging", "pyyaml", "regex", "tqdm", "jinja2", "huggingface-hub"}
    unmet = {w.name: sorted(set(requirements_of(w)) - have - node_side) for w in wheels}
    unmet = {k: v for k, v in unmet.items() if v}
    if unmet:
        print(f"wheels need what neither the bundle nor the node has: {unmet}", file=sys.stderr)
        return 1
    tree = tree_bytes()
    total = tree + wheel_bytes
    print(f"{wheel_bytes / 2**20:8.2f} MiB  the {len(wheels)} wheels ({args.dest})")
    print(f"{tree / 2**20:8.2f} MiB  the working tree (git ls-files -co --exclude-standard)")
    print(f"{total / 2**20:8.2f} MiB  together; the device tool carries {args.limit_mib:g} MiB")
    if total > args.limit_mib * 2**20:
        print("too large for one device call: ignore or carry less", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
