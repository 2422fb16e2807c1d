"""Public face of the parallel structure (``components.structure``): import from here in other code.

``parallel_attention_inputs(input_ids, tags, start=0) -> (mask bool[L, L], position_ids long[L])`` is the
name the SFT collator, the RL actor, the engine and the tests rely on.
"""

from components.structure import *  # noqa: F403 - this module is the re-export
from components.structure import __all__  # noqa: F401
