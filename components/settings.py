"""Typed-config plumbing shared by every section model.

Each domain package owns the models of its own params.yaml sections (``components/<domain>/config.py``);
``components.config`` composes them. Every model forbids unknown keys so a typo fails fast with its path,
and validates strictly: a value must already have the field's type (YAML gives typed values), so
``steps: true`` is not 1, ``enabled: 1`` is not True and ``lr: "1e-4"`` is not a number. The one
conversion allowed is a YAML list for a tuple field (``adam_betas: [0.9, 0.95]``); an int is a float.
"""

from __future__ import annotations

import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def _is_tuple(annotation: Any) -> bool:
    """``tuple[...]``, or a union with one (``tuple[float, float] | None``)."""
    origin = typing.get_origin(annotation)
    return origin is tuple or (origin is not None and any(_is_tuple(a) for a in typing.get_args(annotation)))


class StrictModel(BaseModel):
    """Base for every config section: unknown keys, wrong types and out-of-range values raise."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, strict=True)

    @field_validator("*", mode="before")
    @classmethod
    def _lists_for_tuples(cls, value: Any, info: ValidationInfo) -> Any:
        # YAML and JSON have no tuple: a list is what a tuple field gets from params.yaml
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, list) and field is not None and _is_tuple(field.annotation):
            return tuple(value)
        return value
