"""The smoke size every benchmark takes (issue 46): ``--smoke``, or ``NPR_BENCH_SMOKE=1`` in the environment.

Under it a script runs its whole path (every function and lazy import its full run reaches) on a few items
with one repeat, in seconds on the tiny profile's committed seed or a small run's artifacts, and prints the
same table. Each script names its smoke values next to its own options (``parse_args(parser, argv,
repeats=1, n=2)``); an option given on the command line keeps its value. ``tests/integration/benchmarks/
test_benchmark_smoke.py`` runs every script in ``benchmarks/`` at this size.

A helper module, not a benchmark: its name starts with ``_``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from typing import Any

ENV = "NPR_BENCH_SMOKE"


def smoke_from_env() -> bool:
    return os.environ.get(ENV, "").strip().lower() not in ("", "0", "false", "no")


def parse_args(
    parser: argparse.ArgumentParser, argv: Sequence[str] | None = None, **smoke: Any
) -> argparse.Namespace:
    """``parser.parse_args(argv)`` with ``--smoke`` added; under it each option named in ``smoke`` that still
    has its default takes its smoke value (an unknown name is an error, so a renamed option cannot drift)."""
    parser.add_argument(
        "--smoke",
        action="store_true",
        default=smoke_from_env(),
        help=f"a few items, one repeat: the whole path in seconds (also {ENV}=1)",
    )
    args = parser.parse_args(argv)
    unknown = [name for name in smoke if not hasattr(args, name)]
    if unknown:
        raise ValueError(f"smoke sizes for options the parser does not have: {unknown}")
    if args.smoke:
        for name, value in smoke.items():
            if getattr(args, name) == parser.get_default(name):
                setattr(args, name, value)
    return args
