"""Which project source files a stage's computation runs: the check behind dvc.yaml's code deps.

DVC reruns a stage when one of its deps changes, so a stage whose deps miss a module it computes with
(the synthetic generator that makes the seed's training data, the prompt renderer, ...) silently keeps a
stale output, and a stage whose deps are too broad reruns for nothing (an RL edit retraining the seed).
``stage_code_files`` follows the stage module's imports (``import``/``from`` anywhere in the file, lazy
imports included) through the project's packages; ``uncovered`` lists what dvc.yaml's deps do not cover.

*Plumbing* is code that moves results without changing them: config schemas (their values live in
params.yaml, which DVC tracks key by key), paths and the DAG, artifact I/O, tracking, the flat metrics
and plot rows a stage's results are reshaped into (``reporting``), progress display, fingerprints, the stage runner, ops, the environment locks (``envlock``). It is not required in deps and its imports are not followed (``components.config``
imports every domain's config module, which would otherwise pull every package into every stage).
Package ``__init__`` files are followed (they re-export) but not required.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable
from pathlib import Path

PROJECT_PACKAGES = ("components", "flows")
_PLUMBING_TOP = {
    "__init__.py",
    "artifacts.py",
    "cli.py",
    "config.py",
    "dag.py",
    "env.py",
    # which lock an environment was installed from (provenance) and installing a server's locked venv
    "envlock.py",
    "errors.py",
    "fingerprint.py",
    "progress.py",
    "reporting.py",
    "settings.py",
    "storage.py",
    "tracking.py",
}


def is_plumbing(rel: str) -> bool:
    """True for modules whose changes cannot change a stage's outputs (see the module docstring)."""
    parts = Path(rel).parts
    if len(parts) == 2 and parts[0] == "components" and parts[1] in _PLUMBING_TOP:
        return True
    return (
        parts[-1] == "config.py"
        or parts[:2] == ("components", "ops")
        or rel == "components/stages/__init__.py"
    )


def _module_file(root: Path, module: str) -> Path | None:
    base = root.joinpath(*module.split("."))
    if (base / "__init__.py").is_file():
        return base / "__init__.py"
    if base.with_suffix(".py").is_file():
        return base.with_suffix(".py")
    return None


def _imported_modules(source: str) -> Iterable[str]:
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module
            # `from package import submodule` imports the submodule file too
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def module_closure(start: Path, root: Path) -> set[str]:
    """Repo-relative paths of the project files ``start`` runs, following imports except out of plumbing."""
    seen: set[str] = set()
    todo = [start]
    while todo:
        path = todo.pop()
        rel = path.relative_to(root).as_posix()
        if rel in seen:
            continue
        seen.add(rel)
        if is_plumbing(rel) and path != start:
            continue
        parts = Path(rel).with_suffix("").parts
        parents = [_module_file(root, ".".join(parts[:i])) for i in range(1, len(parts))]
        todo.extend(p for p in parents if p is not None)  # importing a.b.c runs a/__init__ and a/b/__init__
        for module in _imported_modules(path.read_text(encoding="utf-8")):
            if module.split(".")[0] in PROJECT_PACKAGES:
                found = _module_file(root, module)
                if found is not None:
                    todo.append(found)
    return seen


def stage_code_files(stage: str, root: Path = Path(".")) -> list[str]:
    """The computation files of ``components/stages/<stage>.py`` (plumbing and package inits left out)."""
    root = Path(root).resolve()
    start = root / "components" / "stages" / f"{stage}.py"
    if not start.is_file():
        raise FileNotFoundError(f"stage {stage!r} has no module {start}")
    files = module_closure(start, root)
    return sorted(f for f in files if not is_plumbing(f) and Path(f).name != "__init__.py")


def uncovered(files: Iterable[str], deps: Iterable[str]) -> list[str]:
    """``files`` that are neither a dep nor under a dep directory."""
    dirs = [d.rstrip("/") for d in deps]
    return [f for f in files if not any(f == d or f.startswith(d + "/") for d in dirs)]
