"""EvalJobConfig: what evaluation reads of the config, and that PipelineConfig has all of it.

The protocol names PipelineConfig (a floor above evaluation) by what the runner uses; nothing type-checks
the two against each other, so these tests do: every member the protocol declares is read off the tiny
profile's config and checked against its declared type, and the protocol lists exactly the attributes the
runner and ``npr eval`` read of ``cfg``.
"""

from __future__ import annotations

import ast
import inspect
import types
from pathlib import Path
from typing import Any, Literal, Self, Union, get_args, get_origin, get_type_hints

import components.evaluation.adhoc as adhoc
import components.evaluation.runner as runner
from components.config import load_config
from components.evaluation.job import EvalJobConfig


def declared_members(proto: type) -> list[str]:
    """A protocol's own public members: its properties, methods and annotated attributes."""
    names = [name for name in vars(proto) if not name.startswith("_")]
    return names + [name for name in vars(proto).get("__annotations__", {}) if name not in names]


def fits(value: Any, hint: Any, owner: object) -> bool:
    if hint is Any:
        return True
    if hint is Self:
        return isinstance(value, type(owner))
    origin = get_origin(hint)
    if origin is Literal:
        return value in get_args(hint)
    if origin in (Union, types.UnionType):
        return any(fits(value, h, owner) for h in get_args(hint))
    return isinstance(value, origin or hint)


def test_the_pipeline_config_has_every_member_of_eval_job_config(in_repo: Path) -> None:
    cfg = load_config(profile="tiny")
    members = declared_members(EvalJobConfig)
    assert {"evaluate", "prompts", "decode_mode_of", "model_copy"} <= set(members)
    checkpoints = list(cfg.evaluate.checkpoints)
    assert checkpoints
    for name in members:
        declared = inspect.getattr_static(EvalJobConfig, name, None)
        assert hasattr(cfg, name), f"PipelineConfig has no {name!r} (EvalJobConfig declares it)"
        if declared is None or isinstance(declared, property):
            fget = declared.fget if declared is not None else None
            hint = get_type_hints(fget)["return"] if fget else get_type_hints(EvalJobConfig)[name]
            value = getattr(cfg, name)
            assert fits(value, hint, cfg), f"PipelineConfig.{name} = {value!r} is not a {hint}"
            continue
        # a method: the real one takes the protocol's arguments (a checkpoint name for each positional one,
        # each keyword one by name) and returns the declared type
        hints = get_type_hints(declared)
        params = list(inspect.signature(declared).parameters.values())[1:]
        positional = [p for p in params if p.kind is not inspect.Parameter.KEYWORD_ONLY]
        keywords = {p.name: p.default for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
        assert all(hints[p.name] is str for p in positional), f"{name}: extend this test to its arguments"
        method = getattr(cfg, name)
        assert callable(method), f"PipelineConfig.{name} is not a method"
        for checkpoint in checkpoints if positional else [None]:
            value = method(*[checkpoint] * len(positional), **keywords)
            assert fits(value, hints["return"], cfg), f"PipelineConfig.{name}({checkpoint!r}) = {value!r}"


def test_eval_job_config_lists_what_evaluation_reads_of_cfg() -> None:
    read: set[str] = set()
    for module in (runner, adhoc):
        tree = ast.parse(Path(module.__file__ or "").read_text())
        read |= {
            node.attr
            for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "cfg"
        }
    assert set(declared_members(EvalJobConfig)) == read
