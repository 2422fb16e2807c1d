"""Building a verl job imports no verl (issue 45): ``verl.job`` reads the plugins' names from ``plugin_names``,
outside the ``plugins`` package whose import registers the plugins in verl (and so imports verl and Ray).

Checked in a fresh interpreter: this test process may have imported verl already.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

PROBE = """
import json, sys
import {module}
print(json.dumps(sorted({{m.split(".")[0] for m in sys.modules}} & {{"verl", "ray"}})))
"""


def _imported_heavy(module: str) -> list[str]:
    out = subprocess.run(
        [sys.executable, "-c", PROBE.format(module=module)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_building_a_verl_job_imports_neither_verl_nor_ray() -> None:
    assert _imported_heavy("components.training.verl.job") == []
    assert _imported_heavy("components.training.verl.plugin_names") == []


def test_the_probe_sees_verl_where_the_plugins_are_imported() -> None:
    """The check itself: importing the plugins package registers them in verl, so verl is imported."""
    assert "verl" in _imported_heavy("components.training.verl.plugins")
