"""Floors: the intended layers of the project, as an import contract (issue 29).

Every ``import`` in components/ and flows/ is read with ``ast`` -- lazy, function-level imports
included, since that is how a climb gets in unseen -- and a module may import only from its own
floor or a lower one. A climb that cannot be removed yet is listed in ``EXCEPTIONS`` with its reason;
the test also fails when a listed exception no longer occurs, so that list only shrinks.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

# Bottom to top. A unit is a top-level module or package of components/ (its whole subtree), or flows.
FLOORS: list[tuple[str, tuple[str, ...]]] = [
    (
        "ground",
        (
            "components",  # the package itself: an empty __init__
            "components.structure",
            "components.settings",
            "components.errors",
            "components.artifacts",
            "components.env",
            "components.envlock",
            "components.progress",
            "components.prompts",
            "components.dag",
            "components.storage_init",
        ),
    ),
    (
        "services",
        (
            "components.grading",
            "components.data",
            "components.engine",
            "components.ops",
            "components.storage",
            "components.tracking",
        ),
    ),
    (
        "domain",
        (
            "components.models",
            "components.training",
            "components.evaluation",
        ),
    ),
    # components.config is PipelineConfig: it assembles each package's own config module, so it sits above them.
    (
        "assembly",
        ("components.config", "components.fingerprint", "components.reporting", "components.config_check"),
    ),
    ("stages", ("components.stages",)),
    ("top", ("flows", "components.cli")),
]

# (importer module, imported module) -> why it still climbs. Remove an entry once the climb is gone.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def floor_of(module: str) -> int:
    best: tuple[int, int] | None = None  # (length of the matching unit, floor)
    for level, (_, units) in enumerate(FLOORS):
        for unit in units:
            matches = module == unit or module.startswith(unit + ".")
            if matches and (best is None or len(unit) > best[0]):
                best = (len(unit), level)
    if best is None:
        raise AssertionError(f"{module} is on no floor: add its unit to FLOORS")
    return best[1]


def project_modules(root: Path) -> dict[str, Path]:
    mods: dict[str, Path] = {}
    for base in ("components", "flows"):
        for path in sorted((root / base).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts = parts[:-1]
            mods[".".join(parts)] = path
    return mods


def imported(module: str, path: Path, node: ast.Import | ast.ImportFrom, known: set[str]) -> list[str]:
    """The project modules one import statement names (``from a import b`` names ``a.b`` when it is a module)."""
    if isinstance(node, ast.Import):
        names = [alias.name for alias in node.names]
    else:
        if node.level:
            package = module.split(".")
            if path.name != "__init__.py":
                package = package[:-1]
            package = package[: len(package) - (node.level - 1)]
            base = ".".join(package + ([node.module] if node.module else []))
        else:
            base = node.module or ""
        names = [base] + [f"{base}.{a.name}" for a in node.names if f"{base}.{a.name}" in known]
    return [n for n in names if n.split(".")[0] in ("components", "flows")]


def edges(root: Path) -> Iterator[tuple[str, str, int]]:
    mods = project_modules(root)
    known = set(mods)
    for module, path in mods.items():
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, (ast.Import, ast.ImportFrom)):
                for target in imported(module, path, node, known):
                    yield module, target, node.lineno


def climbs(root: Path) -> dict[tuple[str, str], list[int]]:
    found: dict[tuple[str, str], list[int]] = {}
    for src, dst, line in edges(root):
        if floor_of(dst) > floor_of(src):
            found.setdefault((src, dst), []).append(line)
    return found


def _fmt(key: tuple[str, str]) -> str:
    src, dst = key
    return f"{src} ({FLOORS[floor_of(src)][0]}) -> {dst} ({FLOORS[floor_of(dst)][0]})"


def test_no_import_climbs_a_floor() -> None:
    found = climbs(ROOT)
    new = sorted(k for k in found if k not in EXCEPTIONS)
    assert not new, "imports that climb to a higher floor:\n" + "\n".join(
        f"  {_fmt(k)} at line(s) {found[k]}" for k in new
    )


def test_every_exception_still_occurs() -> None:
    found = climbs(ROOT)
    gone = sorted(k for k in EXCEPTIONS if k not in found)
    assert not gone, "climbs fixed: remove them from EXCEPTIONS:\n" + "\n".join(f"  {k}" for k in gone)


def test_checker_sees_a_lazy_climb(tmp_path: Path) -> None:
    """The checker itself: a function-level import from a lower floor to a higher one is a climb."""
    (tmp_path / "components" / "structure").mkdir(parents=True)
    (tmp_path / "components" / "training").mkdir(parents=True)
    (tmp_path / "flows").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("")
    (tmp_path / "components" / "structure" / "__init__.py").write_text("")
    (tmp_path / "components" / "training" / "__init__.py").write_text("from ..structure import x\n")
    (tmp_path / "components" / "structure" / "x.py").write_text(
        "def f():\n    from components.training import y\n    return y\n"
    )
    (tmp_path / "flows" / "__init__.py").write_text("import components.training\n")
    assert climbs(tmp_path) == {("components.structure.x", "components.training"): [2]}


def test_no_library_module_is_a_script() -> None:
    """Commands are `npr` commands (the console script ``components.cli:main``); no module under components/
    runs as ``python -m``, the cli included (torchrun relaunches ``npr`` with ``--no-python``; the
    environment-lock bootstrap is infra/envlock.py, a script)."""

    def is_script(tree: ast.Module) -> bool:
        return any(
            isinstance(node, ast.If)
            and "__main__" in ast.unparse(node.test)
            and "__name__" in ast.unparse(node.test)
            for node in tree.body
        )

    scripts = [
        path.relative_to(ROOT).as_posix()
        for path in sorted((ROOT / "components").rglob("*.py"))
        if is_script(ast.parse(path.read_text()))
    ]
    assert scripts == []


LAZY_MARK = re.compile(r"#\s*lazy:\s*\w")


def unmarked_lazy_imports(root: Path) -> list[str]:
    """Imports written inside a function without a ``# lazy: <why>`` comment (on the statement's first or
    last line). Imports go at module top; one kept inside a function keeps a heavy dependency (or a cycle)
    lazy and says which, so a climb or a needless late import cannot hide there."""
    found = []
    for path in project_modules(root).values():
        source = path.read_text()
        lines = source.splitlines()
        for fn in ast.walk(ast.parse(source, filename=str(path))):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(fn):
                if isinstance(node, (ast.Import, ast.ImportFrom)):
                    ends = {lines[node.lineno - 1], lines[(node.end_lineno or node.lineno) - 1]}
                    if not any(LAZY_MARK.search(line) for line in ends):
                        found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    return sorted(set(found))


def test_every_function_level_import_says_why_it_is_lazy() -> None:
    found = unmarked_lazy_imports(ROOT)
    assert not found, (
        "imports inside functions without '# lazy: <dependency>' (move them to the module top, or say what "
        "they keep lazy):\n" + "\n".join(f"  {f}" for f in found)
    )


def test_checker_sees_an_unmarked_lazy_import(tmp_path: Path) -> None:
    (tmp_path / "components").mkdir()
    (tmp_path / "flows").mkdir()
    (tmp_path / "components" / "__init__.py").write_text("")
    (tmp_path / "flows" / "__init__.py").write_text("")
    (tmp_path / "components" / "m.py").write_text(
        "import json\n\n"
        "def a():\n    import torch  # lazy: torch\n    return torch\n\n"
        "def b():\n    from os import (\n        path,\n    )  # lazy: startup\n    return path\n\n"
        "def c():\n    import shutil\n    return shutil\n"
    )
    assert unmarked_lazy_imports(tmp_path) == ["components/m.py:14: import shutil"]


def untyped_configs(root: Path) -> list[str]:
    """``file:line`` of every parameter named ``cfg`` annotated ``Any`` under components/ and flows/."""
    return [
        f"{path.relative_to(root).as_posix()}:{node.lineno}"
        for path in project_modules(root).values()
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.arg)
        and node.arg == "cfg"
        and node.annotation is not None
        and ast.unparse(node.annotation) == "Any"
    ]


def test_no_function_takes_the_whole_config_untyped(tmp_path: Path) -> None:
    """docs/architecture.md: a lower floor names what it reads of the config (its section or a Protocol);
    no parameter under components/ or flows/ is the whole config typed ``Any``."""
    found = untyped_configs(ROOT)
    assert not found, "cfg: Any parameters:\n" + "\n".join(f"  {f}" for f in found)
    (tmp_path / "components").mkdir()
    (tmp_path / "flows").mkdir()
    (tmp_path / "components" / "m.py").write_text("def f(cfg: Any, gen_cfg: Any) -> None: ...\n")
    assert untyped_configs(tmp_path) == ["components/m.py:1"]  # the checker sees one


# Units on one floor may use each other, one way only, and these pairs not at all (issue 45).
NOT_ON_ONE_FLOOR: dict[tuple[str, str], str] = {
    ("components.training", "components.evaluation"): "training plans and trains; decode stages are named by "
    "their section type (engine's DecodeStageConfig), not by evaluation's",
    ("components.data", "components.engine"): "the data gates own their settings (RejectFilterConfig)",
}


def _unit_of(module: str) -> str:
    return max((u for _, units in FLOORS for u in units if module == u or module.startswith(u + ".")), key=len)


def unit_edges(root: Path) -> dict[tuple[str, str], list[str]]:
    found: dict[tuple[str, str], list[str]] = {}
    for src, dst, line in edges(root):
        a, b = _unit_of(src), _unit_of(dst)
        if a != b and "components" not in (a, b):
            found.setdefault((a, b), []).append(f"{src}:{line} -> {dst}")
    return found


def test_units_on_one_floor_import_each_other_one_way_only() -> None:
    found = unit_edges(ROOT)
    both = sorted((a, b) for a, b in found if a < b and (b, a) in found)
    assert not both, "units that import each other:\n" + "\n".join(
        f"  {a} <-> {b}: {found[(a, b)][:2]} / {found[(b, a)][:2]}" for a, b in both
    )
    banned = sorted(pair for pair in NOT_ON_ONE_FLOOR if pair in found)
    assert not banned, "\n".join(f"  {a} -> {b}: {found[(a, b)][:3]} ({NOT_ON_ONE_FLOOR[(a, b)]})" for a, b in banned)


def test_the_one_way_check_finds_a_pair_that_imports_each_other(tmp_path: Path) -> None:
    for rel, text in {
        "components/__init__.py": "",
        "components/engine/__init__.py": "",
        "components/engine/x.py": "from components.ops import y\n",
        "components/ops/__init__.py": "",
        "components/ops/y.py": "import components.engine.x\n",
        "flows/__init__.py": "",
    }.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    found = unit_edges(tmp_path)
    assert ("components.engine", "components.ops") in found and ("components.ops", "components.engine") in found
