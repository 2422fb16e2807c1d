"""Generation: sequential and native parallel decoding, the fork/merge controller, the backends.

``from components.engine import generate, Generation`` is the public API (docs/architecture.md). The
controller (``SequenceController`` and its ``Extension`` requests) and the async driver (``drive``) are
what a new token backend builds on (verl's agent loop, SGLang over HTTP).
"""

from components.engine.api import generate
from components.engine.async_driver import BackendError, SamplingSettings, drive, drive_all
from components.engine.config import GenerationConfig
from components.engine.controller import (
    MAIN,
    DecodePolicy,
    Extension,
    ExtensionResult,
    SequenceController,
)
from components.engine.generation import BlockRecord, Generation

__all__ = [
    "MAIN",
    "BackendError",
    "BlockRecord",
    "DecodePolicy",
    "Extension",
    "ExtensionResult",
    "Generation",
    "GenerationConfig",
    "SamplingSettings",
    "SequenceController",
    "drive",
    "drive_all",
    "generate",
]
