"""The lower floors' names for the pipeline config are what PipelineConfig has (issue 29).

A package below ``components.config`` cannot import PipelineConfig (tests/unit/core/test_floors.py), so it
takes a ``Protocol`` naming what it reads. Nothing checks a Protocol at run time: this test loads the tiny
profile and checks every member each protocol declares (its own and inherited ones, so a member added
later is checked too) exists on it, with the declared type, and that a method takes the declared parameters.
"""

from __future__ import annotations

import inspect
import types
import typing
from pathlib import Path
from typing import Any

import pytest
from typing_extensions import get_protocol_members

from components.config import PipelineConfig, load_config
from tests.support.config_reads import PIPELINE_PROTOCOLS as PROTOCOLS


def _declared(protocol: type, name: str) -> Any:
    """``name`` as the nearest class of ``protocol``'s MRO declares it: a property, a function, or (a bare
    annotation) the resolved annotation."""
    for base in protocol.__mro__:
        if name in vars(base):
            return vars(base)[name]
        if name in base.__dict__.get("__annotations__", {}):
            return typing.get_type_hints(base)[name]
    raise AssertionError(f"{protocol.__name__} declares no {name}")


def _conforms(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arg) for arg in typing.get_args(hint))
    if hint is Any:
        return True
    if isinstance(hint, type) and getattr(hint, "_is_protocol", False):
        return not _missing(value, hint)
    if isinstance(hint, type):
        return isinstance(value, hint)
    if isinstance(origin, type):  # dict[str, Any] and the like
        return isinstance(value, origin)
    raise AssertionError(f"cannot check a value against {hint!r}")


def _missing(cfg: Any, protocol: type) -> list[str]:
    """What ``cfg`` lacks, or has otherwise than ``protocol`` declares it, one sentence a member."""
    out = []
    for name in sorted(get_protocol_members(protocol)):
        if not hasattr(cfg, name):
            out.append(f"{name}: absent")
            continue
        declared, value = _declared(protocol, name), getattr(cfg, name)
        if isinstance(declared, property):
            hint = typing.get_type_hints(declared.fget)["return"]
            if not _conforms(value, hint):
                out.append(f"{name}: {type(value).__name__}, declared {hint}")
        elif inspect.isfunction(declared):
            if not callable(value):
                out.append(f"{name}: not a method")
                continue
            real = inspect.signature(value).parameters
            for param in list(inspect.signature(declared).parameters.values())[1:]:  # past self
                if param.name not in real or real[param.name].kind != param.kind:
                    out.append(f"{name}: takes no {param.kind.description} parameter {param.name!r}")
        elif not _conforms(value, declared):
            out.append(f"{name}: {type(value).__name__}, declared {declared}")
    return out


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: p.__name__)
def test_pipeline_config_satisfies_the_protocol(in_repo: Path, protocol: type) -> None:
    cfg = load_config(profile="tiny")
    assert isinstance(cfg, PipelineConfig)
    assert get_protocol_members(protocol), f"{protocol.__name__} declares nothing"
    assert _missing(cfg, protocol) == []
