"""Generation: sequential and native parallel decoding, the token ledger, the backends.

``from components.engine import generate, Generation`` is the public API (docs/architecture.md).
"""

from components.engine.api import generate
from components.engine.config import GenerationConfig
from components.engine.generation import BlockRecord, Generation

__all__ = ["BlockRecord", "Generation", "GenerationConfig", "generate"]
