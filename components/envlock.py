"""The locked environments: one lock file per target, written by ``make lock`` from pyproject.toml.

A target is a ``[tool.npr.lock.<name>]`` table: ``cpu`` is ``requirements.lock`` (what ``make install``
installs), ``gpu`` is ``infra/gpu/requirements.txt`` (what the GPU image installs on its base). Each is the
project's ``[project] dependencies`` (plus the table's extras, replacements, requirements, constraints
and overrides) resolved by uv for the target's own Python and platform, every package pinned with its
hashes. A lock's header records a digest of those inputs, so a changed dependency is caught before anything
installs.

- ``stale(target)``: why a lock no longer matches its inputs (None when it does).
- ``environment()``: which lock this process runs in, that file's sha256, and what differs from it; every
  stage records it in its provenance next to the prompt hash (``components.stages.run_stage``).
- ``install(target)``: a target with a ``venv`` of its own (``vllm``: ``.venv-vllm``, the vLLM server's
  environment, which cannot share the main one: vLLM's fastapi ceiling is below prefect's floor) created and
  synced to its lock, verified, and marked with the lock's sha256 (``installed_marker``); ``make install-vllm``
  and a stage's first launch of the server (``components.engine.server_env``) call it.
- ``python infra/envlock.py check|verify|lock|pin|entry|install``: the Makefile's and the Dockerfile's entry
  points.

A table with ``project = false`` resolves only its own requirements (the server's environment holds vLLM,
not the project); ``excludes`` names packages left out of the resolution altogether (uv ``--excludes``);
``prefer`` names the lock whose pins are uv's preferences (the ``image`` target is the cpu lock with the GPU
image's torch, transformers and numpy); ``no_deps`` lists packages installed into the target's venv after
the sync, each at its entry in the ``no_deps_lock`` lock, without dependencies (SGLang's argument parser in
the ``image`` venv, whose other pins SGLang would move).

Importing this module needs only the standard library: ``check`` runs in a fresh venv before anything is
installed. ``packaging`` (installed with the lock) is imported where pins are read.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import Any

from components.errors import UserError

ROOT = Path(__file__).resolve().parents[1]
DIGEST_LINE = re.compile(r"^# inputs-sha256: ([0-9a-f]{64})$", re.M)


class LockError(UserError, RuntimeError):
    """A lock that does not match pyproject.toml, an environment that is not its lock, a failed resolution."""


@dataclass(frozen=True)
class Target:
    name: str
    table: dict[str, Any]  # the [tool.npr.lock.<name>] table as written (part of the digest)
    output: Path

    @property
    def python(self) -> str:
        return str(self.table["python"])

    @property
    def platform(self) -> str:
        return str(self.table["platform"])

    def describe(self) -> str:
        return f"CPython {self.python} on {self.platform}"


def normalize(name: str) -> str:
    """PEP 503 name: what pip, uv and importlib.metadata agree on (``ruamel.yaml`` == ``ruamel-yaml``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _project(root: Path) -> dict[str, Any]:
    return tomllib.loads((root / "pyproject.toml").read_text())


def targets(root: Path = ROOT) -> dict[str, Target]:
    tables = _project(root).get("tool", {}).get("npr", {}).get("lock", {})
    return {name: Target(name, table, root / table["output"]) for name, table in tables.items()}


def target(name: str, root: Path = ROOT) -> Target:
    known = targets(root)
    if name not in known:
        raise LockError(f"pyproject.toml: no [tool.npr.lock.{name}] table (targets: {', '.join(known)})")
    return known[name]


def input_digest(tgt: Target, root: Path = ROOT) -> str:
    """sha256 of everything the target's resolution reads from pyproject.toml (order-insensitive lists)."""
    project = _project(root)["project"]
    extras = project.get("optional-dependencies", {})
    own = tgt.table.get("project", True)  # a server's environment does not resolve the project's dependencies
    payload = {
        "dependencies": sorted(project["dependencies"]) if own else [],
        "extras": {e: sorted(extras[e]) for e in tgt.table.get("extras", [])},
        "target": tgt.table,
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


def recorded_digest(path: Path) -> str | None:
    match = DIGEST_LINE.search(path.read_text()) if path.exists() else None
    return match.group(1) if match else None


def stale(tgt: Target, root: Path = ROOT) -> str | None:
    """Why the target's lock is out of date with pyproject.toml, or None when it is current."""
    rel = tgt.output.relative_to(root)
    if not tgt.output.exists():
        return f"{rel} does not exist: run `make lock`"
    if recorded_digest(tgt.output) != input_digest(tgt, root):
        return (
            f"{rel} is stale: pyproject.toml's dependencies or its [tool.npr.lock.{tgt.name}] table changed "
            "since `make lock` wrote it; run `make lock`"
        )
    return None


def file_sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


PIN_LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*(?:\\|$)")


def read_pins(path: Path, applicable_only: bool = True) -> dict[str, str]:
    """``{normalized name: version}`` of a lock; by default only the lines whose marker holds here."""
    from packaging.markers import Marker  # lazy: packaging

    pins: dict[str, str] = {}
    for line in path.read_text().splitlines():
        if not line or line[0] in "# -":  # comments, options and each pin's continuation lines (hashes)
            continue
        match = PIN_LINE.match(line)
        if match is None:
            raise LockError(f"{path}: {line!r} is not a pin (name==version)")
        name, version, marker = match.groups()
        if applicable_only and marker and not Marker(marker).evaluate():
            continue
        pins[normalize(name)] = version
    return pins


def entry(path: Path, name: str) -> str:
    """The lock's lines for one package (its pin and hash lines), as a requirements file of one entry."""
    lines = path.read_text().splitlines()
    for i, line in enumerate(lines):
        match = PIN_LINE.match(line)
        if match and normalize(match.group(1)) == normalize(name):
            out = [line]
            while out[-1].endswith("\\") and i + len(out) < len(lines):
                out.append(lines[i + len(out)])
            return "\n".join(out) + "\n"
    raise LockError(f"{path.name} does not lock {name}")


def installed(paths: Sequence[str] | None = None) -> dict[str, str]:
    """``{normalized name: version}`` of this interpreter's distributions, or of those under ``paths`` (another
    environment's site-packages); the first of a name wins, as on import."""
    out: dict[str, str] = {}
    for dist in metadata.distributions(**({"path": list(paths)} if paths is not None else {})):
        # the two header fields, read directly: dist.metadata parses each whole file as an email message
        # (measured here for the ~285 distributions: 0.7 s, against 0.14 s this way)
        head = (dist.read_text("METADATA") or dist.read_text("PKG-INFO") or "").split("\n\n", 1)[0]
        fields = dict(re.findall(r"^(Name|Version):[ \t]*(.+?)\s*$", head, re.M))
        if "Name" in fields and "Version" in fields:
            out.setdefault(normalize(fields["Name"]), fields["Version"])
    return out


def differences(pins: dict[str, str], have: dict[str, str]) -> list[str]:
    """Locked packages missing here or at another version (``==2.11.0`` accepts a local ``+cu130`` build, as
    pip does; ``==2.13.0+cpu`` accepts only that build)."""
    from packaging.specifiers import Specifier  # lazy: packaging

    out = []
    for name, version in sorted(pins.items()):
        got = have.get(name)
        if got is None:
            out.append(f"{name}: missing (locked {version})")
        elif not Specifier(f"=={version}").contains(got, prereleases=True):
            out.append(f"{name}: {got} (locked {version})")
    return out


def compare(tgt: Target, have: dict[str, str], root: Path = ROOT) -> dict[str, Any]:
    """The target's lock against installed distributions ``have``: its name and sha256, ``mismatched``
    (locked packages missing or at another version) and ``unlocked`` (installed packages it does not name,
    the project itself aside; on the GPU image those are the base image's own)."""
    pins = read_pins(tgt.output)
    mismatched = differences(pins, have)
    own = normalize(_project(root)["project"]["name"])
    return {
        "lock": str(tgt.output.relative_to(root)),
        "lock_sha256": file_sha256(tgt.output),
        "matches": not mismatched,
        "mismatched": mismatched,
        "unlocked": sorted(set(have) - set(pins) - {own}),
    }


def venv_of(tgt: Target, root: Path = ROOT) -> Path | None:
    """The virtual environment a target installs into (its table's ``venv``), None for the main one."""
    venv = tgt.table.get("venv")
    return root / str(venv) if venv else None


def site_packages(venv: Path) -> list[str]:
    return [str(p) for p in sorted((venv / "lib").glob("python*/site-packages"))]


def installed_marker(venv: Path) -> Path:
    """Written last by ``install``: the sha256 of the lock the venv was synced to."""
    return venv / ".installed"


def is_installed(tgt: Target, root: Path = ROOT) -> bool:
    """Whether the target's venv was installed from its lock as it is now."""
    venv = venv_of(tgt, root)
    if venv is None:
        raise LockError(f"[tool.npr.lock.{tgt.name}] names no venv of its own")
    marker = installed_marker(venv)
    return marker.exists() and marker.read_text().strip() == file_sha256(tgt.output)


def venv_environment(tgt: Target, root: Path = ROOT) -> dict[str, Any]:
    """``compare`` of the target's own venv against its lock (a server's environment, for provenance)."""
    venv = venv_of(tgt, root)
    if venv is None or not venv.exists():
        return {"target": tgt.name, "lock": str(tgt.output.relative_to(root)), "matches": False, "venv": None}
    return {
        "target": tgt.name,
        "venv": str(venv.relative_to(root)),
        **compare(tgt, installed(site_packages(venv)), root),
    }


LOCAL_WHEELS = Path("/opt/wheels")  # the machine's CPU torch wheel, where it has one (as the Makefile)
TORCH_CPU_INDEX = "https://download.pytorch.org/whl/cpu"


def wheel_sources(find_links: str | None = None) -> list[str]:
    """uv's package sources: the local wheel directory if there is one, else PyTorch's CPU index too (a file
    from there is installed only if its sha256 is the lock's)."""
    if find_links or LOCAL_WHEELS.is_dir():
        return ["--find-links", str(find_links or LOCAL_WHEELS)]
    return ["--extra-index-url", TORCH_CPU_INDEX, "--index-strategy", "unsafe-best-match"]


def find_python(version: str) -> str:
    """An interpreter of CPython ``version`` that runs: ``pythonX.Y`` on PATH, else pyenv's installs of it
    (pyenv's shim is on PATH for every version but runs only the selected ones)."""
    found = shutil.which(f"python{version}")
    candidates = [found] if found else []
    candidates += sorted(str(p) for p in Path.home().glob(f".pyenv/versions/{version}.*/bin/python{version}"))
    for candidate in candidates:
        probe = subprocess.run(
            [candidate, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"],
            capture_output=True,
            text=True,
        )
        if probe.returncode == 0 and probe.stdout.strip() == version:
            return candidate
    raise LockError(
        f"CPython {version} is not installed here (tried {', '.join(candidates) or f'python{version} on PATH'})"
    )


def no_deps_requirements(tgt: Target, root: Path = ROOT) -> str:
    """The table's ``no_deps`` packages as a requirements file: each one's entry (pin and hashes) in the lock
    ``no_deps_lock`` names (the image-versions environment takes SGLang's wheel from the gpu lock this way)."""
    names = tgt.table.get("no_deps", [])
    if not names:
        return ""
    source = target(str(tgt.table.get("no_deps_lock", tgt.name)), root).output
    return "".join(entry(source, name) for name in names)


def install_no_deps(tgt: Target, python: Path, root: Path = ROOT) -> None:
    """Install the target's ``no_deps`` packages into its venv, hash-checked, without their dependencies."""
    reqs = no_deps_requirements(tgt, root)
    if not reqs:
        return
    with tempfile.NamedTemporaryFile("w", suffix=".txt", prefix="npr-no-deps-") as f:
        f.write(reqs)
        f.flush()
        cmd = [
            _uv(),
            "pip",
            "install",
            "-q",
            "--python",
            str(python),
            "--no-deps",
            "--require-hashes",
            "-r",
            f.name,
        ]
        proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise LockError(f"installing {tgt.name}'s no_deps packages failed: {proc.stderr.strip()[-2000:]}")


def install(tgt: Target, find_links: str | None = None, root: Path = ROOT) -> Path:
    """Create the target's venv (its Python), sync it to the lock with uv (hash-checked, anything else
    removed), verify it and write the marker; returns the venv's python."""
    problem = stale(tgt, root)
    if problem:
        raise LockError(problem)
    venv = venv_of(tgt, root)
    if venv is None:
        raise LockError(f"[tool.npr.lock.{tgt.name}] names no venv of its own to install into")
    python = venv / "bin" / "python"
    if not python.exists():
        subprocess.run([find_python(tgt.python), "-m", "venv", str(venv)], check=True)
    installed_marker(venv).unlink(missing_ok=True)
    sync = [
        _uv(),
        "pip",
        "sync",
        "-q",
        "--python",
        str(python),
        "--require-hashes",
        *wheel_sources(find_links),
    ]
    proc = subprocess.run([*sync, str(tgt.output)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise LockError(f"installing {tgt.output.name} into {venv} failed: {proc.stderr.strip()[-2000:]}")
    install_no_deps(tgt, python, root)
    script = root / "infra" / "envlock.py"
    proc = subprocess.run(
        [str(python), str(script), "verify", "--target", tgt.name], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise LockError(f"{venv} is not {tgt.output.name} after the install: {proc.stderr.strip()[-2000:]}")
    installed_marker(venv).write_text(file_sha256(tgt.output) + "\n")
    return python


def environment(root: Path = ROOT) -> dict[str, Any]:
    """The lock this process's environment was installed from: ``compare`` for the target it matches best
    (fewest mismatched packages)."""
    if not (root / "pyproject.toml").exists():  # code installed without its checkout: no lock to name
        return {"lock": None, "matches": False}
    have = installed()
    # a target with a venv of its own (a server's) is never this process's environment
    found = [
        compare(t, have, root) for t in targets(root).values() if t.output.exists() and venv_of(t) is None
    ]
    return min(found, key=lambda c: len(c["mismatched"])) if found else {"lock": None, "matches": False}


def verify(tgt: Target, root: Path = ROOT) -> list[str]:
    """Raise when this environment is not the target's lock; returns the unlocked packages (a warning)."""
    result = compare(tgt, installed(), root)
    mismatched = result["mismatched"]
    if mismatched:
        more = f"; and {len(mismatched) - 8} more" if len(mismatched) > 8 else ""
        raise LockError(f"this environment is not {result['lock']}: {'; '.join(mismatched[:8])}{more}")
    return result["unlocked"]


def check_interpreter(tgt: Target) -> None:
    here = f"{sys.version_info.major}.{sys.version_info.minor}"
    if here != tgt.python:
        raise LockError(
            f"{tgt.output.name} is locked for CPython {tgt.python}, this interpreter is {here} "
            f"({sys.executable}): recreate the venv with Python {tgt.python} (make install PYTHON=python{tgt.python})"
        )


def requirement_name(req: str) -> str:
    """The normalized package name a requirement line starts with (no packaging needed)."""
    return normalize(re.split(r"[\s=<>!~\[;(@]", req.strip(), maxsplit=1)[0])


def project_requirements(tgt: Target, root: Path = ROOT) -> list[str]:
    """What the target resolves for the project: its dependencies and the table's extras, with the table's
    ``replace`` entries standing in for the project's own requirement on those packages. Unlike an override,
    a replacement leaves every other package's requirement on it in force (torchvision's on torch)."""
    if not tgt.table.get("project", True):
        return []  # an environment of its own (a server's): only the table's requirements
    project = _project(root)["project"]
    replace = {requirement_name(r): r for r in tgt.table.get("replace", [])}
    deps = list(project["dependencies"])
    unknown = sorted(set(replace) - {requirement_name(r) for r in deps})
    if unknown:
        raise LockError(
            f"[tool.npr.lock.{tgt.name}] replace: {', '.join(unknown)} is not a dependency of the project"
        )
    extras = project.get("optional-dependencies", {})
    return [replace.get(requirement_name(r), r) for r in deps] + [
        r for e in tgt.table.get("extras", []) for r in extras[e]
    ]


def dev_pin(name: str, root: Path = ROOT) -> str:
    """The exact requirement on ``name`` in the dev extra (``uv==0.13.9``): how ``make lock`` gets its uv."""
    for req in _project(root)["project"].get("optional-dependencies", {}).get("dev", []):
        if requirement_name(req) == normalize(name) and "==" in req:
            return req
    raise LockError(f"pyproject.toml: the dev extra pins no exact version of {name}")


def _uv() -> str:
    local = Path(sys.executable).with_name("uv")
    found = str(local) if local.exists() else shutil.which("uv")
    if found is None:
        raise LockError("uv is not installed here: `make lock` installs the version the dev extra pins")
    return found


def _header(tgt: Target, digest: str, uv_version: str) -> str:
    return (
        f"# The `{tgt.name}` environment, locked for {tgt.describe()}. Written by `make lock` ({uv_version})\n"
        f"# from pyproject.toml ([project] dependencies and [tool.npr.lock.{tgt.name}]); do not edit by hand.\n"
        f"# inputs-sha256: {digest}\n"
    )


def compile_target(tgt: Target, out: Path, uv_args: Sequence[str] = (), root: Path = ROOT) -> None:
    """Resolve the target with uv into ``out`` (hashes, markers kept). The committed lock, when there is
    one, is uv's preference: a rerun changes only the pins its inputs force."""
    uv = _uv()
    with tempfile.TemporaryDirectory(prefix="npr-lock-") as tmp_name:
        tmp = Path(tmp_name)
        # uv names each input in its `# via` notes: stable names here keep the output the same on every machine
        cmd = [uv, "pip", "compile", "--no-config", "--no-python-downloads", "--quiet"]
        inputs = {
            ("project.dependencies", ""): project_requirements(tgt, root),
            (f"tool.npr.lock.{tgt.name}.requirements", ""): tgt.table.get("requirements", []),
            (f"tool.npr.lock.{tgt.name}.constraints", "--constraints"): tgt.table.get("constraints", []),
            (f"tool.npr.lock.{tgt.name}.overrides", "--overrides"): tgt.table.get("overrides", []),
            (f"tool.npr.lock.{tgt.name}.excludes", "--excludes"): tgt.table.get("excludes", []),
        }
        for (name, flag), lines in inputs.items():
            if lines:
                (tmp / name).write_text("\n".join(lines) + "\n")
                cmd += [flag, name] if flag else [name]
        # uv's preferences: the target's own lock, or the lock it follows (``prefer``: the image-versions
        # environment is the cpu lock with a few pins moved, and stays so as the cpu lock moves)
        preferred = target(tgt.table["prefer"], root).output if "prefer" in tgt.table else tgt.output
        if preferred.exists():
            shutil.copy(preferred, tmp / "lock.txt")
        cmd += [
            "--python-version", tgt.python, "--python-platform", tgt.platform,
            "--generate-hashes", "--no-strip-markers", "--no-header", "-o", "lock.txt", *uv_args,
        ]  # fmt: skip
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True)
        if proc.returncode != 0:
            raise LockError(f"uv could not resolve the {tgt.name} target: {proc.stderr.strip()[-3000:]}")
        body = (tmp / "lock.txt").read_text()
    version = subprocess.run([uv, "--version"], capture_output=True, text=True, check=True).stdout.split()
    out.write_text(_header(tgt, input_digest(tgt, root), " ".join(version[:2])) + body)


def main(argv: Sequence[str] | None = None, root: Path = ROOT) -> int:
    parser = argparse.ArgumentParser(prog="python infra/envlock.py", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    check = sub.add_parser("check", help="each lock matches pyproject.toml (and, with --target, this Python)")
    check.add_argument("--target")
    ver = sub.add_parser("verify", help="this environment is exactly the target's lock")
    ver.add_argument("--target", required=True)
    lock = sub.add_parser("lock", help="resolve every target (or one) with uv and write its lock")
    lock.add_argument("--target")
    pin = sub.add_parser("pin", help="print the dev extra's exact requirement on a package")
    pin.add_argument("package")
    inst = sub.add_parser("install", help="create and sync a target's own venv (its table's venv)")
    inst.add_argument("--target", required=True)
    inst.add_argument("--find-links")
    inst.add_argument(
        "--if-missing", action="store_true", help="do nothing when the venv is its lock already"
    )
    one = sub.add_parser("entry", help="print a target's locked entry (pin and hashes) for one package")
    one.add_argument("package")
    one.add_argument("--target", required=True)
    args, uv_args = parser.parse_known_args(argv)
    if uv_args and args.command != "lock":
        parser.error(f"unrecognized arguments: {' '.join(uv_args)}")
    try:
        if args.command == "pin":
            print(dev_pin(args.package, root))
            return 0
        if args.command == "entry":
            print(entry(target(args.target, root).output, args.package), end="")
            return 0
        if args.command == "install":
            tgt = target(args.target, root)
            if not (args.if_missing and is_installed(tgt, root)):
                print(f"{install(tgt, args.find_links, root)}: {tgt.output.name}")
            return 0
        chosen = [target(args.target, root)] if args.target else list(targets(root).values())
        if args.command == "check":
            problems = [p for p in (stale(t, root) for t in chosen) if p]
            if problems:
                raise LockError("; ".join(problems))
            if args.target:
                check_interpreter(chosen[0])
        elif args.command == "verify":
            unlocked = verify(chosen[0], root)
            name = chosen[0].output.name
            if unlocked:
                print(f"warning: installed but not in {name}: {', '.join(unlocked)}", file=sys.stderr)
            print(f"this environment is {name} (sha256 {file_sha256(chosen[0].output)[:12]})")
        else:
            for tgt in chosen:
                compile_target(tgt, tgt.output, uv_args, root)
                print(f"{tgt.output.relative_to(root)}: {len(read_pins(tgt.output, False))} packages")
    except UserError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0
