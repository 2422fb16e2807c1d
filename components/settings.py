"""Typed-config plumbing shared by every section model.

Each domain package owns the models of its own params.yaml sections (``components/<domain>/config.py``);
``components.config`` composes them. Every model forbids unknown keys so a typo fails fast with its path.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Base for every config section: unknown keys, wrong types and out-of-range values raise."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
