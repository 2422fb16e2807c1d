"""Tests that run only in the GPU image's versions (`make test-image`: .venv-image, the image's Python, torch,
transformers and numpy, and the pinned SGLang wheel for its argument parser).

The main suite's environment has no SGLang (it cannot share verl's environment on CPU), so these files are
not collected there; `make test-image` sets NPR_TEST_IMAGE=1, and then a missing SGLang is an error, not a
skip.
"""

from __future__ import annotations

import os

collect_ignore_glob = [] if os.environ.get("NPR_TEST_IMAGE") == "1" else ["test_*.py"]
