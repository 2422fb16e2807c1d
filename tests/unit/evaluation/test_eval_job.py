"""EvalJobConfig lists exactly the attributes the runner, ``evaluate_into`` and ``npr eval`` read of ``cfg``
(that PipelineConfig has each of them, with the declared type, is tests/unit/core/test_config_protocols.py)."""

from __future__ import annotations

import ast
from pathlib import Path

import components.evaluation.adhoc as adhoc
import components.evaluation.outputs as outputs
import components.evaluation.runner as runner
from components.evaluation.job import EvalJobConfig


def declared_members(proto: type) -> list[str]:
    """A protocol's own public members: its properties, methods and annotated attributes."""
    names = [name for name in vars(proto) if not name.startswith("_")]
    return names + [name for name in vars(proto).get("__annotations__", {}) if name not in names]


def test_eval_job_config_lists_what_evaluation_reads_of_cfg() -> None:
    read: set[str] = set()
    for module in (runner, adhoc, outputs):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        read |= {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg"
        }
    assert set(declared_members(EvalJobConfig)) == read
