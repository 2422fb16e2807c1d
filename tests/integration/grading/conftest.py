"""One warm math-verify pool for the whole grading integration suite (spawning workers costs seconds)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from components.grading.config import GradingConfig
from components.grading.verify_pool import get_pool, shutdown_pool


@pytest.fixture(scope="session")
def pool_cfg() -> Iterator[GradingConfig]:
    """The grading config every pool test uses (2 workers, as on the tiny profile), with the pool warm."""
    cfg = GradingConfig(workers=2, timeout_s=5.0, chunk_size=32)
    get_pool(cfg.workers, cfg.pool_start_timeout_s).warm()
    yield cfg
    shutdown_pool()
