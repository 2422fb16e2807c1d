"""Typed-config plumbing shared by every section model.

Each domain package owns the models of its own params.yaml sections (``components/<domain>/config.py``);
``components.config`` composes them. Every model forbids unknown keys so a typo fails fast with its path,
and validates strictly: a value must already have the field's type (YAML gives typed values), so
``steps: true`` is not 1, ``enabled: 1`` is not True and ``lr: "1e-4"`` is not a number. The one
conversion allowed is a YAML list for a tuple field (``adam_betas: [0.9, 0.95]``); an int is a float.
"""

from __future__ import annotations

import re
import typing
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator

from components.errors import UserError


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


class RunConfig(StrictModel):
    """Settings shared by all stages of one pipeline run."""

    seed: int = Field(0, ge=0)
    device: Literal["cpu", "cuda", "auto"] = "cpu"
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"
    # Compute precision of the local trainers' forward and backward (SFT, RL updates; verl has its own) over
    # float32 weights: bfloat16 autocast keeps fp32 weights, gradients and AdamW
    # (components.training.precision). On AVX512-BF16 cores it ran an SFT step 1.37x (parallel) / 1.53x
    # (causal) faster at one thread, the loss within 2e-5 (benchmarks/bench_sft.py); on cores without native
    # bf16 it is emulated, ~50x slower per matmul (benchmarks/bench_precision.py). auto = bfloat16 only where
    # the device computes it natively, the weights' own dtype elsewhere (precision.resolve_autocast; the
    # choice is logged and recorded in every stage's provenance). Generation (the engine) stays in the
    # model's dtype. null = the weights' own dtype throughout.
    autocast: Literal["auto", "bfloat16"] | None = None
    torch_threads: int = Field(2, ge=1, le=256)
    artifacts_dir: str = "artifacts"


class ConfigError(UserError, ValueError):
    """Raised when params.yaml (or a profile, or an override) does not validate; names the key path."""


class _Yaml12Loader(yaml.SafeLoader):
    """PyYAML reads ``1e-4`` as a string (YAML 1.1 wants a dot); YAML 1.2, DVC and people read a float."""


_Yaml12Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(
        r"""^(?:[-+]?(?:[0-9][0-9_]*)\.[0-9_]*(?:[eE][-+]?[0-9]+)?
        |[-+]?(?:[0-9][0-9_]*)(?:[eE][-+]?[0-9]+)
        |\.[0-9_]+(?:[eE][-+]?[0-9]+)?
        |[-+]?\.(?:inf|Inf|INF)
        |\.(?:nan|NaN|NAN))$""",
        re.X,
    ),
    list("-+0123456789."),
)


def load_yaml_text(text: str, source: str) -> Any:
    """YAML (numbers as YAML 1.2 reads them); a syntax error is a ConfigError naming ``source`` and the line."""
    try:
        return yaml.load(text, Loader=_Yaml12Loader)  # noqa: S506 - a SafeLoader subclass
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(err, "problem", None) or str(err).splitlines()[0]
        raise ConfigError(f"{source}:{where}: not valid YAML: {problem}") from None
