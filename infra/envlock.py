"""The locked environments' command line (``components.envlock``): ``python infra/envlock.py
check|verify|lock|pin|entry``.

The Makefile runs it before the project (and so ``npr``) is installed, with the bare venv's Python, and the
GPU image's Dockerfile runs ``verify`` after its install; so it is a script that puts the checkout on the
path, not an ``npr`` command, and ``components/`` keeps no ``python -m`` entry.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.envlock import main  # noqa: E402

raise SystemExit(main())
